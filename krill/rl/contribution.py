"""One worker's contribution for one version: rollouts, rewards, per-shard compressed gradients.

Design decisions:
- The same function serves the local simulation and (later) the real worker: everything it
  produces is a deterministic function of public inputs (run seed, worker address, behaviour
  version, nonce, the weights of the behaviour and learner versions, the public masks), so a
  verifier can recompute any part of it.
- Prompts come from `krill.rl.assign` (no cherry-picking); each is sampled `group_size` times
  by the rollout engine at the behaviour version with a sampling seed
  H(run seed, worker, version, nonce); the gradient is taken by the learner at the newest
  version it holds, and the loss's truncated importance weights correct the difference.
- Rewards come from the task on the decoded completion (text before eos), advantages are
  group-relative.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import torch

from krill.rl.advantages import contiguous_groups, group_advantages
from krill.rl.compression import CompressionConfig, compress
from krill.rl.engine.base import RolloutEngine, Rollouts, SamplingParams
from krill.rl.gradient import GradientResult, shard_gradients
from krill.rl.loss import LossConfig


def sampling_seed(run_seed: bytes, worker: str, version: int, nonce: int) -> int:
    """The seed of a contribution's sampler: H(run seed, worker, version, nonce), 63 bits."""
    data = b"krill/sampling-seed/v1" + run_seed + bytes.fromhex(worker.removeprefix("0x"))
    data += int(version).to_bytes(8, "big") + int(nonce).to_bytes(8, "big")
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big") >> 1


def contribution_prompts(task, tokenizer, prompt_indices: list[int], group_size: int) -> tuple[list, list[list[int]]]:
    """The (prompt text, metadata) of each assigned prompt and the token ids of every sample's prompt."""
    problems = [task.prompt(i, "train") for i in prompt_indices]
    prompt_ids = [tokenizer(text)["input_ids"] for text, _ in problems]
    return problems, [ids for ids in prompt_ids for _ in range(group_size)]


@dataclass(frozen=True)
class Contribution:
    worker: str
    version: int  # behaviour version of the rollouts
    nonce: int
    prompt_indices: list[int]
    rollouts: Rollouts
    rewards: torch.Tensor
    gradients: dict[int, bytes]  # shard -> compressed blob
    loss: float
    stats: dict[str, float]
    sample_seconds: float
    gradient_seconds: float


def _rewards(task, tokenizer, problems, rollouts: Rollouts, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's reward on its decoded completion, and the group-relative advantages."""
    from krill.model.tokenizer import decode_completions

    texts = decode_completions(tokenizer, rollouts.completions())
    rewards = torch.tensor([task.reward(problems[i // group_size][1], text) for i, text in enumerate(texts)],
                           dtype=torch.float32)
    return rewards, group_advantages(rewards, contiguous_groups(len(rewards), group_size))


def make_contribution(*, task, tokenizer, engine: RolloutEngine, learner: torch.nn.Module, run_seed: bytes,
                      worker: str, nonce: int, prompt_indices: list[int], group_size: int,
                      params: SamplingParams, loss_config: LossConfig, shards: dict[int, list[str]],
                      masks: dict[str, torch.Tensor], compression: CompressionConfig,
                      sampled: tuple[Rollouts, float] | None = None) -> Contribution:
    """Sample, reward, and compute compressed per-shard gradients for one worker.

    `sampled` = (rollouts, seconds) when the rollouts were already drawn for this worker (by
    `engine.generate` or `generate_groups` on `contribution_prompts` with `sampling_seed`).
    """
    version = int(engine.version or 0)
    problems, prompts = contribution_prompts(task, tokenizer, prompt_indices, group_size)
    if sampled is None:
        started = time.perf_counter()
        rollouts = engine.generate(prompts, params, seed=sampling_seed(run_seed, worker, version, nonce))
        sample_seconds = time.perf_counter() - started
    else:
        rollouts, sample_seconds = sampled
    rewards, advantages = _rewards(task, tokenizer, problems, rollouts, group_size)
    result = shard_gradients(learner, rollouts, advantages, shards, loss_config, pad_id=tokenizer.pad_token_id)
    return _compressed(worker, version, nonce, prompt_indices, rollouts, rewards, result, masks, compression,
                       sample_seconds)


def _compressed(worker: str, version: int, nonce: int, prompt_indices: list[int], rollouts: Rollouts,
                rewards: torch.Tensor, result: GradientResult, masks: dict[str, torch.Tensor],
                compression: CompressionConfig, sample_seconds: float) -> Contribution:
    blobs = {shard: compress(grads, {n: masks[n] for n in grads}, compression)
             for shard, grads in sorted(result.grads.items())}
    return Contribution(worker=worker, version=version, nonce=nonce, prompt_indices=list(prompt_indices),
                        rollouts=rollouts, rewards=rewards, gradients=blobs, loss=result.loss,
                        stats=result.stats, sample_seconds=sample_seconds, gradient_seconds=result.seconds)


@dataclass(frozen=True)
class SampledWork:
    """One simulated worker's sampled rollouts, for `make_contributions`."""

    worker: str
    version: int  # behaviour version
    prompt_indices: list[int]
    rollouts: Rollouts
    sample_seconds: float


def make_contributions(*, task, tokenizer, learner: torch.nn.Module, nonce: int, work: list[SampledWork],
                       group_size: int, loss_config: LossConfig, shards: dict[int, list[str]],
                       masks: dict[str, torch.Tensor], compression: CompressionConfig) -> list[Contribution]:
    """`make_contribution` for several sampled workers, their gradients taken in one batched pass.

    The gradients come from `krill.rl.grouped_gradient` (equal to one pass per worker up to
    float32 rounding); a model that pass cannot split falls back to one pass per worker.
    """
    from krill.rl.grouped_gradient import GroupedGradientError, grouped_shard_gradients

    scored = []
    for x in work:
        problems, _ = contribution_prompts(task, tokenizer, x.prompt_indices, group_size)
        scored.append(_rewards(task, tokenizer, problems, x.rollouts, group_size))
    pad = tokenizer.pad_token_id
    try:
        results = grouped_shard_gradients(learner, [(x.rollouts, adv) for x, (_, adv) in zip(work, scored, strict=True)],
                                          shards, loss_config, pad)
    except GroupedGradientError:
        results = [shard_gradients(learner, x.rollouts, adv, shards, loss_config, pad_id=pad)
                   for x, (_, adv) in zip(work, scored, strict=True)]
    return [_compressed(x.worker, x.version, nonce, x.prompt_indices, x.rollouts, rewards, result, masks, compression,
                        x.sample_seconds)
            for x, (rewards, _), result in zip(work, scored, results, strict=True)]
