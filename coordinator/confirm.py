"""Confirm a failing quorum by replay before slashing: the coordinator is the arbiter the contract names.

Design decisions:
- The contract lets only the run's coordinator slash, and only once failing attestations reach
  the run's quorum; but any staked verifier may attest on any commit (selection is not enforced
  on-chain, so that other verifiers can corroborate a failure), so a quorum alone proves
  nothing: one staked account could fail an honest commit and collect a bounty from its stake.
  Before slashing, the coordinator validates the payload as at ingest (digest, context, nonce,
  signature, files, codec) and replays every check (`krill.protocol.arbiter`: rollout staleness,
  assignment, rewards, the resample at the behaviour version, the gradient of every shard the
  contribution carries), with the verifiers' default tolerances. It slashes only when one fails.
- A quorum the replay refutes is recorded (`Refutation`, the coordinator's own table) with the
  checks that passed, never retried, and its failing verdicts do not count against the worker's
  trust (`krill.coordinator.standing`). The commit ids stay public (fail count at quorum, not
  slashed), and `krill audit` replays them with the same arbiter to judge the refusal.
- Content the coordinator cannot fetch is the worker's fault once the commit is older than the
  run's deadline (`spec.version.deadline_s`, by its block's time), as at ingest, or once its
  challenge window has closed (the verifiers waited all of it; the worker's stake is released
  `unbondingBlocks` after that, whatever the deadline's wall-clock length); before that the
  decision waits for a later pass. The age is the commit's own, not ingest's reason: ingest
  rejects most commits of missing content as stale or jailed before their deadline, and those
  were never slashed. A commit ingest once found unavailable is still fetched and replayed: its
  content may have come since, and a false quorum on it is refuted like any other.
- The content is fetched on the fetch threads (`ctx.fetcher`), and a pass waits at most
  `PASS_WAIT_S` for it: on a networked store a fetch of content nobody has waits out the store's
  timeout (60 s on Kubo), and N such commits at quorum held every pass N x 60 s.
- Those fetches have a lane of their own per worker (`confirm:<worker>`), not the worker's ingest
  lane: queued behind ingest's fetches of the same worker's other commits of content nobody has,
  a confirmation waited one store timeout per such commit, so a worker that withheld one commit
  and committed a few more junk digests pushed its slash past its release block (the start check,
  `krill.coordinator.margin`, counts one timeout). A worker at quorum holds one more thread.
  That lane's prefix (`krill.store.fetcher.PRIORITY_PREFIX`) runs it on the fetcher's priority
  threads, which ingest's and the other workers' fetches never hold.
- A replay is a teacher-forced pass, a re-sample and one gradient pass per shard: a few hundred
  milliseconds on the default model, paid once per commit at quorum (rare: the first slash
  jails the worker, and a jailed worker's later commits are rejected unchecked).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import BigInteger, Float, String, Text, select
from sqlalchemy.orm import Mapped, mapped_column

from krill.coordinator.journal import CoordinatorBase
from krill.db.models import Commit
from krill.errors import ContentNotFoundError, IntegrityError, PayloadError, StoreError, StoreUnavailableError
from krill.protocol.arbiter import arbitrate, verdict


class Refutation(CoordinatorBase):
    """A commit whose failing quorum the coordinator's replay refuted: not slashed."""

    __tablename__ = "coordinator_refutations"

    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    commit_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    worker: Mapped[str] = mapped_column(String(42), index=True)
    detail: Mapped[str] = mapped_column(Text)
    decided_at: Mapped[float] = mapped_column(Float)


@dataclass(frozen=True)
class Confirmation:
    """The replay's verdict on a failing quorum: confirmed (slash), refuted, or undecided (None: wait)."""

    confirmed: bool | None
    detail: str


def confirm_failure(ctx, commit_id: int, now: float) -> Confirmation:
    """Replay `commit_id`'s checks; confirmed when one fails."""
    from krill.coordinator.ingest import CommitView, fetched_contribution, submit_fetch
    from krill.db.models import ChainEventRow
    from krill.store.fetcher import PASS_WAIT_S, PRIORITY_PREFIX
    from krill.store.unixfs import ObjectTooLargeError

    with ctx.db.session() as s:
        c = s.get(Commit, commit_id)
        block_time = s.scalar(select(ChainEventRow.block_time).where(
            ChainEventRow.kind == "Committed", ChainEventRow.commit_id == commit_id))
    if c is None:
        return Confirmation(None, "not in the index yet")
    if c.worker_key is None:
        return Confirmation(True, "the worker had no staked Ed25519 key when it committed")
    view = CommitView(commit_id, c.worker, int(c.version), c.header_digest, c.worker_key, block_time, False,
                      int(c.nonce))
    key = ("confirm", commit_id)  # apart from ingest's own fetch of the commit, keyed by its id
    if submit_fetch(ctx, view, key, lane=f"{PRIORITY_PREFIX}{c.worker}"):
        ctx.fetcher.wait([key], PASS_WAIT_S)
    fetched = ctx.fetcher.take(key)
    if fetched is None:
        return Confirmation(None, "content still being fetched; deciding on a later pass")
    try:
        contribution = fetched_contribution(ctx, fetched)
    except PayloadError as exc:
        return Confirmation(True, f"payload: {type(exc).__name__}: {exc}")
    except ObjectTooLargeError as exc:  # larger than the size the worker signed
        return Confirmation(True, f"payload: too large: {exc}")
    except (ContentNotFoundError, IntegrityError) as exc:
        waited = None if block_time is None else now - block_time
        if waited is not None and waited > ctx.spec.version.deadline_s:
            return Confirmation(True, f"content still missing {waited:.0f} s after the commit (deadline "
                                      f"{ctx.spec.version.deadline_s:g} s): {type(exc).__name__}: {exc}")
        window_end = int(c.block_number) + ctx.spec.chain.challenge_window_blocks
        if ctx.chain.block_number() > window_end:
            return Confirmation(True, f"content still missing after the commit's challenge window closed (block "
                                      f"{window_end}): {type(exc).__name__}: {exc}")
        return Confirmation(None, f"content not fetched yet ({type(exc).__name__}); deciding on a later pass")
    except StoreUnavailableError:
        raise  # the loop backs off
    except StoreError as exc:  # this coordinator's store failing (a 5xx): decide on a later pass
        return Confirmation(None, f"store fault ({exc}); deciding on a later pass")
    failed, detail = verdict(arbitrate(ctx.spec, ctx.task, ctx.tokenizer, contribution, ctx.state))
    return Confirmation(failed, detail)


def refuted(session, run_id: str) -> set[int]:
    """Commit ids of `run_id` whose failing quorum was refuted."""
    return set(session.scalars(select(Refutation.commit_id).where(Refutation.run_id == run_id)))


def record_refutation(ctx, commit_id: int, worker: str, detail: str, now: float) -> None:
    with ctx.db.write() as s:
        if s.get(Refutation, (ctx.run_hex, commit_id)) is None:
            s.add(Refutation(run_id=ctx.run_hex, commit_id=commit_id, worker=worker, detail=detail, decided_at=now))
