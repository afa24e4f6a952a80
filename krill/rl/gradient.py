"""Per-shard gradients of the policy loss.

Design decisions:
- One forward and one backward pass for all shards a worker trains: only the parameters of
  those shards require grad during the pass (the rest are frozen, which saves their weight
  gradients but still back-propagates through them), and the gradients are then split by
  shard. Requires-grad flags are restored afterwards, so the model is left as found.
- Sequences whose advantage is zero contribute nothing to the loss; they are skipped in the
  pass, but the loss is still divided by all completion tokens of the batch, so the gradient
  is exactly that of the full token-normalised loss. With a KL term (`kl_coef > 0` and a
  reference model) every sequence counts: the penalty pulls on each token whatever its
  advantage, and skipping the flat groups dropped their share of it (the gradient was not that
  of the documented loss, and a batch of flat groups gave no gradient at all).
- The pass shares each distinct prompt's forward among its samples
  (`krill.rl.batch.completion_logprobs`): the same loss, about half the compute at G = 8.
- Gradients are returned as fresh float32 tensors keyed by parameter name (the shard's own
  names, as in the manifest), detached from the model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from krill.errors import KrillError
from krill.rl.batch import completion_batch, completion_logprobs
from krill.rl.engine.base import Rollouts
from krill.rl.loss import LossConfig, policy_loss


class GradientError(KrillError, ValueError):
    """A gradient was asked for parameters the model does not have, or for mismatched inputs."""


@dataclass(frozen=True)
class GradientResult:
    grads: dict[int, dict[str, torch.Tensor]]  # shard -> name -> gradient
    loss: float
    stats: dict[str, float]
    seconds: float


def check_inputs(params: dict[str, torch.Tensor], shards: dict[int, list[str]], rollouts: Rollouts,
                 advantages: torch.Tensor) -> dict[str, int]:
    """Raise `GradientError` for an advantage vector not one per rollout or a shard naming a parameter the
    model lacks; returns each wanted parameter's shard."""
    if advantages.shape != (len(rollouts),):
        raise GradientError(f"advantages: shape {tuple(advantages.shape)}, expected ({len(rollouts)},)")
    wanted: dict[str, int] = {}
    for shard, names in shards.items():
        for name in names:
            if name not in params:
                raise GradientError(f"shards[{shard}]: model has no parameter {name!r}")
            wanted[name] = shard
    return wanted


def shard_gradients(model: torch.nn.Module, rollouts: Rollouts, advantages: torch.Tensor,
                    shards: dict[int, list[str]], config: LossConfig, pad_id: int,
                    ref_model: torch.nn.Module | None = None) -> GradientResult:
    """Gradient of the token-normalised policy loss on `rollouts`, for each shard's parameters."""
    started = time.perf_counter()
    params = dict(model.named_parameters())
    wanted = check_inputs(params, shards, rollouts, advantages)
    total_tokens = rollouts.num_completion_tokens
    with_kl = ref_model is not None and config.kl_coef > 0
    rows = torch.arange(len(rollouts)) if with_kl else torch.nonzero(advantages != 0).flatten()
    grads: dict[int, dict[str, torch.Tensor]] = {s: {} for s in shards}
    if len(rows) == 0:
        for name, shard in wanted.items():
            grads[shard][name] = torch.zeros_like(params[name], dtype=torch.float32)
        return GradientResult(grads, 0.0, {"tokens": float(total_tokens), "active_sequences": 0.0},
                              time.perf_counter() - started)

    saved = {name: p.requires_grad for name, p in params.items()}
    was_training = model.training
    try:
        for name, p in params.items():
            p.requires_grad_(name in wanted)
            p.grad = None
        if was_training:  # no dropout: the gradient must be a function of the inputs alone
            model.train(False)  # (train() walks every module: skipped when already in eval mode)
        batch = completion_batch(rollouts, pad_id, rows)
        logp = completion_logprobs(model, batch, config.temperature)
        ref = None
        if with_kl:
            with torch.no_grad():
                ref = completion_logprobs(ref_model, batch, config.temperature)
        loss, stats = policy_loss(logp, batch.behaviour, advantages[rows], batch.mask, config,
                                  ref_logprobs=ref, num_tokens=total_tokens)
        loss.backward()
        for name, shard in wanted.items():
            g = params[name].grad  # the model lets go of it below, so it is handed out without a copy
            grads[shard][name] = (torch.zeros_like(params[name]) if g is None else g.detach()).float()
    finally:
        for name, p in params.items():
            p.grad = None
            p.requires_grad_(saved[name])
        if was_training:
            model.train(True)
    stats = dict(stats, tokens=float(total_tokens), active_sequences=float(len(rows)))
    return GradientResult(grads, float(loss.detach()), stats, time.perf_counter() - started)
