"""Adopting published versions the journal does not know: what they folded is never folded again.

Design decisions:
- A contribution is folded into at most one version because deciding a version marks its
  contributions folded (`aggregated_version`) in the coordinator's database. A coordinator that
  starts on a database without those marks (the old one lost, wiped or left on another machine;
  the index is rebuilt from the chain, the role state is not) ingested every commit of the run
  again, and those still within the staleness window were accepted and folded a second time into
  the next version (weighted and rewarded twice, and failing `krill audit`'s "applied once").
- So on its first pass a coordinator reads the records of the published versions that its journal
  lacks, among those a commit of the next version's window could be in (the last S_max:
  a commit computed at v can be folded into v + 1 .. v + 1 + S_max), and marks the commits they
  accepted (with their recorded weights) and rejected as folded into, or named by, that version.
  Ingest then leaves them alone. Older commits are rejected as stale at ingest, as before.
- An adopted version the chain has not settled is settled from its record's accepted entries (the
  split `krill.coordinator.settle` computes from the journal's, which are the same entries). The
  loop settles a version right after publishing it and only from its journal, so a coordinator
  stopped in between whose database was then lost left that version's workers unpaid for good.
  The version the run last published is always looked at (also with S_max = 0), since that is the
  one such a stop leaves unsettled.
- A journal with every version of the window (the normal start) costs one query and no read.
- The index is asked for the named commits `IN_CHUNK` ids at a time (`krill.db.session.in_chunks`): with S_max up to 1000 the records
  of the window can name 300 000 commits, and PostgreSQL refuses a statement with more than 65 535
  bind parameters, so a coordinator on a new PostgreSQL database could not start.
- A record the store cannot give stops the coordinator (`CoordinatorStateError`): folding without
  knowing what the chain already holds could apply a contribution twice.
"""

from __future__ import annotations

from sqlalchemy import select

from krill.coordinator.journal import VersionDecision
from krill.db.models import Commit, Contribution, ContributionStatus, RejectionCode
from krill.db.session import in_chunks
from krill.errors import ContentNotFoundError, PayloadError


def adopt_published(ctx, latest: int) -> list[int]:
    """Mark the contributions named by published versions (of the staleness window before `latest` + 1)
    that the journal lacks, and settle those the chain has not settled; returns those versions."""
    from krill.coordinator.publish import CoordinatorStateError
    from krill.protocol.record import load_record

    window = max(ctx.spec.staleness.max_staleness, ctx.spec.chain.max_staleness, 1)  # 1: the last one, to settle
    first = max(1, latest - window + 1)
    if first > latest:
        return []
    with ctx.db.session() as s:
        have = set(s.scalars(select(VersionDecision.version).where(VersionDecision.run_id == ctx.run_hex,
                                                                   VersionDecision.version >= first)))
    missing = [v for v in range(first, latest + 1) if v not in have]
    records = {}
    for v in missing:
        try:
            records[v] = load_record(ctx.store, ctx.chain.version_of(ctx.run_id, v).record_digest)
        except (ContentNotFoundError, PayloadError) as exc:
            raise CoordinatorStateError(f"version {v} is published but not in this coordinator's journal, and its "
                                        f"record cannot be read ({exc}): folding now could apply its "
                                        "contributions twice") from exc
    if not records:
        return []
    named = [e.commit_id for r in records.values() for e in (*r.accepted, *r.rejected)]
    with ctx.db.write() as s:
        versions = {}
        for part in in_chunks(named):
            versions.update(s.execute(select(Commit.commit_id, Commit.version)
                                      .where(Commit.commit_id.in_(part))).all())
        for v, record in sorted(records.items()):
            for e in record.accepted:
                row = _row(s, ctx.run_hex, e.commit_id, e.worker, e.model_version)
                if row is not None:
                    row.status, row.reason_code, row.reason = ContributionStatus.ACCEPTED, None, None
                    row.weight, row.trust, row.staleness = float(e.weight), float(e.trust), e.staleness
                    row.aggregated_version = v
            for e in record.rejected:  # a commit the index lacks yet is ingested again: only named twice
                code = _code(e.reason_code)
                row = None if code is None or e.commit_id not in versions else \
                    _row(s, ctx.run_hex, e.commit_id, e.worker, int(versions[e.commit_id]))
                if row is not None:
                    row.status, row.reason_code, row.reason = ContributionStatus.REJECTED, code, e.reason
                    row.aggregated_version = v
    for v, record in sorted(records.items()):  # after the marks: a chain fault here retries the whole adoption
        _settle(ctx, v, [e.model_dump(mode="json") for e in record.accepted])
    return sorted(records)


def _settle(ctx, version: int, accepted: list[dict]) -> None:
    """Settle `version` from its record's accepted entries unless the chain has settled it (as
    `krill.coordinator.settle.settle_version` does from the journal's)."""
    from krill.coordinator.settle import send_settle
    from krill.protocol.rewards import version_split

    if ctx.chain.version_of(ctx.run_id, version).settled:
        return
    pool = ctx.chain.run_of(ctx.run_id).reward_pool
    split = version_split(ctx.spec, version, min(ctx.spec.chain.reward_per_version, pool), accepted)
    if split:
        send_settle(ctx, version, split)  # our own settle still pending: a passing fault (krill.coordinator.settle)


def _code(value: str) -> RejectionCode | None:
    try:
        return RejectionCode(value)
    except ValueError:  # a code this release does not know: the commit is ingested (and named) again
        return None


def _row(session, run_hex: str, commit_id: int, worker: str, version: int) -> Contribution | None:
    """The contribution row of `commit_id` to mark, created if missing; None when it is marked already."""
    row = session.get(Contribution, commit_id)
    if row is None:
        row = Contribution(commit_id=commit_id, run_id=run_hex, worker=worker, version=version,
                           status=ContributionStatus.PENDING)
        session.add(row)
    elif row.aggregated_version is not None:
        return None
    return row
