"""Turn a replay into a verdict: the evidence document in the store, then the attestation on-chain.

Design decisions:
- Evidence first, attestation second: the digest on-chain must always name a document anyone can
  fetch. The document is a pinned raw block, so its CID follows from the attested digest.
- The contract is the last word on "once per verifier": an `AttestationDuplicate` revert means an
  earlier run of this verifier attested (crashed before recording it), which is success, and the
  chain's verdict is what gets recorded. The estimate that raises it runs against the pending block
  and the chain's verdict is read at the latest one: when the earlier attestation is only pending (a
  try whose receipt came too late), there is no verdict to record yet, and `AttestationUnsettled`, a
  passing fault, has the loop look again later (our own `ok` is never assumed: the pending
  transaction may still be dropped). `AttestationWindowClosed` means the work came too late:
  the commit is recorded as missed, nothing is lost on-chain, unless an earlier try of ours landed
  in the window after all (the contract checks the window before the duplicate, so a retry sent
  after the window names the window, not the duplicate): that attestation is the verdict recorded. `AttestationLimitReached` means the
  contract already holds its cap of verdicts with this outcome (passes and failures are capped
  separately, so a failure always has room until 32 failures are in): also recorded as missed,
  with that reason. Other reverts (for instance this
  verifier is no longer eligible) are not tolerated: they surface to the user.
- A transaction that passed its estimate can still fail once mined (the window closed, or the cap
  filled, in between). `krill.chain.tx` replays it to recover the revert, and where no replay
  reverts it raises a `ContractRevert` that names no Solidity error (`error_name` "Revert"). That
  one is settled by what the chain shows now: our
  attestation there (an earlier try was mined first) is the verdict; a window no transaction can
  still land in is `window_closed`; otherwise it is `AttestationUnsettled`, and the retry's estimate
  names what changed (a full cap, lost eligibility) or it attests.
- Passing faults propagate (a store that fails the evidence upload; `ReceiptTimeout`, a
  transaction whose receipt never came; a web3 `TimeExhausted`): the loop retries the commit (`loop.transient_faults`)
  with the verdict it already has, and asks the contract first whether this verifier's
  attestation landed after all, so a retry never attests twice (and if one is sent anyway, it
  reverts with `AttestationDuplicate`, which is success above). The evidence document is the same
  bytes on every try, so its CID and digest are too.
"""

from __future__ import annotations

from dataclasses import dataclass

from krill.chain import errors as E
from krill.errors import ContractRevert, KrillError
from krill.protocol.evidence import Evidence, publish_evidence
from krill.verifier import select
from krill.verifier.replay import ReplayResult
from krill.verifier.state import Job


class AttestationUnsettled(KrillError):
    """Whether this verifier's attestation counts is not on-chain yet: a passing fault, retried."""


@dataclass(frozen=True)
class Who:
    """The verifier and where it attests."""

    chain_id: int
    contract: str
    address: str
    key: bytes
    engine: str


@dataclass(frozen=True)
class Attestation:
    """What happened to one verdict."""

    status: str  # "attested" | "duplicate" | "window_closed" | "limit_reached"
    ok: bool
    evidence_cid: str | None
    tx_hash: str | None


def build_evidence(spec, who: Who, job: Job, randomness: bytes, result: ReplayResult) -> Evidence:
    from krill import __version__
    from krill.store.cid import digest_to_cid

    return Evidence(chain_id=who.chain_id, contract=who.contract.lower(), run_id=spec.run_id.hex(),
                    commit_id=job.commit_id, header_digest=job.header_digest.hex(),
                    header_cid=digest_to_cid(job.header_digest), worker=job.worker.lower(),
                    model_version=job.version, behaviour_version=result.behaviour_version, nonce=job.nonce,
                    verifier=who.address.lower(), verifier_key=who.key.hex(), randomness=randomness.hex(),
                    gradient_shard=result.gradient_shard, ok=result.ok, reason=result.reason,
                    failed_field=None if result.failed_field is None else result.failed_field[:200],
                    checks=result.checks, engine=who.engine, krill_version=__version__)


def attest(chain, store, spec, who: Who, job: Job, randomness: bytes, result: ReplayResult) -> Attestation:
    """Publish the evidence and attest; tolerate only the reverts that mean 'already done' or 'too late'."""
    evidence = build_evidence(spec, who, job, randomness, result)
    cid, digest = publish_evidence(store, evidence)
    try:
        receipt = chain.attest(job.commit_id, result.ok, digest)
    except E.AttestationDuplicate as exc:
        earlier = chain.attestation_of(job.commit_id, who.address)
        if not earlier.exists:  # ours is in the pending block only: its verdict is not on-chain yet
            raise AttestationUnsettled(f"this verifier's attestation of commit {job.commit_id} is pending, "
                                       "not mined yet") from exc
        return Attestation("duplicate", bool(earlier.ok), None, None)
    except E.AttestationWindowClosed:
        # The contract checks the window before the duplicate: an earlier try of ours (its receipt never
        # came) may have been mined in the window all the same, and then that is the verdict.
        earlier = chain.attestation_of(job.commit_id, who.address)
        if earlier.exists:
            return Attestation("duplicate", bool(earlier.ok), None, None)
        return Attestation("window_closed", result.ok, cid, None)
    except E.AttestationLimitReached:  # 32 verifiers already attested this outcome: ours adds nothing
        return Attestation("limit_reached", result.ok, cid, None)
    except ContractRevert as exc:
        if exc.error_name != ContractRevert.error_name:
            raise  # a revert naming its Solidity error, not tolerated above (this verifier is not eligible, ...)
        return _settle_mined_failure(chain, spec, who, job, result, cid, exc)
    return Attestation("attested", result.ok, cid, receipt.transaction_hash)


def _settle_mined_failure(chain, spec, who: Who, job: Job, result: ReplayResult, cid: str,
                          exc: ContractRevert) -> Attestation:
    """What an attestation that was mined but failed, with no reason the replay could name, comes to."""
    earlier = chain.attestation_of(job.commit_id, who.address)
    if earlier.exists:  # an earlier try of ours was mined first
        return Attestation("duplicate", bool(earlier.ok), None, None)
    if not select.can_still_attest(chain.block_number(), job.commit_block, spec.chain.challenge_window_blocks):
        return Attestation("window_closed", result.ok, cid, None)
    raise AttestationUnsettled(f"{exc}; the retry's estimate names what changed") from exc
