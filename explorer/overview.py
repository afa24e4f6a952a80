"""The run a page is about, and the overview of it: parameters, curves over versions, totals.

Design decisions:
- Data functions return JSON-ready dicts, and the HTML pages render exactly those dicts, so the
  JSON API and the pages cannot disagree.
- Token amounts are uint256: they are spelled as decimal strings of base units in JSON (a JSON
  number loses precision past 2**53 in most clients); the pages format them as tokens.
- A database may index several runs; pages are about one, chosen by `?run=`, by default the most
  recently created. Sums over Uint columns are done in Python (they are decimal text on SQLite).
- The per-version series is capped to the last `MAX_SERIES` versions so a long run still draws
  quickly; the totals cover every version.
- A contribution counts as accepted once a published version's record names it accepted, as
  `krill demo`'s summary counts it; the coordinator's rows say accepted from validation on, while
  the contribution waits for a version (it may still be rejected there, as late) and while its
  version is journalled but not published. Those are counted apart, as `accepted_unpublished`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from krill.db.models import (
    Commit,
    Contribution,
    ContributionStatus,
    Eval,
    Metric,
    Participant,
    ParticipantRole,
    RewardKind,
    Run,
    Slash,
    Verdict,
    Version,
)
from krill.explorer.paging import NotFound

MAX_SERIES = 2000
ROLE_NAMES = {int(r): r.name.lower() for r in ParticipantRole}


def amount(value: int | None) -> str | None:
    """A uint256 token amount as its JSON spelling (decimal string of base units)."""
    return None if value is None else str(int(value))


def run_json(run: Run) -> dict[str, Any]:
    return {"run_id": run.run_id, "coordinator": run.coordinator, "base_manifest_digest": run.base_manifest_digest,
            "max_staleness": run.max_staleness, "attestation_quorum": run.attestation_quorum,
            "slash_fraction_bps": run.slash_fraction_bps, "verifier_bounty_bps": run.verifier_bounty_bps,
            "check_probability_ppm": run.check_probability_ppm,
            "challenge_window_blocks": run.challenge_window_blocks,
            "reward_per_version": amount(run.reward_per_version), "reward_pool": amount(run.reward_pool),
            "funded_total": amount(run.funded_total), "latest_version": run.latest_version,
            "created_block": run.created_block, "created_tx": run.created_tx}


def run_row(r: Run) -> dict[str, Any]:
    return {"run_id": r.run_id, "latest_version": r.latest_version, "created_block": r.created_block}


def runs_stmt():
    """Every run the index knows, newest first."""
    return select(Run).order_by(Run.created_block.desc(), Run.run_id)


def recent_runs(session: Session, limit: int = 20) -> list[dict[str, Any]]:
    return [run_row(r) for r in session.scalars(runs_stmt().limit(limit))]


def resolve_run(session: Session, run_id: str | None) -> Run:
    """The run asked for, or the most recently created one."""
    if run_id is not None:
        run = session.get(Run, run_id)
        if run is None:
            raise NotFound(f"no run {run_id} in the index")
        return run
    run = session.scalars(select(Run).order_by(Run.created_block.desc(), Run.run_id).limit(1)).first()
    if run is None:
        raise NotFound("the index holds no run yet: start a coordinator (or `krill index sync`) and reload")
    return run


def eval_accuracy(session: Session, run_id: str, versions: list[int] | None = None) -> dict[int, dict[str, Any]]:
    """Per version, its eval-split evaluation (the first task by name when several were evaluated)."""
    stmt = select(Eval).where(Eval.run_id == run_id, Eval.split == "eval")
    if versions is not None:
        stmt = stmt.where(Eval.version.in_(versions))
    out: dict[int, dict[str, Any]] = {}
    for e in session.scalars(stmt.order_by(Eval.version, Eval.task)):
        out.setdefault(e.version, {"task": e.task, "n": e.n, "correct": e.correct, "accuracy": e.accuracy})
    return out


def series(session: Session, run_id: str) -> list[dict[str, Any]]:
    """Per published version (the last MAX_SERIES): contributions, reward, accuracy, throughput."""
    metrics = session.scalars(select(Metric).where(Metric.run_id == run_id).order_by(Metric.version.desc())
                              .limit(MAX_SERIES)).all()[::-1]
    evals = eval_accuracy(session, run_id)
    by_version: dict[int, dict[str, Any]] = {}
    for m in metrics:
        rate = m.sampled_tokens / m.wall_seconds if m.sampled_tokens is not None and m.wall_seconds else None
        by_version[m.version] = {"version": m.version, "accepted": m.accepted, "rejected": m.rejected,
                                 "mean_reward": m.mean_reward, "mean_staleness": m.mean_staleness,
                                 "sampled_tokens": m.sampled_tokens, "wall_seconds": m.wall_seconds,
                                 "tokens_per_s": rate, "accuracy": None}
    first = metrics[0].version if metrics else None
    for version, e in evals.items():
        if first is not None and version < first and version != 0:
            continue
        point = by_version.setdefault(version, {"version": version, "accepted": None, "rejected": None,
                                                "mean_reward": None, "mean_staleness": None, "sampled_tokens": None,
                                                "wall_seconds": None, "tokens_per_s": None})
        point["accuracy"] = e["accuracy"]
    return [by_version[v] for v in sorted(by_version)]


CONTRIBUTION_COUNTS = (*(s.value for s in ContributionStatus), "accepted_unpublished")


def contribution_counts(session: Session, *where, by=None) -> dict[Any, dict[str, int]]:
    """{key: {status: count}} of the coordinator's contributions matching `where`, keyed by the column
    `by` (None: one entry, under None); accepted ones not in a published version's record are
    `accepted_unpublished` (see the module docstring)."""
    published = Contribution.aggregated_version <= Run.latest_version
    keys = [] if by is None else [by]
    rows = session.execute(select(*keys, Contribution.status, published, func.count())
                           .join(Run, Run.run_id == Contribution.run_id).where(*where)
                           .group_by(*keys, Contribution.status, published))
    counts: dict[Any, dict[str, int]] = {}
    for row in rows:
        k, (status, in_published, n) = (row[0] if keys else None), row[-3:]
        name = "accepted_unpublished" if status == ContributionStatus.ACCEPTED and not in_published else status.value
        entry = counts.setdefault(k, dict.fromkeys(CONTRIBUTION_COUNTS, 0))
        entry[name] += int(n)
    return counts


def _count(session: Session, stmt) -> int:
    return int(session.scalar(stmt) or 0)


def totals(session: Session, run_id: str) -> dict[str, Any]:
    """Counts and sums over the whole run (stake totals over every participant of the deployment)."""
    contributions = contribution_counts(session, Contribution.run_id == run_id).get(
        None, dict.fromkeys(CONTRIBUTION_COUNTS, 0))
    tokens, seconds = session.execute(select(func.sum(Metric.sampled_tokens), func.sum(Metric.wall_seconds))
                                      .where(Metric.run_id == run_id)).one()
    tokens, seconds = int(tokens or 0), float(seconds or 0.0)  # PostgreSQL sums integers as Decimal
    commits_of_run = select(Commit.commit_id).where(Commit.run_id == run_id)
    stake: dict[str, dict[str, Any]] = {}
    # Credits are summed from each participant's running totals, not from the (long) rewards table.
    rewards = {RewardKind.REWARD.value: 0, RewardKind.BOUNTY.value: 0, RewardKind.CLAIM.value: 0}
    for role, staked, unbonding, jailed, credited, bounties, claimed in session.execute(
            select(Participant.role, Participant.staked, Participant.unbonding, Participant.jailed,
                   Participant.rewards_credited, Participant.bounties_credited, Participant.claimed)):
        rewards[RewardKind.REWARD.value] += credited
        rewards[RewardKind.BOUNTY.value] += bounties
        rewards[RewardKind.CLAIM.value] += claimed
        entry = stake.setdefault(ROLE_NAMES.get(role, str(role)), {"participants": 0, "staked": 0, "unbonding": 0,
                                                                   "jailed": 0})
        entry["participants"] += 1
        entry["staked"] += staked
        entry["unbonding"] += unbonding
        entry["jailed"] += int(bool(jailed))
    for entry in stake.values():
        entry["staked"], entry["unbonding"] = amount(entry["staked"]), amount(entry["unbonding"])
    slashed = [a for (a,) in session.execute(select(Slash.amount).where(Slash.commit_id.in_(commits_of_run)))]
    return {
        "versions": _count(session, select(func.count()).select_from(Version).where(Version.run_id == run_id)),
        "commits": _count(session, select(func.count()).select_from(Commit).where(Commit.run_id == run_id)),
        "contributions": contributions,
        "verdicts": _count(session, select(func.count()).select_from(Verdict).where(
            Verdict.commit_id.in_(commits_of_run))),
        "failed_verdicts": _count(session, select(func.count()).select_from(Verdict).where(
            Verdict.commit_id.in_(commits_of_run), Verdict.ok.is_(False))),
        "slashes": len(slashed), "slashed_amount": amount(sum(slashed)),
        "sampled_tokens": tokens, "train_seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds else None,
        "stake": stake,
        "rewards": {k: amount(v) for k, v in rewards.items()},
    }


def overview(session: Session, run: Run) -> dict[str, Any]:
    out = run_json(run)
    # a coordinator that never staked has no participant page: the overview shows its address unlinked
    out["coordinator_indexed"] = session.get(Participant, run.coordinator) is not None
    return {"run": out, "runs": recent_runs(session), "series": series(session, run.run_id),
            "totals": totals(session, run.run_id)}
