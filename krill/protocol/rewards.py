"""A version's reward split: who the settlement of a version credits, and how much.

Design decisions:
- The split is a function of public data alone (the amount and the version's aggregation record),
  so the coordinator that settles (`coordinator/settle.py`) and anyone who audits the settlement
  (`krill.audit.ledger`) compute it with this one function and cannot drift apart.
- Pro rata by weight: a worker's share is the sum of the weights of its contributions in the record
  over the sum of all weights, computed in exact rationals from the recorded float64 weights (the
  text `repr` gives round-trips exactly), floored to token base units; the units left by flooring go
  one each to the largest remainders (ties: lower address), so the split always sums to the amount.
- The contract credits at most MAX_SETTLE_BATCH (64) accounts per settlement: when more workers took
  part, the 64 with the largest weights share the reward (ties: lower address).
"""

from __future__ import annotations

from fractions import Fraction

MAX_SETTLE_ACCOUNTS = 64


def reward_split(total: int, accepted: list[dict], max_accounts: int = MAX_SETTLE_ACCOUNTS) -> list[tuple[str, int]]:
    """[(worker, amount)] with sum(amount) == total (or [] when nothing can be split), address order."""
    weights: dict[str, Fraction] = {}
    for entry in accepted:
        weights[entry["worker"]] = weights.get(entry["worker"], Fraction(0)) + Fraction(float(entry["weight"]))
    ranked = sorted(((w, a) for a, w in weights.items() if w > 0), key=lambda x: (-x[0], x[1]))[:max_accounts]
    whole = sum(w for w, _ in ranked)
    if total <= 0 or whole == 0:
        return []
    exact = {a: total * w / whole for w, a in ranked}
    amounts = {a: int(x) for a, x in exact.items()}  # floor: every x >= 0
    left = total - sum(amounts.values())
    for a in sorted(exact, key=lambda a: (-(exact[a] - amounts[a]), a))[:left]:
        amounts[a] += 1
    return sorted((a, n) for a, n in amounts.items() if n > 0)
