"""The run's event history that an audit needs, read from the chain in one scan and kept.

Design decisions:
- One scan of the contract's events from the run's creation block, for the kinds the audit reads:
  `Committed` (the run's commits: the nonce rule, and which verdicts are this run's), `Attested`
  (the failing verdicts a commit gathered), `RewardsFunded` and `VersionSettled` (the reward
  pool's history) and `RewardCredited` (what each settlement paid). `Attested` names no run: a
  verdict counts for the run when its commit is one of the run's `Committed` events.
- The pool's history is rebuilt from the only two changes the contract makes to it: a funding
  (`RewardsFunded` carries the pool after it, so the history resynchronises on each) and a
  settlement (`VersionSettled` takes its total). The pool is 0 when the run is created.
- A point in the history is (block number, log index), so "before the settlement" and "from the
  version's publication on" are exact comparisons; a publication is placed at the start of its
  block (`published_block`, 0), which only ever adds the pool held a few transactions earlier.
- Fail counts are the largest `failCount` an `Attested` event of the commit reported: a cheap way
  to find the few commits that reached a quorum; the checks then read those commits' views, which
  are authoritative (`AuditSource.commit`). The failing verdicts' evidence digests and each
  `Slashed` event (its block and amount) are kept too: a slash is judged by when it landed and by
  what the verdicts behind it claimed.
- Each commit's block and worker are kept (`commits`): whether every commit was named in some record
  in time (`krill.audit.coverage`) follows from them. So is each `WorkerJailed` (the first per worker,
  whatever the run: a stake is jailed for good, across runs), which a rejection as `jailed` must
  follow. Where each `Committed` is (`committed_at`) places the commit among the unbonding period's
  changes, which a slash's deadline follows (`krill.audit.ledger.judge_slash`).
- Each verdict on a commit of the run is kept with its commit and verifier, and each account's first
  `Staked` block since the run's creation (not its key's first where it staked before the run and
  topped up or re-staked since: `AuditSource.staked_before_run` reads those): trust counts only the
  verdicts of verifiers the commit's draw selected and whose key was on-chain by the commit's block
  (`coordinator/standing.py`), and `verdict_counts` takes that rule as a predicate
  (`AuditSource.counts_towards_trust`), since the draw needs the commits' views.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

Point = tuple[int, int]  # (block number, log index)


@dataclass
class RunHistory:
    first_commits: dict[tuple[str, int], int] = field(default_factory=dict)  # (worker, nonce) -> first commit id
    fail_counts: dict[int, int] = field(default_factory=dict)  # commit id of the run -> most failing verdicts
    pool: list[tuple[Point, int]] = field(default_factory=list)  # (where, pool after) for each change, in order
    settlements: dict[int, list] = field(default_factory=lambda: defaultdict(list))  # version -> VersionSettled
    credits: dict[int, list] = field(default_factory=lambda: defaultdict(list))  # version -> RewardCredited
    failing_evidence: dict[int, list[bytes]] = field(default_factory=lambda: defaultdict(list))  # commit -> digests
    slashes: dict[int, object] = field(default_factory=dict)  # commit id -> its Slashed event
    # worker -> (block, ok, commit id, verifier) of each verdict on its commits of the run
    verdicts: dict[str, list[tuple[int, bool, int, str]]] = field(default_factory=lambda: defaultdict(list))
    staked: dict[str, int] = field(default_factory=dict)  # account -> block of its first Staked event in the run
    commits: dict[int, tuple[int, str]] = field(default_factory=dict)  # commit id of the run -> (block, worker)
    committed_at: dict[int, Point] = field(default_factory=dict)  # commit id of the run -> where its Committed is
    jailed: dict[str, int] = field(default_factory=dict)  # worker -> block of its WorkerJailed event

    @classmethod
    def read(cls, chain, run_id: bytes, from_block: int) -> RunHistory:
        from krill.chain.events import (
            Attested,
            Committed,
            RewardCredited,
            RewardsFunded,
            Slashed,
            Staked,
            VersionSettled,
            WorkerJailed,
        )

        history, fails, pool = cls(), {}, 0
        commits = history.commits  # the run's commits so far: verdicts count for the run when their commit is one
        kinds = (Committed, Attested, RewardsFunded, RewardCredited, VersionSettled, Slashed, WorkerJailed, Staked)
        events = sorted(chain.events(from_block=from_block, kinds=kinds), key=lambda e: (e.block_number, e.log_index))
        for event in events:
            where = (event.block_number, event.log_index)
            if isinstance(event, Committed) and event.run_id == run_id:
                commits[event.commit_id] = (event.block_number, event.worker.lower())
                history.committed_at[event.commit_id] = where
                key = (event.worker.lower(), int(event.nonce))
                history.first_commits[key] = min(history.first_commits.get(key, event.commit_id), event.commit_id)
            elif isinstance(event, Attested):
                fails[event.commit_id] = max(fails.get(event.commit_id, 0), int(event.fail_count))
                if event.commit_id in commits:  # a commit of this run: committed before its verdicts
                    history.verdicts[commits[event.commit_id][1]].append(
                        (event.block_number, bool(event.ok), event.commit_id, event.verifier.lower()))
                if not event.ok:
                    history.failing_evidence[event.commit_id].append(bytes(event.evidence_digest))
            elif isinstance(event, Slashed):
                history.slashes[event.commit_id] = event
            elif isinstance(event, Staked):
                history.staked.setdefault(event.account.lower(), event.block_number)
            elif isinstance(event, WorkerJailed):
                history.jailed.setdefault(event.worker.lower(), event.block_number)
            elif isinstance(event, RewardsFunded) and event.run_id == run_id:
                pool = int(event.reward_pool)
                history.pool.append((where, pool))
            elif isinstance(event, VersionSettled) and event.run_id == run_id:
                pool -= int(event.total)
                history.pool.append((where, pool))
                history.settlements[int(event.version)].append(event)
            elif isinstance(event, RewardCredited) and event.run_id == run_id:
                history.credits[int(event.version)].append(event)
        history.fail_counts = {c: n for c, n in fails.items() if c in commits}
        history.failing_evidence = defaultdict(list, {c: d for c, d in history.failing_evidence.items() if c in commits})
        history.slashes = {c: e for c, e in history.slashes.items() if c in commits}
        return history

    def verdict_counts(self, worker: str, before_block: int, counts=None) -> tuple[int, int]:
        """(passing, failing) verdicts on `worker`'s commits of the run in blocks before `before_block`; with
        `counts(commit_id, verifier)`, only those it admits."""
        seen = [ok for block, ok, commit_id, verifier in self.verdicts.get(worker.lower(), [])
                if block < before_block and (counts is None or counts(commit_id, verifier))]
        return sum(seen), len(seen) - sum(seen)

    def pool_at(self, point: Point) -> int:
        """The pool just before `point`."""
        held = 0
        for where, pool in self.pool:
            if where >= point:
                break
            held = pool
        return held

    def pools_between(self, start: Point, end: Point | None) -> list[int]:
        """Every value the pool held from just before `start` up to just before `end` (None: now), in order."""
        values = [self.pool_at(start)]
        values += [pool for where, pool in self.pool if start <= where and (end is None or where < end)]
        return values

    def first_settlement_after(self, version: int) -> tuple[Point, int] | None:
        """(where, version) of the earliest settlement of a version later than `version`, or None."""
        later = [((e.block_number, e.log_index), v) for v, events in self.settlements.items() if v > version
                 for e in events]
        return min(later) if later else None
