"""Slash: every commit of the run whose failing attestations reached the quorum is slashed, once.

Design decisions:
- Candidates come from the index (fail_count >= the run's quorum, not slashed), and each is
  re-read from the chain before the transaction, so an index that lags never causes a revert and
  a restart never slashes twice. Should the contract still refuse for the quorum
  (`SlashQuorumNotReached`), the revert is recorded as a skip, not a crash; `SlashAlreadyDone`
  there is our own pending slash (below).
- The slash jails the worker on-chain; the index picks up `WorkerJailed` on its next pass, and
  from then on ingest and close reject that worker's contributions as `jailed`.
- A quorum is not proof: before the transaction the coordinator replays the commit
  (`krill.coordinator.confirm`) and slashes only what its own replay fails. A refuted quorum is
  recorded and reported, never slashed, and never replayed again; one the replay cannot decide
  yet (content still being fetched, or missing before the run's deadline) waits for a later pass.
- `pending` names the commits a later pass still has to slash or refute (at quorum in the index, not
  slashed, not refuted). The loop does not end at `max_versions` while there are any: the verdicts on
  the last version's contributions land while it is folded and published, and a loop that ended
  right after publishing left those slashes undone (the cheater kept its stake and its reward).
- A slash whose receipt did not come in time may still land. The retry re-reads the commit at the
  latest block (not slashed while it is pending) and sends again; that send, estimated against the
  pending block, reverts with `SlashAlreadyDone`, which was recorded as a skip: the pass went on to
  ingest with the worker not yet jailed on the chain nor in the index, so its other contributions
  could be accepted and folded. Only the run's coordinator slashes, so it is our own pending slash:
  `WritePending`, a passing fault that ends the pass before ingest (the next pass finds it landed).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select

from krill.db.models import Commit


@dataclass(frozen=True)
class SlashOutcome:
    commit_id: int
    worker: str
    amount: int | None  # None: skipped (see note)
    note: str = ""


def _at_quorum(session, ctx) -> list[tuple[int, str]]:
    """(commit id, worker) of the run's commits at the failing quorum in the index and not slashed."""
    return list(session.execute(select(Commit.commit_id, Commit.worker).where(
        Commit.run_id == ctx.run_hex, Commit.fail_count >= ctx.spec.chain.attestation_quorum,
        Commit.slashed.is_(False)).order_by(Commit.commit_id)).all())


def pending(ctx) -> list[int]:
    """Commit ids that a later `slash_due` still has to slash or refute, by the index."""
    from krill.coordinator.confirm import refuted

    with ctx.db.session() as s:
        due = _at_quorum(s, ctx)
        settled = refuted(s, ctx.run_hex) if due else set()
    return [commit_id for commit_id, _ in due if commit_id not in settled]


def slash_due(ctx, now: float | None = None) -> list[SlashOutcome]:
    """Slash every commit of the run that a quorum of verifiers failed and the coordinator's replay confirms."""
    import time

    from krill.chain import errors as ce
    from krill.chain.events import Slashed
    from krill.coordinator.confirm import confirm_failure, record_refutation, refuted
    from krill.coordinator.publish import WritePending

    now = time.time() if now is None else now
    quorum = ctx.spec.chain.attestation_quorum
    with ctx.db.session() as s:
        due = _at_quorum(s, ctx)
        settled = refuted(s, ctx.run_hex) if due else set()
    out = []
    for commit_id, worker in due:
        if commit_id in settled:
            continue
        info = ctx.chain.commit_of(commit_id)
        if info.slashed or info.fail_count < quorum:
            continue
        confirmation = confirm_failure(ctx, commit_id, now)
        if confirmation.confirmed is None:
            continue  # the replay cannot decide yet: a later pass will
        if not confirmation.confirmed:
            record_refutation(ctx, commit_id, worker, confirmation.detail, now)
            out.append(SlashOutcome(commit_id, worker, None, f"refuted by the coordinator's replay "
                                                             f"({confirmation.detail[:300]})"))
            continue
        try:
            event = ctx.chain.slash(commit_id).event(Slashed)
        except ce.SlashAlreadyDone as exc:  # not slashed at the latest block just read: ours is pending
            raise WritePending(f"commit {commit_id}: its slash is pending (not slashed at the latest block, slashed "
                               "in the pending one): an earlier send whose receipt did not come in time; waiting "
                               "for it to land") from exc
        except ce.SlashQuorumNotReached as exc:
            out.append(SlashOutcome(commit_id, worker, None, str(exc)))
            continue
        out.append(SlashOutcome(commit_id, worker, event.amount))
    return out
