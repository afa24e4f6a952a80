"""Contributions (commits) and the evidence of the verdicts on them.

Design decisions:
- A contribution page joins what the chain says (the commit, its transaction, its randomness and
  verdict counts), what the indexer found when it fetched the signed header (status and error),
  what the coordinator did with it (accepted with a weight, or rejected and why), the verdicts with
  their evidence, and the slash if any. With a store, the header is fetched and its signature
  checked again against the staked key on each view.
- An evidence page is addressed by the evidence digest attested on-chain; it lists the verdicts
  that attested that digest and renders the document from the store.
- A commit is addressed by its id alone, so its version links name its run (without it they led
  to the newest run's version of that number). It is said to be in a version's record only once
  that version is published: the coordinator marks contributions folded when it journals a
  version, and a coordinator stopped before publishing left pages linking a version that is a 404.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from krill.db.models import Commit, Contribution, ContributionStatus, Header, Run, Slash, Verdict
from krill.explorer.paging import NotFound, Page, PageRequest, paginate
from krill.explorer.participants import commit_row, commits_stmt, slash_json, verdict_json
from krill.explorer.store_view import evidence_view, header_view

STATUSES = tuple(s.value for s in ContributionStatus) + ("unseen",)


def list_contributions(session: Session, run: Run, request: PageRequest, status: str | None = None,
                       worker: str | None = None, version: int | None = None) -> Page:
    """Commits of a run, newest first, optionally filtered by the coordinator's status, worker, version."""
    stmt = commits_stmt().where(Commit.run_id == run.run_id)
    if status == "unseen":
        stmt = stmt.where(Contribution.commit_id.is_(None))
    elif status is not None:
        stmt = stmt.where(Contribution.status == ContributionStatus(status))
    if worker is not None:
        stmt = stmt.where(Commit.worker == worker)
    if version is not None:
        stmt = stmt.where(Commit.version == version)
    return paginate(session, stmt.order_by(Commit.commit_id.desc()), request, lambda row: commit_row(*row),
                    scalars=False)


def header_json(h: Header | None) -> dict[str, Any] | None:
    if h is None:
        return None
    return {"status": h.status.value, "error": h.error, "attempts": h.attempts, "run_name": h.run_name,
            "task": h.task, "engine": h.engine, "manifest_cid": h.manifest_cid,
            "prompt_seed": None if h.prompt_seed is None else str(h.prompt_seed),
            "sampling_seed": None if h.sampling_seed is None else str(h.sampling_seed),
            "temperature_milli": h.temperature_milli, "top_p_milli": h.top_p_milli, "top_k": h.top_k,
            "max_new_tokens": h.max_new_tokens, "shards": h.shards, "files": h.files, "total_bytes": h.total_bytes}


def contribution_detail(session: Session, commit_id: int, store) -> dict[str, Any]:
    row = session.execute(commits_stmt().where(Commit.commit_id == commit_id)).first()
    if row is None:
        raise NotFound(f"no commit {commit_id} in the index")
    out = commit_row(*row)
    commit = row[0]
    out.update(worker_key=commit.worker_key, randomness=commit.randomness, sealed_block=commit.sealed_block,
               randomness_block=commit.block_number + 1)
    out["indexed_header"] = header_json(session.get(Header, commit_id))
    out["verdicts"] = [verdict_json(v) for v in session.scalars(
        select(Verdict).where(Verdict.commit_id == commit_id).order_by(Verdict.block_number, Verdict.verifier))]
    slash = session.get(Slash, commit_id)
    out["slash"] = slash_json(slash) if slash else None
    out["header"] = header_view(store, commit.header_cid, commit.worker_key)
    return out


def evidence_detail(session: Session, digest: str, store) -> dict[str, Any]:
    """The verdicts attesting `digest` and the document itself (from the store)."""
    verdicts = [verdict_json(v) for v in session.scalars(
        select(Verdict).where(Verdict.evidence_digest == digest).order_by(Verdict.block_number, Verdict.verifier)
        .limit(100))]
    if not verdicts:
        raise NotFound(f"no verdict in the index attests evidence {digest}")
    commit = session.get(Commit, verdicts[0]["commit_id"])
    view = evidence_view(store, digest)
    if view["available"]:
        from krill.db.models import IndexMeta

        doc, meta = view["document"], session.get(IndexMeta, 1)
        consistent = all(doc.get("commit_id") == v["commit_id"] and doc.get("verifier") == v["verifier"]
                         and doc.get("ok") == v["ok"] for v in verdicts)
        # The commit it names must be the one on-chain: same run, same header, this chain and contract
        # (a document copied from another commit or deployment agrees on id, verifier and outcome alone).
        consistent = consistent and commit is not None and meta is not None and (
            doc.get("run_id"), doc.get("header_digest"), doc.get("chain_id"), str(doc.get("contract", "")).lower()
        ) == (commit.run_id, commit.header_digest, meta.chain_id, meta.protocol.lower())
        view["matches_chain"] = consistent
    return {"evidence_digest": digest, "verdicts": verdicts,
            "worker": commit.worker if commit else None, "evidence": view}
