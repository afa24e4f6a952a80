"""Versions of a run: the list, and one version with its manifest, shards, record, evals and audit.

Design decisions:
- Everything about a version the index holds comes from the database (manifest CID, shard CIDs,
  the contributions the coordinator folded into it with their weights); the aggregation record,
  which adds trimmed fractions and per-shard outcomes, comes from the store by the record digest
  published on-chain, when a store is configured.
- Audit status is what `krill audit` reported (see `krill.explorer.audit_status`); the explorer
  itself holds no chain connection and recomputes nothing.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from krill.db.models import Contribution, ContributionStatus, Eval, Metric, Run, Shard, Version
from krill.explorer.audit_status import AuditStatus
from krill.explorer.overview import amount, eval_accuracy
from krill.explorer.paging import NotFound, Page, PageRequest, paginate
from krill.explorer.store_view import record_view
from krill.store.cid import digest_to_cid


def _metric_json(m: Metric | None) -> dict[str, Any] | None:
    if m is None:
        return None
    return {"accepted": m.accepted, "rejected": m.rejected, "mean_reward": m.mean_reward,
            "sampled_tokens": m.sampled_tokens, "bytes_received": m.bytes_received,
            "bytes_published": m.bytes_published, "mean_staleness": m.mean_staleness,
            "aggregation_rule": m.aggregation_rule, "wall_seconds": m.wall_seconds}


def version_json(v: Version, metric: Metric | None, accuracy: float | None, audit: AuditStatus) -> dict[str, Any]:
    return {"version": v.version, "manifest_cid": v.manifest_cid, "manifest_digest": v.manifest_digest,
            "manifest_status": v.manifest_status.value, "manifest_error": v.manifest_error,
            "parent_cid": v.parent_cid, "num_shards": v.num_shards, "record_digest": v.record_digest,
            "record_cid": digest_to_cid(bytes.fromhex(v.record_digest)) if v.record_digest else None,
            "published_block": v.published_block, "published_tx": v.published_tx, "settled": v.settled,
            "settled_block": v.settled_block, "settled_accounts": v.settled_accounts,
            "settled_total": amount(v.settled_total), "metrics": _metric_json(metric), "accuracy": accuracy,
            "audit": audit.of(v.version, v.run_id)}


def list_versions(session: Session, run: Run, request: PageRequest, audit: AuditStatus) -> Page:
    """Published versions, newest first."""
    stmt = select(Version).where(Version.run_id == run.run_id).order_by(Version.version.desc())
    page = paginate(session, stmt, request, lambda v: v)
    numbers = [v.version for v in page.items]
    metrics = {m.version: m for m in session.scalars(select(Metric).where(
        Metric.run_id == run.run_id, Metric.version.in_(numbers)))}
    evals = eval_accuracy(session, run.run_id, numbers)
    page.items = [version_json(v, metrics.get(v.version), evals.get(v.version, {}).get("accuracy"), audit)
                  for v in page.items]
    return page


def folded_json(c: Contribution) -> dict[str, Any]:
    return {"commit_id": c.commit_id, "worker": c.worker, "learner_version": c.version, "status": c.status.value,
            "reason_code": c.reason_code.value if c.reason_code else None, "reason": c.reason,
            "weight": c.weight, "trust": c.trust, "staleness": c.staleness}


def version_detail(session: Session, run: Run, number: int, request: PageRequest, audit: AuditStatus,
                   store) -> dict[str, Any]:
    """One version: the index's rows, the contributions named in its record (paged), the record itself."""
    v = session.get(Version, (run.run_id, number))
    if v is None:
        raise NotFound(f"version {number} of run {run.run_id[:16]}… is not in the index")
    metric = session.get(Metric, (run.run_id, number))
    evals = [{"task": e.task, "split": e.split, "n": e.n, "correct": e.correct, "accuracy": e.accuracy}
             for e in session.scalars(select(Eval).where(Eval.run_id == run.run_id, Eval.version == number)
                                      .order_by(Eval.task, Eval.split))]
    shards = [{"shard": s.shard, "cid": s.cid, "sha256": s.sha256, "size": s.size, "parameters": s.parameters,
               "elements": s.elements}
              for s in session.scalars(select(Shard).where(Shard.run_id == run.run_id, Shard.version == number)
                                       .order_by(Shard.shard))]
    folded = select(Contribution).where(
        Contribution.run_id == run.run_id, Contribution.aggregated_version == number).order_by(
        (Contribution.status == ContributionStatus.ACCEPTED).desc(), Contribution.commit_id)
    out = version_json(v, metric, evals[0]["accuracy"] if evals else None, audit)
    out.update(run_id=run.run_id, evals=evals, shards=shards,
               contributions=paginate(session, folded, request, folded_json).to_json(),
               record=record_view(store, v.record_digest))
    return out
