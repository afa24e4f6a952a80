"""Participants: workers and verifiers with stake, trust, contributions, verdicts, slashes and rewards.

Design decisions:
- The participant row (stake, verdict counts, credits) is the index's; the
  accepted / rejected counts and the reasons come from the coordinator's contributions table, so
  "why was this rejected" is answered with the coordinator's own reason code and message.
- Each list under a participant (its contributions, verdicts it gave, its slashes, its rewards)
  is paginated on its own: the page shows the first page of each and links to the full list, and
  the JSON API has one endpoint per list.
- A slash row carries the failing verdicts of the slashed commit with their evidence digests, so
  one click leads from a slashed worker to the evidence that slashed it.
- A worker's `trust` is the trust the coordinator weighed its newest contribution folded into a
  published version at (the record of that version publishes it), with where it comes from
  (`trust_weighed`); none before the first such weighing. The index's Beta tally over every
  verdict on the worker's commits (`trust_alpha`, `trust_beta`, checks passed / failed) is not
  trust: the coordinator counts only verdicts of verifiers the commit's randomness drew, staked no
  later than the commit's block, on its run's commits, with its run's prior
  (`krill.coordinator.standing`). Shown as trust, that tally could be raised at will: five verifiers
  staked after a worker's commit, passing it, lifted it from 0.4 to 0.7 while the coordinator
  still weighed the worker at 0.25.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from krill.db.models import (
    Commit,
    Contribution,
    ContributionStatus,
    Participant,
    ParticipantRole,
    Reward,
    Run,
    Slash,
    Verdict,
)
from krill.explorer.overview import CONTRIBUTION_COUNTS, ROLE_NAMES, amount, contribution_counts
from krill.explorer.paging import NotFound, Page, PageRequest, paginate

ROLES = tuple(r.name.lower() for r in ParticipantRole if r != ParticipantRole.NONE)


def participant_json(p: Participant, weighed: Contribution | None = None) -> dict[str, Any]:
    """The participant's row; `weighed`: its newest published weighing (see the module docstring)."""
    return {"address": p.address, "role": ROLE_NAMES.get(p.role, str(p.role)), "ed25519_key": p.ed25519_key,
            "staked": amount(p.staked), "unbonding": amount(p.unbonding), "release_block": p.release_block,
            "jailed": p.jailed, "jailed_commit_id": p.jailed_commit_id, "slashed_total": amount(p.slashed_total),
            "first_block": p.first_block, "commits": p.commits, "checks_passed": p.checks_passed,
            "checks_failed": p.checks_failed, "trust": weighed.trust if weighed else None,
            "trust_weighed": None if weighed is None else {
                "run_id": weighed.run_id, "version": weighed.aggregated_version, "commit_id": weighed.commit_id},
            "trust_alpha": p.trust_alpha,
            "trust_beta": p.trust_beta, "rewards_credited": amount(p.rewards_credited),
            "bounties_credited": amount(p.bounties_credited), "claimed": amount(p.claimed),
            "claimable": amount(p.claimable)}


def _contribution_counts(session: Session, addresses: list[str]) -> dict[str, dict[str, int]]:
    counts = contribution_counts(session, Contribution.worker.in_(addresses), by=Contribution.worker)
    return {a: counts.get(a, dict.fromkeys(CONTRIBUTION_COUNTS, 0)) for a in addresses}


def weighings(session: Session, addresses: list[str]) -> dict[str, Contribution]:
    """Per worker of `addresses`, its newest contribution (by commit id) that the coordinator weighed and
    folded into a version its run has published, which carries the trust it was weighed at."""
    published = and_(Contribution.status == ContributionStatus.ACCEPTED, Contribution.trust.is_not(None),
                     Contribution.aggregated_version <= Run.latest_version)
    newest = (select(Contribution.worker, func.max(Contribution.commit_id).label("commit_id"))
              .join(Run, Run.run_id == Contribution.run_id)
              .where(Contribution.worker.in_(addresses), published).group_by(Contribution.worker).subquery())
    return {c.worker: c for c in session.scalars(select(Contribution).join(
        newest, newest.c.commit_id == Contribution.commit_id))}


def list_participants(session: Session, request: PageRequest, role: str | None = None) -> Page:
    """Staked accounts (and accounts only credited), workers first, in order of first appearance."""
    stmt = select(Participant).order_by(Participant.role, Participant.first_block, Participant.address)
    if role is not None:
        stmt = stmt.where(Participant.role == int(ParticipantRole[role.upper()]))
    page = paginate(session, stmt, request, lambda p: p)
    addresses = [p.address for p in page.items]
    counts, weighed = _contribution_counts(session, addresses), weighings(session, addresses)
    page.items = [{**participant_json(p, weighed.get(p.address)), "contributions": counts[p.address]}
                  for p in page.items]
    return page


