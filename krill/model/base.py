"""The default base model: a tiny Llama warm-started on the default task, built offline.

Design decisions:
- Everything is a function of a `BaseModelRecipe` (architecture, task, seeds, optimiser,
  stopping rule); the model is cached under `$KRILL_HOME/models/<recipe hash>/`, so a second
  call returns at once and a changed recipe never reuses a stale model.
- Supervised warm start on the task's train split (loss on answer tokens and eos only), AdamW
  with a linear warm-up. Every `eval_every` steps greedy accuracy is measured on a held-out
  slice of the eval split that lies beyond the indices `krill eval` and the RL learning curve
  use (`STOP_EVAL_START` onwards), and training stops as soon as it reaches
  `target_accuracy`. Stopping early is the point: the RL loop needs a model that is right
  sometimes (a reward signal) and wrong often (room to improve). Accuracy climbs steeply, so
  the check is frequent.
- Reproducible on one machine: fixed seeds (init, data order) and a fixed torch thread count
  during the build. Other machines may differ in the last bits of floating point and hence
  in the stopping step; the recipe hash does not pretend otherwise.
- The cache is filled atomically: the build writes into a temporary sibling directory and
  renames it into place; `build.json` (recipe, steps, accuracy, seconds) marks a complete build.

Public API:
    BaseModelRecipe(...);  BaseModelRecipe().digest() -> str
    ensure_base_model(recipe=BaseModelRecipe(), home=None, force=False, progress=None) -> Path
    base_model_info(path) -> dict          contents of build.json
    warm_start(model, tokenizer, task, recipe, progress=None) -> dict
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from krill.model.build import TinyModelSpec, build_tiny_model, save_model
from krill.model.manifest import canonical_json

RECIPE_FORMAT = "krill-base-model/1"
STOP_EVAL_START = 1_000_000
"""First eval-split index of the prompts the stopping rule looks at (disjoint from 0..n-1)."""
BUILD_INFO = "build.json"


@dataclass(frozen=True)
class BaseModelRecipe:
    """Everything that determines the default base model."""

    task: str = "arithmetic:1"
    spec: TinyModelSpec = field(default_factory=TinyModelSpec)
    init_seed: int = 0
    data_seed: int = 0
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 100
    grad_clip: float = 1.0
    max_steps: int = 4000
    eval_every: int = 25
    eval_n: int = 200
    target_accuracy: float = 0.2
    threads: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {"format": RECIPE_FORMAT, **asdict(self)}

    def digest(self) -> str:
        """sha256 of the recipe's canonical JSON (hex); names the cache directory."""
        return hashlib.sha256(canonical_json(self.as_dict())).hexdigest()


def _default_home() -> Path:
    from krill.config import krill_home

    return krill_home()


def base_model_info(path: str | Path) -> dict[str, Any]:
    """The build record of a cached base model."""
    return json.loads((Path(path) / BUILD_INFO).read_text())


def _answer_batch(task, tokenizer, rng: random.Random, batch_size: int):
    import torch

    rows = []
    for _ in range(batch_size):
        text, meta = task.prompt(rng.randrange(2**62), "train")
        prompt = tokenizer(text)["input_ids"]
        answer = tokenizer(task.reference(meta), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((prompt, answer))
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((batch_size, width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((batch_size, width), -100, dtype=torch.long)
    mask = torch.zeros((batch_size, width), dtype=torch.long)
    for i, (p, a) in enumerate(rows):
        n = len(p) + len(a)
        ids[i, :n] = torch.tensor(p + a)
        labels[i, len(p):n] = torch.tensor(a)
        mask[i, :n] = 1
    return ids, labels, mask


def warm_start(model, tokenizer, task, recipe: BaseModelRecipe,
               progress: Callable[[int, float, float], None] | None = None) -> dict[str, Any]:
    """Supervised training on `task` until held-out greedy accuracy reaches the target.

    Returns {"steps", "accuracy", "curve": [[step, accuracy], ...], "reached_target"}.
    `progress(step, loss, accuracy)` is called at every evaluation.
    """
    import torch

    from krill.model.evaluate import evaluate

    rng = random.Random(recipe.data_seed)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.0)
    curve: list[list[float]] = []
    accuracy, step = 0.0, 0
    model.train()
    for step in range(1, recipe.max_steps + 1):
        for group in opt.param_groups:
            group["lr"] = recipe.lr * min(1.0, step / recipe.warmup_steps)
        ids, labels, mask = _answer_batch(task, tokenizer, rng, recipe.batch_size)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        opt.step()
        if step % recipe.eval_every == 0:
            accuracy = evaluate(model, task, recipe.eval_n, tokenizer=tokenizer, start=STOP_EVAL_START).accuracy
            curve.append([step, accuracy])
            if progress is not None:
                progress(step, loss.item(), accuracy)
            if accuracy >= recipe.target_accuracy:
                break
    model.eval()
    return {"steps": step, "accuracy": accuracy, "curve": curve,
            "reached_target": accuracy >= recipe.target_accuracy}


def _build(recipe: BaseModelRecipe, out: Path, progress) -> dict[str, Any]:
    import torch

    from krill.rl.tasks import get_task

    threads = torch.get_num_threads()
    torch.set_num_threads(recipe.threads)
    try:
        started = time.perf_counter()
        model, tokenizer = build_tiny_model(recipe.init_seed, recipe.spec)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(recipe.data_seed)
            result = warm_start(model, tokenizer, get_task(recipe.task), recipe, progress)
        save_model(model, tokenizer, out)
        seconds = time.perf_counter() - started
    finally:
        torch.set_num_threads(threads)
    info = {"recipe": recipe.as_dict(), "recipe_digest": recipe.digest(), "seconds": round(seconds, 2),
            "parameters": sum(p.numel() for p in model.parameters()), **result}
    (out / BUILD_INFO).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info


def ensure_base_model(recipe: BaseModelRecipe | None = None, home: str | Path | None = None,
                      force: bool = False, progress: Callable[[int, float, float], None] | None = None) -> Path:
    """The directory of the base model for `recipe`, building it first unless cached."""
    recipe = recipe or BaseModelRecipe()
    root = Path(home) if home is not None else _default_home()
    final = root / "models" / recipe.digest()[:16]
    if (final / BUILD_INFO).is_file() and not force:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _build(recipe, tmp, progress)
        if force and final.exists():
            shutil.rmtree(final)
        try:
            os.replace(tmp, final)
        except OSError:
            # Another process finished the same recipe first; its build is as good as ours.
            if not (final / BUILD_INFO).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
