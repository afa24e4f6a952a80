"""Greedy evaluation of a causal LM on a task's held-out split.

Design decisions:
- Accuracy is greedy (argmax) accuracy on eval indices 0..n-1: deterministic, and the number
  the learning curve reports. pass@k (k > 1) samples k completions per prompt at
  `temperature` from a `torch.Generator` seeded with `seed`, and counts a prompt as passed when
  any of them is rewarded; with exactly k samples this is the unbiased estimator's value.
- Prompts are grouped by token length and batched without padding (tasks keep lengths equal),
  with a KV cache (`krill.model.generate`).
- `mean_length` is the mean number of tokens of a greedy completion, eos included.
- The model is put in eval mode and restored afterwards, so the RL loop can evaluate its
  policy in place.

Public API:
    EvalResult(task, split, n, accuracy, k, pass_at_k, mean_length).to_dict()
    evaluate(model_or_dir, task, n=500, *, tokenizer=None, k=1, split="eval", start=0, seed=0,
             temperature=1.0, batch_size=256) -> EvalResult      prompts start..start+n-1
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from krill.errors import ModelError
from krill.model.tokenizer import decode_completion


@dataclass(frozen=True)
class EvalResult:
    """Outcome of `evaluate`."""

    task: str
    split: str
    n: int
    accuracy: float
    k: int
    pass_at_k: float | None
    mean_length: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _batches(task, tokenizer, indices, split):
    """Yield (indices, metadata list, input-id rows) grouped by prompt token length."""
    groups: dict[int, list[tuple[int, dict, list[int]]]] = {}
    for i in indices:
        text, meta = task.prompt(i, split)
        ids = tokenizer(text)["input_ids"]
        groups.setdefault(len(ids), []).append((i, meta, ids))
    for length in sorted(groups):
        yield groups[length]


def evaluate(model, task, n: int = 500, *, tokenizer=None, k: int = 1, split: str = "eval", start: int = 0,
             seed: int = 0, temperature: float = 1.0, batch_size: int = 256) -> EvalResult:
    """Greedy accuracy (and pass@k when k > 1) of `model` on prompts start..start+n-1 of `split`.

    `model` is a loaded HF causal LM (then `tokenizer` is required) or a model directory.
    """
    import torch

    from krill.model.build import load_model
    from krill.model.generate import generate

    if isinstance(model, str | Path):
        model, tokenizer = load_model(model)
    elif tokenizer is None:
        raise ModelError("tokenizer: required when evaluating a loaded model")
    if n < 1:
        raise ValueError(f"n: expected >= 1, got {n}")
    if k < 1:
        raise ValueError(f"k: expected >= 1, got {k}")
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    generator = torch.Generator(device=device).manual_seed(seed)
    correct = passed = 0
    total_len = 0
    try:
        for group in _batches(task, tokenizer, range(start, start + n), split):
            for offset in range(0, len(group), batch_size):
                chunk = group[offset:offset + batch_size]
                ids = torch.tensor([row[2] for row in chunk], dtype=torch.long, device=device)
                out = generate(model, ids, task.max_new_tokens, eos, pad).tolist()
                for (_, meta, _), toks in zip(chunk, out, strict=True):
                    correct += task.reward(meta, decode_completion(tokenizer, toks)) > 0
                    total_len += toks.index(eos) + 1 if eos in toks else len(toks)
                if k > 1:
                    rep = ids.repeat_interleave(k, dim=0)
                    sampled = generate(model, rep, task.max_new_tokens, eos, pad,
                                       temperature=temperature, generator=generator).tolist()
                    for j, (_, meta, _) in enumerate(chunk):
                        rows = sampled[j * k:(j + 1) * k]
                        passed += any(task.reward(meta, decode_completion(tokenizer, r)) > 0 for r in rows)
    finally:
        model.train(was_training)
    return EvalResult(task=task.spec, split=split, n=n, accuracy=correct / n, k=k,
                      pass_at_k=passed / n if k > 1 else None, mean_length=total_len / n)
