"""`krill eval`: greedy accuracy, pass@k and mean completion length of a model on a task.

Evaluates the first `--n` prompts of the task's eval split (the held-out prompts RL never
trains on); deterministic for a given model, task, n, k and seed (see `krill.model.evaluate`).
"""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command("eval")
@click.option("--model", "model_dir", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A local HF causal-LM directory.")
@click.option("--task", "task_name", default="arithmetic", show_default=True,
              help="Task name, optionally with a level: arithmetic:3.")
@click.option("--n", type=click.IntRange(1, 1_000_000), default=500, show_default=True, help="Eval prompts.")
@click.option("--k", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Samples per prompt for pass@k (temperature 1); 1 skips sampling.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the pass@k sampler.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def eval_(model_dir: Path, task_name: str, n: int, k: int, seed: int, as_json: bool) -> None:
    """Evaluate a model on the eval split of a task."""
    from transformers.utils import logging as hf_logging

    from krill.model.evaluate import evaluate
    from krill.rl.tasks import get_task

    hf_logging.disable_progress_bar()
    result = evaluate(model_dir, get_task(task_name), n, k=k, seed=seed)
    if as_json:
        click.echo(json.dumps(result.to_dict(), sort_keys=True))
        return
    line = f"{result.task}  n={result.n}  greedy accuracy {result.accuracy:.1%}"
    if result.pass_at_k is not None:
        line += f"  pass@{result.k} {result.pass_at_k:.1%}"
    click.echo(line + f"  mean length {result.mean_length:.2f} tokens")


eval_cmd = eval_
