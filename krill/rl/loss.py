"""The policy-gradient loss: token-level clipped surrogate with truncated importance weights.

Design decisions:
- Off-policy by construction. Rollouts come from a behaviour policy mu (an older version, or a
  different engine); gradients are taken at the learner policy pi. Per completion token,
  r = pi / mu (from log-probs). The objective is PPO's clipped surrogate around the behaviour
  policy, min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), with asymmetric bounds (DAPO's
  clip-higher, 0.2 / 0.28 by default): tokens whose probability has already moved past the
  trust region in the direction of their advantage stop pulling.
- Truncated importance weights: where the unclipped branch is active the gradient weight is r
  itself, unbounded for a negative advantage; each token's term is multiplied by the constant
  min(1, C / r) (no gradient through it), so its effective weight is min(r, C) (TIS).
- Token-level normalisation: the sum over all completion tokens divided by their number (or by
  a caller-given count, so a worker that skips zero-advantage sequences still divides by all
  its tokens and every token weighs the same across workers).
- `off_policy_correction = "none"` is an ablation, not a setting for real runs: the ratio is
  taken against the learner itself (r = 1 in value), so stale rollouts count as on-policy
  (plain REINFORCE-style gradient A x grad log pi, no clipping, no truncation). The field is left
  out of the serialised config at its default, so run specs and their ids are unchanged.
- Optional KL to a reference policy with the non-negative k3 estimator, off by default (the
  verifiable reward is the objective; a KL anchor slows learning on small models).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_serializer


class LossConfig(BaseModel):
    """Hyper-parameters of the policy-gradient loss."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    clip_low: float = Field(0.2, ge=0.0, lt=1.0, description="Lower clip: ratio floor is 1 - clip_low.")
    clip_high: float = Field(0.28, ge=0.0, le=10.0, description="Upper clip: ratio ceiling is 1 + clip_high.")
    is_cap: float = Field(2.0, ge=1.0, le=1e6, description="C in the truncated importance weight min(pi/mu, C).")
    kl_coef: float = Field(0.0, ge=0.0, le=10.0, description="Weight of the k3 KL penalty to the reference policy.")
    temperature: float = Field(1.0, gt=0.0, le=10.0, description="Temperature of the learner's log-probs (match sampling).")
    off_policy_correction: Literal["truncated-is", "none"] = Field(
        "truncated-is", description="'truncated-is': ratios to the behaviour policy, clipped and truncated; "
                                    "'none' (ablation): ratio fixed at 1, stale rollouts treated as on-policy.")

    @model_serializer(mode="wrap")
    def _omit_default_correction(self, handler):
        data = handler(self)
        if self.off_policy_correction == "truncated-is":
            data.pop("off_policy_correction", None)
        return data


def policy_loss(logprobs: torch.Tensor, behaviour: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                config: LossConfig, ref_logprobs: torch.Tensor | None = None,
                num_tokens: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss (scalar, to minimise) and statistics.

    logprobs [B, T] learner log-probs (with gradient), behaviour [B, T] behaviour log-probs,
    advantages [B] per sequence, mask [B, T] 1 on completion tokens. `num_tokens` overrides the
    normaliser (default: mask.sum()).
    """
    if config.off_policy_correction == "none":
        behaviour = logprobs.detach()
    mask = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype).unsqueeze(-1)
    log_ratio = (logprobs - behaviour) * mask
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1.0 - config.clip_low, 1.0 + config.clip_high)
    surrogate = torch.minimum(ratio * adv, clipped_ratio * adv)
    truncation = torch.clamp(config.is_cap / ratio.detach(), max=1.0)
    objective = truncation * surrogate
    denom = float(num_tokens) if num_tokens is not None else float(mask.sum())
    denom = max(denom, 1.0)
    loss = -(objective * mask).sum() / denom
    kl_value = 0.0
    if config.kl_coef > 0.0 and ref_logprobs is not None:
        delta = (ref_logprobs - logprobs) * mask
        kl = (torch.exp(delta) - delta - 1.0) * mask
        kl_mean = kl.sum() / denom
        loss = loss + config.kl_coef * kl_mean
        kl_value = float(kl_mean.detach())
    with torch.no_grad():
        tokens = float(mask.sum())
        active = mask > 0
        clipped = ((ratio > 1.0 + config.clip_high) & (adv > 0)) | ((ratio < 1.0 - config.clip_low) & (adv < 0))
        truncated = (ratio > config.is_cap) & active
        stats = {
            "tokens": tokens,
            "clip_fraction": float((clipped & active).sum()) / max(tokens, 1.0),
            "truncated_fraction": float(truncated.sum()) / max(tokens, 1.0),
            "mean_ratio": float((ratio * mask).sum()) / max(tokens, 1.0),
            "kl": kl_value,
        }
    return loss, stats
