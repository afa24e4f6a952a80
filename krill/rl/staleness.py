"""Staleness: how much a contribution computed at an older version counts.

Design decisions:
- A contribution for version v arriving at coordinator step t has staleness s = t - v. Beyond
  the hard bound S_max it is rejected outright (the contract enforces the same bound); within
  it, it is weighted by a decreasing function of s, which multiplies the trust weight.
- Three shapes: `none` (weight 1: the loss's truncated importance weights already correct
  off-policy drift), `inverse` 1 / (1 + s), and `exp` exp(-s / tau). Pure functions of s.
- Every weight within [0, S_max] is positive: an `exp` shape whose tau is so small next to S_max that
  exp(-S_max / tau) leaves the normal float64 range (S_max / tau > 700; tau = 0.001 with S_max = 2
  gave 0.0 at s = 1) is refused. A zero weight was accepted by the coordinator (it is not a
  rejection), then the fold refused a version of only such contributions (weights summing to 0) and
  `krill audit` failed every version that folded one ("weight is not a finite positive number").
  S_max itself is the way to stop counting old contributions.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from krill.errors import KrillError


class StalenessError(KrillError, ValueError):
    """A contribution is older than the staleness bound, or from the future."""


class StalenessConfig(BaseModel):
    """How stale contributions are bounded and weighted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["none", "inverse", "exp"] = Field("inverse", description="Shape of the staleness weight.")
    max_staleness: int = Field(2, ge=0, le=1000, description="S_max: contributions with t - v > S_max are rejected.")
    tau: float = Field(2.0, gt=0.0, le=1e6, description="Decay constant of the `exp` shape.")

    @model_validator(mode="after")
    def _positive_weights(self):
        if self.kind == "exp" and self.max_staleness / self.tau > _MAX_EXP_DECAY:
            raise ValueError(f"tau {self.tau!r} is too small for S_max = {self.max_staleness}: exp(-S_max / tau) "
                             f"would leave the normal float64 range (S_max / tau must be at most {_MAX_EXP_DECAY}); "
                             "lower S_max to stop counting old contributions")
        return self


_MAX_EXP_DECAY = 700.0  # exp(-700) ~ 1e-304: trust x it stays a positive normal float64 for trust >= 3e-4


def staleness_weight(staleness: int, config: StalenessConfig) -> float:
    """Weight of a contribution `staleness` versions old; raises if outside [0, S_max]."""
    if staleness < 0:
        raise StalenessError(f"staleness: {staleness} < 0 (a contribution for a version not yet published)")
    if staleness > config.max_staleness:
        raise StalenessError(f"staleness: {staleness} exceeds the bound S_max = {config.max_staleness}")
    if config.kind == "none":
        return 1.0
    if config.kind == "inverse":
        return 1.0 / (1.0 + staleness)
    return math.exp(-staleness / config.tau)


def rollout_lag_problem(model_version: int, behaviour_version: int, max_staleness: int) -> str | None:
    """Why rollouts sampled at `behaviour_version` may not feed a gradient taken at `model_version`
    (None: they may): sampled after it, or more than S_max versions before it. The coordinator's
    ingest and slash replay and `krill audit` apply this one rule."""
    behind = model_version - behaviour_version
    if behind < 0:
        return f"rollouts sampled at version {behaviour_version}, after the learner version {model_version}"
    if behind > max_staleness:
        return (f"rollouts sampled at version {behaviour_version}, {behind} behind the learner version "
                f"(S_max = {max_staleness})")
    return None
