"""Turn a replay into a verdict: the evidence document in the store, then the attestation on-chain.

Design decisions:
- Evidence first, attestation second: the digest on-chain must always name a document anyone can
  fetch. The document is a pinned raw block, so its CID follows from the attested digest.
- The contract is the last word on "once per verifier": an `AttestationDuplicate` revert means an
  earlier run of this verifier attested (crashed before recording it), which is success, and the
  chain's verdict is what gets recorded. `AttestationWindowClosed` means the work came too late:
  the commit is recorded as missed, nothing is lost on-chain. `AttestationLimitReached` means the
  contract already holds its cap of verdicts with this outcome (passes and failures are capped
  separately, so a failure always has room until 32 failures are in): also recorded as missed,
  with that reason. Other reverts (for instance this
  verifier is no longer eligible) are not tolerated: they surface to the user.
- Passing faults propagate (a store that fails the evidence upload; web3's `TimeExhausted`, a
  transaction whose receipt never came): the loop retries the commit (`loop.transient_faults`)
  with the verdict it already has, and asks the contract first whether this verifier's
  attestation landed after all, so a retry never attests twice (and if one is sent anyway, it
  reverts with `AttestationDuplicate`, which is success above). The evidence document is the same
  bytes on every try, so its CID and digest are too.
"""

from __future__ import annotations

from dataclasses import dataclass

from krill.chain import errors as E
from krill.verifier.evidence import Evidence, publish_evidence
from krill.verifier.replay import ReplayResult
from krill.verifier.state import Job


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
    except E.AttestationDuplicate:
        earlier = chain.attestation_of(job.commit_id, who.address)
        return Attestation("duplicate", bool(earlier.ok), None, None)
    except E.AttestationWindowClosed:
        return Attestation("window_closed", result.ok, cid, None)
    except E.AttestationLimitReached:  # 32 verifiers already attested this outcome: ours adds nothing
        return Attestation("limit_reached", result.ok, cid, None)
    return Attestation("attested", result.ok, cid, receipt.transaction_hash)
