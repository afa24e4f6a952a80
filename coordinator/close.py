"""When version t = latest + 1 closes, and what goes into it; the decision is journalled before anything is published.

Design decisions:
- A version closes when the eligible accepted contributions reach `spec.version.contributions`
  (closed_by = "count"), or when `spec.version.deadline_s` passed since the previous version was
  published (block time) and at least `min_contributions` are eligible ("deadline").
- Eligibility is decided at close, since trust and jail change with verdicts between ingest and
  close: each accepted, not yet folded contribution is weighed (`trust.weigh`) for version t;
  those that became stale, jailed or fell below the trust floor are rejected now, with the reason.
- The decision takes contributions in commit-id order (deterministic), at most
  `spec.version.max_per_worker` of one worker (its others wait for the next version, as stale
  ones are then rejected: one staked account cannot fill a version) and at most
  `MAX_ACCEPTED_PER_VERSION` in all (the rest wait for the next version), plus every rejection
  not yet named in a record (at most `MAX_REJECTED_PER_RECORD`), and no more of either than keep
  the record under its cap whatever the fold's outcomes (`fitting_entries`: each accepted entry
  adds a trimmed fraction to every shard's outcome, so with many shards the cap binds before 200
  entries; rejections take at most half the room). What does not fit waits for the next version. A record over the cap could never be published, and the journalled
  decision would stop the coordinator on every restart.
- A contribution that carries no shard this coordinator serves (`--shards`) is rejected with
  `no_served_shard` (at ingest, and again here if the served shards changed since): a version
  folded from only such contributions would change nothing this coordinator can publish.
- The journal row keeps the fold's settings (the served shards, whether this version stores its
  optimizer states), so a restart with other settings still rebuilds the same bytes.
- One write transaction stores the journal row and marks the contributions as folded into t
  (`aggregated_version`, weight, trust, staleness): after it, a crash cannot lose or double-apply
  any of them.
- Before that transaction commits, the header and files of every contribution it folds are pinned
  in this coordinator's store (`pin_decided`): a restart rebuilds the version from the journal and
  that content, so content pinned only after the publication (as before) could be garbage-collected
  between the decision and a restart, and the journalled version could then never be published (every
  restart stopped on the missing content). A store outage rolls the decision back (decided on a later
  pass); a pin the store refuses otherwise is logged, as the version is still folded from memory now.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from sqlalchemy import select

from krill.coordinator.journal import DecisionState, VersionDecision
from krill.db.models import (
    ChainEventRow,
    Contribution,
    ContributionStatus,
    RejectionCode,
    Version,
)
from krill.errors import ContentNotFoundError, IntegrityError, PayloadError
from krill.protocol.record import MAX_ACCEPTED_PER_VERSION, MAX_REJECTED_PER_RECORD, fitting_entries


def closing_reason(spec, eligible: int, since_publish_s: float | None) -> str | None:
    """'count', 'deadline' or None (keep collecting)."""
    if eligible >= spec.version.contributions:
        return "count"
    if since_publish_s is not None and since_publish_s >= spec.version.deadline_s \
            and eligible >= spec.version.min_contributions:
        return "deadline"
    return None


def published_at(ctx, version: int) -> float | None:
    """Block time at which `version` was published (version 0: the run's creation), from the index."""
    with ctx.db.session() as s:
        tx = s.scalar(select(Version.published_tx).where(Version.run_id == ctx.run_hex, Version.version == version))
        if tx is None:
            return None
        return s.scalar(select(ChainEventRow.block_time).where(ChainEventRow.tx_hash == tx).limit(1))


def completion_tokens(rollouts) -> int:
    return int((np.diff(rollouts.offsets) - rollouts.prompt_lengths).sum())


def accepted_entry(commit_id: int, worker: str, contribution, weighing):
    from krill.protocol.record import AcceptedEntry

    h, r = contribution.header, contribution.rollouts
    mean_reward = float(np.float32(r.rewards.mean())) if r.n_sequences else 0.0
    return AcceptedEntry(commit_id=commit_id, worker=worker, header_digest=h.digest.hex(),
                         model_version=h.model_version, behaviour_version=h.behaviour_version,
                         staleness=weighing.staleness, trust=repr(float(weighing.trust)),
                         weight=repr(float(weighing.weight)), shards=sorted(contribution.gradients),
                         mean_reward=repr(mean_reward), tokens=completion_tokens(r))


def load_contribution(ctx, commit_id: int, worker: str, version: int):
    """The validated contribution of an accepted commit (from the cache, else fetched again)."""
    from krill.coordinator.ingest import CommitView, fetch_and_validate
    from krill.db.models import Commit

    cached = ctx.recall(commit_id)
    if cached is not None:
        return cached
    with ctx.db.session() as s:
        c = s.get(Commit, commit_id)
        view = CommitView(commit_id, worker, version, c.header_digest, c.worker_key, None, False, int(c.nonce))
    contribution = fetch_and_validate(ctx, view)
    ctx.remember(commit_id, contribution)
    return contribution


@dataclass
class Decision:
    version: int
    closed_by: str
    accepted: list[dict]
    rejected: list[dict]
    window_s: float


def decide(ctx, version: int, now: float | None = None) -> Decision | None:
    """Close `version` if it is time; journal the decision and return it (None: keep collecting)."""
    from krill.coordinator.confirm import refuted
    from krill.coordinator.standing import standings
    from krill.coordinator.trust import Standing, weigh
    from krill.protocol.record import RejectedEntry

    now = time.time() if now is None else now
    with ctx.db.session() as s:
        waiting = list(s.scalars(select(Contribution).where(
            Contribution.run_id == ctx.run_hex, Contribution.status == ContributionStatus.ACCEPTED,
            Contribution.aggregated_version.is_(None)).order_by(Contribution.commit_id)))
        standing = standings(s, ctx.run_hex, {c.worker for c in waiting}, ctx.spec.chain.check_probability_ppm,
                             refuted(s, ctx.run_hex))
    eligible, late, per_worker = [], [], {}
    cap = ctx.spec.version.max_per_worker
    for row in waiting:
        w = weigh(ctx.spec, standing.get(row.worker, Standing(0, 0, False)), version, row.version)
        if w.weight is None:
            late.append((row, w))
        elif cap is None or per_worker.get(row.worker, 0) < cap:  # over the cap: waits for the next version
            per_worker[row.worker] = per_worker.get(row.worker, 0) + 1
            eligible.append((row, w))
    previous = published_at(ctx, version - 1)
    since = None if previous is None else now - previous
    closed_by = closing_reason(ctx.spec, len(eligible), since)
    if closed_by is None:
        return None
    served = ctx.served_shards()
    entries, lost, loaded = [], [], {}
    for row, w in eligible[:MAX_ACCEPTED_PER_VERSION]:
        try:
            contribution = load_contribution(ctx, row.commit_id, row.worker, row.version)
        except (ContentNotFoundError, IntegrityError, PayloadError) as exc:
            lost.append((row, RejectionCode.UNAVAILABLE, f"content no longer retrievable at close: {exc}"[:500]))
            continue
        if not set(contribution.gradients) & set(served):
            lost.append((row, RejectionCode.NO_SERVED_SHARD, no_served_shard(contribution, served)))
            continue
        loaded[row.commit_id] = contribution
        entries.append((row, w, accepted_entry(row.commit_id, row.worker, contribution, w)))
    with ctx.db.write() as s:
        if not entries:  # everything eligible vanished from the store: record why, close later
            for row, code, reason in lost:
                c = s.get(Contribution, row.commit_id)
                c.status, c.reason_code, c.reason = ContributionStatus.REJECTED, code, reason
            return None
        if s.get(VersionDecision, (ctx.run_hex, version)) is not None:
            return None  # decided already (by an earlier pass): the journal is the truth
        for row, code, reason in lost + [(r, w.code, w.reason) for r, w in late]:
            c = s.get(Contribution, row.commit_id)
            c.status, c.reason_code, c.reason, c.trust = ContributionStatus.REJECTED, code, reason, None
        s.flush()
        unrecorded = list(s.scalars(select(Contribution).where(
            Contribution.run_id == ctx.run_hex, Contribution.status == ContributionStatus.REJECTED,
            Contribution.aggregated_version.is_(None)).order_by(Contribution.commit_id).limit(MAX_REJECTED_PER_RECORD)))
        rejected = [RejectedEntry(commit_id=c.commit_id, worker=c.worker, reason_code=c.reason_code.value,
                                  reason=c.reason or "").model_dump(mode="json") for c in unrecorded]
        accepted = [e.model_dump(mode="json") for _, _, e in entries]
        fit, fit_rejected = fitting_entries(accepted, rejected, ctx.spec.num_shards)  # the rest wait for the next
        entries, accepted, rejected = entries[:fit], accepted[:fit], rejected[:fit_rejected]
        for c in unrecorded[:fit_rejected]:
            c.aggregated_version = version  # named in this version's record
        for row, w, _ in entries:
            c = s.get(Contribution, row.commit_id)
            c.aggregated_version, c.weight, c.trust, c.staleness = version, w.weight, w.trust, w.staleness
        pin_decided(ctx, [(row.commit_id, loaded[row.commit_id]) for row, _, _ in entries])
        s.add(VersionDecision(run_id=ctx.run_hex, version=version, state=DecisionState.DECIDED, closed_by=closed_by,
                              accepted=accepted, rejected=rejected, decided_at=now, window_s=since or 0.0,
                              served_shards=list(served), keep_states=ctx.keeps_states(version)))
    return Decision(version, closed_by, accepted, rejected, since or 0.0)


def pin_decided(ctx, contributions) -> None:
    """Pin the header and every file of each (commit id, contribution) a decision folds; see the module
    docstring. `StoreUnavailableError` propagates (the decision is rolled back and taken on a later pass)."""
    import logging

    from krill.errors import KrillError, StoreUnavailableError

    for commit_id, contribution in contributions:
        h = contribution.header
        try:
            ctx.store.pin_all([h.cid, *(ref.cid for _, ref in sorted(h.files.items()))])
        except StoreUnavailableError:
            raise
        except KrillError as exc:
            logging.getLogger(__name__).warning("commit %s: its content could not be pinned at the decision (%s)",
                                                commit_id, exc)


def no_served_shard(contribution, served: list[int]) -> str:
    return (f"carries gradients for shards {sorted(contribution.gradients)[:16]} only; this coordinator serves "
            f"shards {list(served)[:16]}")
