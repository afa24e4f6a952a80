"""Trust and weight of a contribution: Beta posterior over verdicts x staleness weight.

Design decisions:
- Trust is the mean of Beta(prior_alpha + passes, prior_beta + fails), with the prior taken from
  the RUN SPEC (not from the indexer's default), so every coordinator of a run computes the same
  number from the same verdict counts (`krill audit` checks the weight against the trust a record
  claims). New workers start at
  prior_alpha / (prior_alpha + prior_beta): low.
- The verdict counts are those of `krill.coordinator.standing`: verdicts of selected verifiers only,
  less failures on commits whose quorum the coordinator's replay refuted.
- A jailed worker (one of its commits was slashed) has no trust: its contributions are rejected
  outright, not merely down-weighted. Below the spec's floor a contribution is rejected too.
- A weight that is not positive is rejected as below the floor as well: the validators accept a floor
  of 0 and any positive prior, so trust can be 0.0 (prior_alpha 5e-324) or trust x an `exp`
  staleness weight can underflow to 0.0 (prior_alpha 1e-300, exp(-700)). Accepted, such a
  contribution could not be folded (the fold refuses a weight sum of 0, and the journalled decision
  stopped the coordinator for good) and `krill audit` fails any weight <= 0.
- Weights are float64 and written to the record as `repr`, so a recomputation uses the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass

from krill.db.models import RejectionCode
from krill.rl.staleness import staleness_weight


@dataclass(frozen=True)
class Standing:
    """What the index says about a worker when its contribution is weighed."""

    passes: int
    fails: int
    jailed: bool


def trust_of(spec, standing: Standing) -> float:
    alpha = spec.trust.prior_alpha + standing.passes
    beta = spec.trust.prior_beta + standing.fails
    return float(alpha / (alpha + beta))


@dataclass(frozen=True)
class Weighing:
    """Either a weight (trust x staleness weight) or a rejection with its reason."""

    trust: float
    staleness: int
    weight: float | None
    code: RejectionCode | None = None
    reason: str | None = None


def weigh(spec, standing: Standing, version: int, model_version: int) -> Weighing:
    """How a contribution computed at `model_version` counts in version `version` (= latest + 1)."""
    staleness = version - 1 - model_version
    trust = trust_of(spec, standing)
    if standing.jailed:
        return Weighing(trust, staleness, None, RejectionCode.JAILED, "the worker is jailed (a commit was slashed)")
    if staleness < 0:
        return Weighing(trust, staleness, None, RejectionCode.STALE,
                        f"computed at version {model_version}, newer than the parent {version - 1}")
    if staleness > spec.staleness.max_staleness:
        return Weighing(trust, staleness, None, RejectionCode.STALE,
                        f"staleness {staleness} exceeds S_max = {spec.staleness.max_staleness} for version {version}")
    if trust < spec.trust.floor:
        return Weighing(trust, staleness, None, RejectionCode.BELOW_TRUST_FLOOR,
                        f"trust {trust:.4f} is below the floor {spec.trust.floor}")
    weight = float(trust * staleness_weight(staleness, spec.staleness))
    if not weight > 0.0:
        return Weighing(trust, staleness, None, RejectionCode.BELOW_TRUST_FLOOR,
                        f"trust {trust!r} x the staleness weight is {weight!r}: a weight that cannot be folded")
    return Weighing(trust, staleness, weight)
