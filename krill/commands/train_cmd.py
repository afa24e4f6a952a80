"""`krill train`: training commands. `krill train local` runs the whole RL loop in one process.

Design decisions:
- The command only parses options into a `LocalTrainConfig` and prints; the loop lives in
  `krill.rl.local_train`, so tests and benchmarks call the same code. torch and transformers
  are imported inside the command, so `krill --help` stays instant.
- Without `--model` the default base model is built (or taken from its cache) by
  `krill.model.base.ensure_base_model`, deterministic and offline.
"""

from __future__ import annotations

from pathlib import Path

import click

from krill.commands.context import FiniteFloatRange, output_file


@click.group("train")
def train() -> None:
    """Train a model with RL."""


@train.command("local")
@click.option("--model", "model_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Local HF model directory (default: the warm-started base model, built if missing).")
@click.option("--task", default="arithmetic", show_default=True, help="Task name, optionally name:level.")
@click.option("--workers", type=click.IntRange(1, 256), default=8, show_default=True, help="Simulated workers.")
@click.option("--prompts-per-worker", type=click.IntRange(1, 4096), default=4, show_default=True)
@click.option("--group-size", type=click.IntRange(2, 256), default=8, show_default=True, help="Samples per prompt.")
@click.option("--max-staleness", type=click.IntRange(0, 1000), default=2, show_default=True,
              help="Rollouts come from versions up to this many behind.")
@click.option("--staleness-weight", type=click.Choice(["none", "inverse", "exp"]), default="inverse", show_default=True)
@click.option("--stale-gradients", is_flag=True,
              help="Apply each version's contributions one version later, as a pipelined protocol run does.")
@click.option("--minutes", type=FiniteFloatRange(min=0.01), default=10.0, show_default=True,
              help="Training time budget (ignored when --versions is given).")
@click.option("--versions", type=click.IntRange(min=1), default=None, help="Stop after this many versions.")
@click.option("--lr", type=FiniteFloatRange(min=1e-8, max=1.0), default=1.5e-4, show_default=True)
@click.option("--density", type=FiniteFloatRange(min=1e-4, max=1.0), default=0.25, show_default=True,
              help="Fraction of gradient coordinates sent (shared mask).")
@click.option("--dense-versions", type=click.IntRange(min=0), default=0, show_default=True,
              help="The first versions send every coordinate (4x the bytes of a 25% int8 mask), then the shared mask.")
@click.option("--value-dtype", type=click.Choice(["fp16", "bf16", "int8"]), default="int8", show_default=True)
@click.option("--rule", type=click.Choice(["clip-mix-trim", "trimmed-mean", "median", "mean", "centered-clipping"]),
              default="clip-mix-trim", show_default=True, help="Robust aggregation rule.")
@click.option("--shards", "num_shards", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option("--eval-n", type=click.IntRange(min=1), default=500, show_default=True, help="Held-out prompts per eval.")
@click.option("--eval-every", type=click.IntRange(min=1), default=20, show_default=True, help="Versions between evals.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--threads", type=click.IntRange(min=0), default=0, show_default=True,
              help="torch CPU threads (0: torch's default, one per core).")
@click.option("--summary", "summary_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              callback=output_file,
              help="Write the summary JSON here and the learning curve PNG beside it.")
def local(model_dir: Path | None, task: str, workers: int, prompts_per_worker: int, group_size: int,
          max_staleness: int, staleness_weight: str, stale_gradients: bool, minutes: float, versions: int | None, lr: float,
          density: float, dense_versions: int, value_dtype: str, rule: str, num_shards: int, eval_n: int, eval_every: int,
          seed: int, threads: int, summary_path: Path | None) -> None:
    """RL in one process with simulated workers, stale rollouts and robust aggregation."""
    import torch

    from krill.rl.compression import CompressionConfig
    from krill.rl.local_train import LocalTrainConfig, run_local, write_summary
    from krill.rl.optimizer import AdamWConfig
    from krill.rl.staleness import StalenessConfig

    if stale_gradients and max_staleness < 1:
        raise click.UsageError("--stale-gradients needs --max-staleness >= 1: the gradients are one version old")
    if threads:
        torch.set_num_threads(threads)
    if model_dir is None:
        from krill.model.base import ensure_base_model

        model_dir = ensure_base_model()
    config = LocalTrainConfig(
        task=task, seed=seed, workers=workers, prompts_per_worker=prompts_per_worker, group_size=group_size,
        num_shards=num_shards, versions=versions, minutes=minutes, eval_n=eval_n, eval_every=eval_every,
        staleness=StalenessConfig(kind=staleness_weight, max_staleness=max_staleness), stale_gradients=stale_gradients,
        optimizer=AdamWConfig(lr=lr, max_grad_norm=1.0),
        compression=CompressionConfig(density=density, dtype=value_dtype, dense_versions=dense_versions),
        rule={"type": rule})  # a table, so the config gives it a new run's defaults (`rule_over_run_default`)
    summary = run_local(Path(model_dir), config, echo=click.echo)
    click.echo(f"accuracy {summary['base_accuracy']:.3f} -> {summary['final_accuracy']:.3f} in "
               f"{summary['versions']} versions, {summary['train_seconds']:.0f} s training "
               f"({summary['wall_seconds']:.0f} s wall); rollout {summary['rollout_tokens_per_s']:.0f} tok/s, "
               f"gradient {1000 * summary['gradient_seconds_per_worker_step']:.0f} ms per worker step, "
               f"compression x{summary['compression_ratio']:.1f}")
    if summary_path is not None:
        png = write_summary(summary, summary_path)
        click.echo(f"summary: {summary_path}  curve: {png}")
