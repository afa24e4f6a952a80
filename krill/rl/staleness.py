"""Staleness: how much a contribution computed at an older version counts.

Design decisions:
- A contribution for version v arriving at coordinator step t has staleness s = t - v. Beyond
  the hard bound S_max it is rejected outright (the contract enforces the same bound); within
  it, it is weighted by a decreasing function of s, which multiplies the trust weight.
- Three shapes: `none` (weight 1: the loss's truncated importance weights already correct
  off-policy drift), `inverse` 1 / (1 + s), and `exp` exp(-s / tau). Pure functions of s.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from krill.errors import KrillError


class StalenessError(KrillError, ValueError):
    """A contribution is older than the staleness bound, or from the future."""


class StalenessConfig(BaseModel):
    """How stale contributions are bounded and weighted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["none", "inverse", "exp"] = Field("inverse", description="Shape of the staleness weight.")
    max_staleness: int = Field(2, ge=0, le=1000, description="S_max: contributions with t - v > S_max are rejected.")
    tau: float = Field(2.0, gt=0.0, le=1e6, description="Decay constant of the `exp` shape.")


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
