"""Group-relative advantages (the GRPO family).

Design decisions:
- Each prompt is sampled G times (a group); a completion's advantage is its reward minus the
  group's mean reward, so no value network is needed and the baseline is unbiased per prompt.
- Scaling by the group's standard deviation is optional (off by default): it amplifies groups
  whose rewards barely differ, which on a 0/1 reward mostly re-weights easy and hard prompts,
  and Dr. GRPO showed the unscaled form avoids that bias.
- A group whose rewards are all equal carries no learning signal; its advantages are exactly
  zero (not 0/eps noise), so callers can skip those sequences in the backward pass.
- Float64 for the group statistics: cheap and free of summation-order surprises.
"""

from __future__ import annotations

import torch

from krill.errors import KrillError


class AdvantageError(KrillError, ValueError):
    """Rewards or group ids that cannot form groups."""


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, scale_by_std: bool = False,
                     eps: float = 1e-6) -> torch.Tensor:
    """Advantages [n] (float32) of rewards [n] grouped by group_ids [n]."""
    if rewards.ndim != 1 or group_ids.shape != rewards.shape:
        raise AdvantageError("rewards and group_ids must be 1-D tensors of the same length")
    r = rewards.to(torch.float64)
    if not torch.isfinite(r).all():
        raise AdvantageError("rewards: contains NaN or infinity")
    groups, inverse = torch.unique(group_ids, return_inverse=True)
    count = torch.zeros(len(groups), dtype=torch.float64).index_add_(0, inverse, torch.ones_like(r))
    mean = torch.zeros(len(groups), dtype=torch.float64).index_add_(0, inverse, r) / count
    centred = r - mean[inverse]
    var = torch.zeros(len(groups), dtype=torch.float64).index_add_(0, inverse, centred * centred) / count
    flat = (var[inverse] <= 0.0)
    adv = torch.where(flat, torch.zeros_like(centred), centred)
    if scale_by_std:
        adv = torch.where(flat, adv, adv / (var[inverse].sqrt() + eps))
    return adv.to(torch.float32)


def contiguous_groups(n: int, group_size: int) -> torch.Tensor:
    """Group ids for n completions laid out as consecutive groups of `group_size`."""
    if group_size < 1 or n % group_size:
        raise AdvantageError(f"group_size: {n} completions do not split into groups of {group_size}")
    return torch.arange(n, dtype=torch.int64) // group_size
