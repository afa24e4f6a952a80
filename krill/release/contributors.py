"""Who contributed to a version, and what the chain paid them.

Design decisions:
- Contributions come from the aggregation records of versions 1..V (located by the on-chain
  record digests): accepted and rejected entries per worker, the weight each accepted entry
  carried and the completion tokens it sampled.
- Rewards come from the chain alone: `RewardCredited` events of this run for versions 1..V.
  A worker's reward share is its credited amount over the total credited; a worker with accepted
  work but no settled reward yet shows 0. Amounts stay integers (token base units) so the card
  is exact and deterministic.
- A record's weights are text: one that is not a finite number (possible only in a record the
  release did not audit: `--audit-last`, `--unaudited`) refuses the release as a `PayloadError`
  naming it, rather than a bare ValueError or a table of NaN.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from krill.errors import PayloadError
from krill.protocol.record import AggregationRecord


@dataclass
class Contributor:
    address: str
    accepted: int = 0
    rejected: int = 0
    weight: float = 0.0
    tokens: int = 0
    rewards: int = 0
    share: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def records_up_to(chain, store, run_id: bytes, version: int) -> dict[int, tuple[str, AggregationRecord]]:
    """Version -> (record CID, record) for versions 1..`version`."""
    from krill.protocol.record import load_record
    from krill.store.cid import digest_to_cid

    out = {}
    for v in range(1, version + 1):
        digest = chain.version_of(run_id, v).record_digest
        out[v] = (digest_to_cid(digest), load_record(store, digest))
    return out


def credited_rewards(chain, run_id: bytes, version: int, from_block: int = 0) -> dict[str, int]:
    """Account (lowercase) -> token base units credited by this run's settlements of versions 1..`version`."""
    from krill.chain.events import RewardCredited

    out: dict[str, int] = {}
    for event in chain.events(from_block=from_block, kinds=(RewardCredited,)):
        if event.run_id == run_id and 1 <= event.version <= version:
            out[event.account.lower()] = out.get(event.account.lower(), 0) + int(event.amount)
    return out


def _weight(version: int, entry) -> float:
    try:
        weight = float(entry.weight)
    except ValueError:
        weight = math.nan
    if not math.isfinite(weight):
        raise PayloadError(f"the record of version {version} gives commit {entry.commit_id} the weight "
                           f"{entry.weight!r}, not a finite number: audit version {version}", field="record")
    return weight


def contributors(records: dict[int, tuple[str, AggregationRecord]], rewards: dict[str, int]) -> list[Contributor]:
    """Every worker named by a record or credited a reward, by reward then accepted work (address breaks ties)."""
    people: dict[str, Contributor] = {}

    def of(address: str) -> Contributor:
        return people.setdefault(address.lower(), Contributor(address.lower()))

    for v in sorted(records):
        _, record = records[v]
        for entry in record.accepted:
            c = of(entry.worker)
            c.accepted += 1
            c.weight += _weight(v, entry)
            c.tokens += entry.tokens
        for entry in record.rejected:
            of(entry.worker).rejected += 1
    total = sum(rewards.values())
    for address, amount in rewards.items():
        c = of(address)
        c.rewards = amount
        c.share = amount / total if total else 0.0
    return sorted(people.values(), key=lambda c: (-c.rewards, -c.accepted, c.address))
