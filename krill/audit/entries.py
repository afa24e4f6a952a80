"""One accepted contribution of an aggregation record, checked against chain + store.

Design decisions:
- Four checks per accepted entry, cheapest first, each a row of the report:
  * `on-chain`: the commit exists for this run and names the entry's worker, learner version and
    header digest (the record cannot credit work nobody committed);
  * `weight`: staleness = version - 1 - learner version within S_max, trust a finite number in
    [0, 1] at or above the run's floor, and weight = trust x staleness weight of the run spec.
    Trust itself is the coordinator's claim (a Beta posterior over verdicts it indexed); the audit
    reports it and checks only its range;
  * `payload`: the header and every file it names are fetched by CID and validated exactly as a
    coordinator does (`validate_contribution`: digest, context, staked Ed25519 key, file digests,
    decoders, mask lengths of the learner version); its behaviour version and gradient shards are
    the entry's;
  * `applied once`: no earlier version in the staleness window accepted the same commit.
- The submission fed to the fold carries the record's weight (`float(entry.weight)`), exactly the
  float64 the coordinator used; a weight that is consistent but not the one folded shows up as
  digests that differ.
"""

from __future__ import annotations

import math

from krill.audit.report import AuditReport, EntryFigures
from krill.audit.source import AuditSource
from krill.errors import ModelError, PayloadError, StoreError
from krill.protocol.record import AcceptedEntry
from krill.protocol.step import Submission
from krill.rl.staleness import StalenessError, staleness_weight

WEIGHT_REL_TOL = 1e-12


def _float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def check_on_chain(source: AuditSource, entry: AcceptedEntry) -> list[str]:
    commit = source.chain.commit_of(entry.commit_id)
    if int(commit.worker, 16) == 0:
        return ["no such commit on-chain"]
    problems = []
    if commit.run_id != source.spec.run_id:
        problems.append(f"committed to run {commit.run_id.hex()[:16]}…, not this run")
    if commit.worker.lower() != entry.worker:
        problems.append(f"committed by {commit.worker.lower()}, the record says {entry.worker}")
    if commit.version != entry.model_version:
        problems.append(f"committed at version {commit.version}, the record says {entry.model_version}")
    if commit.header_digest.hex() != entry.header_digest:
        problems.append(f"on-chain header digest {commit.header_digest.hex()[:16]}…, the record says "
                        f"{entry.header_digest[:16]}…")
    return problems


def check_weight(source: AuditSource, version: int, entry: AcceptedEntry) -> tuple[list[str], float, float]:
    spec, problems = source.spec, []
    staleness = version - 1 - entry.model_version
    if entry.staleness != staleness:
        problems.append(f"staleness {entry.staleness}, expected {version} - 1 - {entry.model_version} = {staleness}")
    trust, weight = _float(entry.trust), _float(entry.weight)
    if trust is None or not 0.0 <= trust <= 1.0:
        problems.append(f"trust {entry.trust!r} is not a number in [0, 1]")
    elif trust < spec.trust.floor:
        problems.append(f"trust {trust!r} is below the run's floor {spec.trust.floor!r}")
    if weight is None or weight < 0.0:
        problems.append(f"weight {entry.weight!r} is not a finite non-negative number")
    try:
        sw = staleness_weight(staleness, spec.staleness)
    except StalenessError as exc:
        problems.append(str(exc))
        sw = None
    if not problems and not math.isclose(weight, trust * sw, rel_tol=WEIGHT_REL_TOL, abs_tol=0.0):
        problems.append(f"weight {weight!r} is not trust x staleness weight = {trust!r} x {sw!r} = {trust * sw!r}")
    return problems, (trust if trust is not None else math.nan), (weight if weight is not None else math.nan)


