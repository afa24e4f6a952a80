"""Judge a slash the coordinator declined: replay the commit with the arbiter's checks, from public data.

Design decisions:
- Only the run's coordinator can slash, and an honest one declines a failing quorum its own replay
  refutes (`coordinator/confirm.py`): any staked verifier may attest, so a quorum can be a lie. A
  dishonest coordinator could decline the same way to shield its own worker. The audit tells the
  two apart by running the coordinator's replay itself: the payload fetched by the commit's
  on-chain digest and validated in the coordinator's context (`krill.audit.entries.fetch_payload`),
  then every check of `krill.protocol.arbiter`, with the verifiers' default tolerances.
- Three answers: the replay passes every check (the refusal is justified: the verdicts were
  false), a check fails or the payload does not validate (the commit should have been slashed), or
  the audit could not read the payload or a version it needs (it cannot judge, and says why; the
  coordinator slashes content that stayed unavailable past its deadline, which the audit cannot
  vouch for either way).
- A commit is due at exactly one version (`krill.audit.ledger`), so `--all` replays each declined
  commit once: a teacher-forced pass, a re-sample and a gradient pass per shard.
"""

from __future__ import annotations

from dataclasses import dataclass

from krill.audit.source import DATA_ERRORS, AuditSource, data_fault
from krill.errors import PayloadError


@dataclass(frozen=True)
class Judgement:
    """The audit's replay of an unslashed commit at quorum: justified (True), not (False), or unknown (None)."""

    justified: bool | None
    detail: str


def judge_refusal(source: AuditSource, commit_id: int) -> Judgement:
    """Whether declining to slash `commit_id` is justified by replaying it."""
    from krill.audit.entries import fetch_payload
    from krill.protocol.arbiter import arbitrate, verdict

    commit = source.commit(commit_id)
    try:
        contribution = fetch_payload(source, commit.worker.lower(), int(commit.version), bytes(commit.header_digest),
                                     int(commit.nonce))
    except PayloadError as exc:
        return Judgement(False, f"its payload does not validate: {type(exc).__name__}: {exc}")
    except DATA_ERRORS as exc:
        return Judgement(None, f"cannot replay it: {data_fault(exc)}")
    try:
        failed, detail = verdict(arbitrate(source.spec, source.task, source.tokenizer, contribution, source.state))
    except DATA_ERRORS as exc:
        return Judgement(None, f"cannot replay it: {data_fault(exc)}")
    if failed:
        return Judgement(False, f"the replay fails it at {detail}")
    return Judgement(True, "the replay passes every check (the failing verdicts were false)")