def participant_detail(session: Session, address: str, request: PageRequest) -> dict[str, Any]:
    p = session.get(Participant, address)
    if p is None:
        raise NotFound(f"no participant {address} in the index")
    out = participant_json(p, weighings(session, [address]).get(address))
    out["contributions"] = _contribution_counts(session, [address])[address]
    reasons = session.execute(select(Contribution.reason_code, func.count()).where(
        Contribution.worker == address, Contribution.status == ContributionStatus.REJECTED)
        .group_by(Contribution.reason_code).order_by(func.count().desc()))
    out["rejections"] = [{"reason_code": code.value if code else None, "count": int(n)} for code, n in reasons]
    first = type(request)(1, request.per_page)
    out["lists"] = {"contributions": contributions_of(session, address, first).to_json(),
                    "verdicts": verdicts_by(session, address, first).to_json(),
                    "slashes": slashes_of(session, address, first).to_json(),
                    "rewards": rewards_of(session, address, first).to_json()}
    return out


def commit_row(commit: Commit, treatment: Contribution | None, latest_version: int) -> dict[str, Any]:
    """A commit as listed: chain facts plus the coordinator's treatment of it. `record_published`: whether
    the version whose record names it (`aggregated_version`) is published (`latest_version`: its run's);
    the coordinator marks a contribution folded when it journals a version, before publishing it."""
    folded = treatment.aggregated_version if treatment else None
    return {"commit_id": commit.commit_id, "run_id": commit.run_id, "worker": commit.worker,
            "version": commit.version, "nonce": amount(commit.nonce), "header_digest": commit.header_digest,
            "header_cid": commit.header_cid, "block_number": commit.block_number, "tx_hash": commit.tx_hash,
            "pass_count": commit.pass_count, "fail_count": commit.fail_count, "slashed": commit.slashed,
            "status": treatment.status.value if treatment else "unseen",
            "reason_code": treatment.reason_code.value if treatment and treatment.reason_code else None,
            "reason": treatment.reason if treatment else None,
            "weight": treatment.weight if treatment else None, "trust": treatment.trust if treatment else None,
            "staleness": treatment.staleness if treatment else None,
            "aggregated_version": folded,
            "record_published": None if folded is None else folded <= latest_version}


def commits_stmt():
    """(commit, its treatment or None, its run's latest version) rows, for `commit_row`."""
    return (select(Commit, Contribution, Run.latest_version).join(Run, Run.run_id == Commit.run_id)
            .join(Contribution, Contribution.commit_id == Commit.commit_id, isouter=True))


def contributions_of(session: Session, address: str, request: PageRequest) -> Page:
    stmt = commits_stmt().where(Commit.worker == address).order_by(Commit.commit_id.desc())
    return paginate(session, stmt, request, lambda row: commit_row(*row), scalars=False)


def verdict_json(v: Verdict) -> dict[str, Any]:
    return {"commit_id": v.commit_id, "verifier": v.verifier, "ok": v.ok, "evidence_digest": v.evidence_digest,
            "pass_count": v.pass_count, "fail_count": v.fail_count, "block_number": v.block_number,
            "tx_hash": v.tx_hash}


def verdicts_by(session: Session, address: str, request: PageRequest) -> Page:
    stmt = select(Verdict).where(Verdict.verifier == address).order_by(Verdict.block_number.desc(),
                                                                       Verdict.commit_id.desc())
    return paginate(session, stmt, request, verdict_json)


def slash_json(s: Slash) -> dict[str, Any]:
    return {"commit_id": s.commit_id, "worker": s.worker, "amount": amount(s.amount), "bounty": amount(s.bounty),
            "burned": amount(s.burned), "block_number": s.block_number, "tx_hash": s.tx_hash}


def slashes_of(session: Session, address: str, request: PageRequest) -> Page:
    """Slashes of a worker, each with the failing verdicts (and their evidence) on the slashed commit."""
    stmt = select(Slash).where(Slash.worker == address).order_by(Slash.block_number.desc(), Slash.commit_id.desc())
    page = paginate(session, stmt, request, slash_json)
    ids = [s["commit_id"] for s in page.items]
    failing: dict[int, list[dict[str, Any]]] = {i: [] for i in ids}
    for v in session.scalars(select(Verdict).where(Verdict.commit_id.in_(ids), Verdict.ok.is_(False))
                             .order_by(Verdict.block_number, Verdict.verifier)):
        failing[v.commit_id].append({"verifier": v.verifier, "evidence_digest": v.evidence_digest,
                                     "tx_hash": v.tx_hash})
    for s in page.items:
        s["evidence"] = failing[s["commit_id"]]
    return page


def reward_json(r: Reward) -> dict[str, Any]:
    return {"kind": r.kind.value, "account": r.account, "amount": amount(r.amount), "run_id": r.run_id,
            "version": r.version, "commit_id": r.commit_id, "block_number": r.block_number, "tx_hash": r.tx_hash}


def rewards_of(session: Session, address: str, request: PageRequest) -> Page:
    stmt = select(Reward).where(Reward.account == address).order_by(Reward.block_number.desc(),
                                                                    Reward.log_index.desc())
    return paginate(session, stmt, request, reward_json)
