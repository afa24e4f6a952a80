"""A version's reward split: who the settlement of a version credits, and how much.

Design decisions:
- The split is a function of public data alone (the amount, the version's aggregation record and
  the run's tie rule), so the coordinator that settles (`coordinator/settle.py`) and anyone who
  audits the settlement (`krill.audit.ledger`) compute it with this one function (`version_split`,
  from the run spec) and cannot drift apart.
- Pro rata by weight: a worker's share is the sum of the weights of its contributions in the record
  over the sum of all weights, computed in exact rationals from the recorded float64 weights (the
  text `repr` gives round-trips exactly), floored to token base units; the units left by flooring go
  one each to the largest remainders, so the split always sums to the amount.
- The contract credits at most MAX_SETTLE_BATCH (64) accounts per settlement: when more workers took
  part, the 64 with the largest weights share the reward.
- Ties (in the 64-account cut and among equal remainders) follow the run's `reward.ties`
  (`krill.protocol.spec.RewardSpec`). A new run's is `hashed`: tied accounts are ordered by
  sha256(tag, run id, version, lowercase address), a fresh order on every version that no address can
  be ground to lead (newcomers all start at the same trust prior, so their weights tie exactly). A
  spec published before the option names none and meant `address` (lower address first), which the
  audit must keep to recompute that run's settlements; under it 64 accounts ground to low addresses
  took every tied slot of every version from honest newcomers.
"""

from __future__ import annotations

import hashlib
from fractions import Fraction
from typing import Literal

MAX_SETTLE_ACCOUNTS = 64
RewardTies = Literal["address", "hashed"]
_TIE_TAG = b"krill/reward-ties/v1"


def _tie_keys(accounts, ties: RewardTies, run_id: bytes | None, version: int | None) -> dict[str, object]:
    if ties == "address":
        return {a: a for a in accounts}
    if ties != "hashed" or run_id is None or len(run_id) != 32 or version is None or version < 0:
        raise ValueError(f"reward ties {ties!r} need the run id (32 bytes) and the version")
    prefix = _TIE_TAG + run_id + version.to_bytes(8, "big")
    return {a: (hashlib.sha256(prefix + a.lower().encode()).digest(), a) for a in accounts}


def reward_split(total: int, accepted: list[dict], max_accounts: int = MAX_SETTLE_ACCOUNTS, *,
                 ties: RewardTies = "address", run_id: bytes | None = None,
                 version: int | None = None) -> list[tuple[str, int]]:
    """[(worker, amount)] with sum(amount) == total (or [] when nothing can be split), address order.

    `ties`: how equal weights and equal remainders are ordered; `hashed` needs `run_id` and `version`
    (a settlement uses `version_split`, which takes them from the run spec)."""
    weights: dict[str, Fraction] = {}
    for entry in accepted:
        weights[entry["worker"]] = weights.get(entry["worker"], Fraction(0)) + Fraction(float(entry["weight"]))
    key = _tie_keys(weights, ties, run_id, version)
    ranked = sorted(((w, a) for a, w in weights.items() if w > 0), key=lambda x: (-x[0], key[x[1]]))[:max_accounts]
    whole = sum(w for w, _ in ranked)
    if total <= 0 or whole == 0:
        return []
    exact = {a: total * w / whole for w, a in ranked}
    amounts = {a: int(x) for a, x in exact.items()}  # floor: every x >= 0
    left = total - sum(amounts.values())
    for a in sorted(exact, key=lambda a: (-(exact[a] - amounts[a]), key[a]))[:left]:
        amounts[a] += 1
    return sorted((a, n) for a, n in amounts.items() if n > 0)


def version_split(spec, version: int, total: int, accepted: list[dict]) -> list[tuple[str, int]]:
    """The split of `version` of the run `spec` defines, under the run's tie rule."""
    return reward_split(total, accepted, ties=spec.reward.ties, run_id=spec.run_id, version=version)
