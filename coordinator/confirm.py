"""Confirm a failing quorum by replay before slashing: the coordinator is the arbiter the contract names.

Design decisions:
- The contract lets only the run's coordinator slash, and only once failing attestations reach
  the run's quorum; but any staked verifier may attest on any commit (selection is not enforced
  on-chain, so that other verifiers can corroborate a failure), so a quorum alone proves
  nothing: one staked account could fail an honest commit and collect a bounty from its stake.
  Before slashing, the coordinator replays the checks itself, cheapest first, with the
  verifiers' default tolerances (`krill.calibration.table.verifier_tolerances`): the payload
  (digest, context, nonce, signature, files, codec), rollout staleness, assignment and rewards,
  the resample at the behaviour version, and the gradient of every shard the contribution
  carries (not only the one a verifier drew). It slashes only when one of them fails.
- A quorum the replay refutes is recorded (`Refutation`, the coordinator's own table) with the
  checks that passed, never retried, and its failing verdicts do not count against the worker's
  trust (`krill.coordinator.standing`). The commit ids stay public in the index (fail count at quorum, not
  slashed), so anyone can replay them, and `krill audit` lists them.
- Content the coordinator cannot fetch is the worker's fault only once ingest rejected it as
  unavailable (after the run's deadline); before that the decision waits for the next pass.
- A replay is a teacher-forced pass, a re-sample and one gradient pass per shard: a few hundred
  milliseconds on the default model, paid once per commit at quorum (rare: the first slash
  jails the worker, and a jailed worker's later commits are rejected unchecked).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import BigInteger, Float, String, Text, select
from sqlalchemy.orm import Mapped, mapped_column

from krill.coordinator.journal import CoordinatorBase
from krill.db.models import Commit, Contribution, RejectionCode
from krill.errors import ContentNotFoundError, IntegrityError, PayloadError
from krill.rl.staleness import rollout_lag_problem


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


def confirm_failure(ctx, commit_id: int) -> Confirmation:
    """Replay `commit_id`'s checks; confirmed when one fails."""
    from krill.calibration.table import verifier_tolerances
    from krill.coordinator.ingest import CommitView, cheap_replay, fetch_and_validate
    from krill.protocol.work import check_gradient, check_resample

    with ctx.db.session() as s:
        c = s.get(Commit, commit_id)
        row = s.get(Contribution, commit_id)
    if c is None:
        return Confirmation(None, "not in the index yet")
    if c.worker_key is None:
        return Confirmation(True, "the worker had no staked Ed25519 key when it committed")
    view = CommitView(commit_id, c.worker, int(c.version), c.header_digest, c.worker_key, None, False, int(c.nonce))
    try:
        contribution = fetch_and_validate(ctx, view)
    except PayloadError as exc:
        return Confirmation(True, f"payload: {type(exc).__name__}: {exc}")
    except (ContentNotFoundError, IntegrityError) as exc:
        if row is not None and row.reason_code == RejectionCode.UNAVAILABLE:
            return Confirmation(True, f"content unavailable after the deadline: {row.reason}")
        return Confirmation(None, f"content not fetched yet ({type(exc).__name__}); deciding on a later pass")
    header, batch = contribution.header, contribution.rollouts
    lag = rollout_lag_problem(header.model_version, header.behaviour_version, ctx.spec.staleness.max_staleness)
    if lag is not None:
        return Confirmation(True, lag)
    cheap = cheap_replay(ctx, contribution)
    if cheap is not None:
        return Confirmation(True, cheap.reason)
    verify = verifier_tolerances(ctx.spec, None)
    tok = ctx.tokenizer
    outcomes = [check_resample(ctx.spec, ctx.task, tok, header, batch, _engine(ctx, header.behaviour_version, tok),
                               verify)]
    if outcomes[0].ok:
        learner_state = ctx.state(header.model_version)
        learner = _model(ctx, header.model_version)
        outcomes += [check_gradient(ctx.spec, header, batch, grad.values, shard, learner, learner_state,
                                    tok.pad_token_id, verify) for shard, grad in sorted(contribution.gradients.items())]
    failed = [o for o in outcomes if not o.ok]
    if failed:
        return Confirmation(True, f"{failed[0].name}: {failed[0].detail}")
    return Confirmation(False, "; ".join(f"{o.name}: {o.detail}" for o in outcomes)[:2000])


def _model(ctx, version: int):
    from krill.protocol.policy import build_model

    return build_model(ctx.state(version))


def _engine(ctx, version: int, tok):
    from krill.rl.engine.hf import HFEngine

    return HFEngine(_model(ctx, version), eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, version=version)


def refuted(session, run_id: str) -> set[int]:
    """Commit ids of `run_id` whose failing quorum was refuted."""
    return set(session.scalars(select(Refutation.commit_id).where(Refutation.run_id == run_id)))


def record_refutation(ctx, commit_id: int, worker: str, detail: str, now: float) -> None:
    with ctx.db.write() as s:
        if s.get(Refutation, (ctx.run_hex, commit_id)) is None:
            s.add(Refutation(run_id=ctx.run_hex, commit_id=commit_id, worker=worker, detail=detail, decided_at=now))