def fetch_contribution(source: AuditSource, entry: AcceptedEntry):
    """The validated contribution of `entry` (raises StoreError / PayloadError / ModelError)."""
    from krill.payload.contribution import ExpectedContext, validate_contribution
    from krill.payload.header import decode_header
    from krill.store.cid import digest_to_cid

    spec, store = source.spec, source.store
    digest = bytes.fromhex(entry.header_digest)
    header_bytes = store.get(digest_to_cid(digest), max_bytes=spec.limits.max_header_bytes)
    header = decode_header(header_bytes, spec.limits, verify=False)
    files = {name: store.get(ref.cid, max_bytes=ref.size, sha256=bytes.fromhex(ref.sha256))
             for name, ref in header.files.items()}
    learner = source.state(entry.model_version)
    context = ExpectedContext(run_id=spec.run_id.hex(), chain_id=source.chain_id, contract=source.contract,
                              worker=entry.worker, ed25519_key=source.staked_key(entry.worker).hex(),
                              model_version=entry.model_version, manifest_cid=learner.manifest_cid, digest=digest)
    return validate_contribution(header_bytes, files, spec.limits, context, source.grad_lengths(entry.model_version))


def check_payload(source: AuditSource, entry: AcceptedEntry):
    """(problems, contribution or None)."""
    try:
        contribution = fetch_contribution(source, entry)
    except PayloadError as exc:
        where = f" ({exc.field})" if getattr(exc, "field", None) else ""
        return [f"payload rejected{where}: {exc}"], None
    except (StoreError, ModelError) as exc:
        return [f"not available: {exc}"], None
    problems = []
    header = contribution.header
    if header.behaviour_version != entry.behaviour_version:
        problems.append(f"header behaviour version {header.behaviour_version}, the record says {entry.behaviour_version}")
    if sorted(contribution.gradients) != sorted(entry.shards):
        problems.append(f"header carries shards {sorted(contribution.gradients)}, the record says {sorted(entry.shards)}")
    return problems, contribution


def check_applied_once(source: AuditSource, version: int, entry: AcceptedEntry) -> list[str]:
    """Earlier versions that could have accepted the commit (model_version + 1 .. version - 1) did not."""
    for earlier in range(entry.model_version + 1, version):
        try:
            record = source.record(earlier)
        except (StoreError, PayloadError, ModelError) as exc:
            return [f"record of version {earlier} unavailable: {exc}"]
        if any(a.commit_id == entry.commit_id for a in record.accepted):
            return [f"already applied in version {earlier}"]
    return []


def audit_entry(source: AuditSource, version: int, entry: AcceptedEntry, report: AuditReport) -> Submission | None:
    """Check one accepted entry into `report`; its submission when its payload could be validated."""
    name = f"commit {entry.commit_id}"
    problems = check_on_chain(source, entry)
    report.add(f"{name} on-chain", not problems,
               "; ".join(problems) or f"worker {entry.worker}, version {entry.model_version}, digest matches")
    problems, trust, weight = check_weight(source, version, entry)
    report.add(f"{name} weight", not problems, "; ".join(problems)
               or f"staleness {entry.staleness}, trust {trust:.4g} (coordinator's), weight {weight:.4g}")
    report.entries.append(EntryFigures(entry.commit_id, entry.worker, entry.model_version, entry.behaviour_version,
                                       entry.staleness, trust, weight, list(entry.shards)))
    problems, contribution = check_payload(source, entry)
    ok = report.add(f"{name} payload", not problems, "; ".join(problems) or
                    f"signed by the staked key, {len(contribution.gradients)} shard gradients, "
                    f"{contribution.rollouts.n_sequences} rollouts")
    problems = check_applied_once(source, version, entry)
    report.add(f"{name} applied once", not problems, "; ".join(problems) or "not accepted by an earlier version")
    if contribution is None or not ok or math.isnan(weight):
        return None
    return entry_submission(entry, contribution)


def entry_submission(entry: AcceptedEntry, contribution) -> Submission:
    """The fold's input for an accepted entry: its validated gradients with the record's weight."""
    values = {s: g.values for s, g in contribution.gradients.items()}
    return Submission(commit_id=entry.commit_id, weight=float(entry.weight), model_version=entry.model_version,
                      values=values)
