"""Recompute a published version from public data and compare it with what was published.

Design decisions:
- Inputs: the version's aggregation record (located by the on-chain record digest), the parent
  version's public state (weights, optimizer states, located by the parent's on-chain digests; a
  state the coordinator did not store is replayed by `AuditSource`), the learner versions' public
  masks (derived from their momentum), and the accepted contributions (`krill.audit.entries`).
  The fold is `krill.protocol.step.fold_version`, the very function the coordinator publishes
  with, over the shards the record lists, so the same inputs give the same bits.
- Outputs compared, each a row of the report: per shard the submission count, the new shard
  file's sha256 and CID against the published manifest, the AdamW state's sha256 (and CID, at the
  versions whose states the coordinator stored) and the aggregation statistics against the
  record; then the manifest rebuilt from the recomputed shards (parent's architecture and
  tokenizer, parent CID, version number) against the manifest digest on-chain and the manifest
  CID in the record. Shards the record does not list must be the parent's, byte for byte. The
  version's published masks are compared with the ones derived from the recomputed optimizer
  states, and must be in the store as the record names them. Recomputed states that match the
  record are kept for the version, so `--all` replays nothing twice.
- Then what the chain paid and took for the version (`krill.audit.ledger`): its `settlement` against
  the record's reward split, and the `slashing` of the commits due at it. They run even when the
  recompute could not (they need only the chain and the record).
- Rejections are the coordinator's judgement: the audit checks that each names a real commit of
  the run, that no commit is both accepted and rejected, and each reason that public data can
  bear out (`krill.audit.entries.false_rejection`). That no commit is left out of every record is
  the `coverage` row (`krill.audit.coverage`). No worker may have more accepted entries than the
  run's `version.max_per_worker`.
- Faulty public data (`krill.audit.source.DATA_ERRORS`: missing content, a blob that does not decode,
  weights that cannot be folded, an id the chain cannot hold) fails the check that read it, and the
  audit goes on with what it can still check. Any other exception is a fault of the audit, not a
  finding about the version: it ends that version's audit as a failed `internal` check naming the
  exception and where it was raised, after the checks already made, and the next version is audited
  all the same. A chain outage (a `ConnectionError`) is neither, and propagates: no version can be
  audited without the chain. Content the store cannot serve, reachable or not, fails the reads it
  hit as not available: the audit cannot vouch for what it could not read.
"""

from __future__ import annotations

import hashlib
import traceback

from krill.audit.coverage import check_coverage
from krill.audit.entries import audit_entry, false_rejection
from krill.audit.ledger import audit_ledger
from krill.audit.report import AuditReport
from krill.audit.source import DATA_ERRORS, AuditSource, data_fault


def _short(text: str | None) -> str:
    return "none" if text is None else (text[:16] + "…" if len(text) > 18 else text)


def audit_version(source: AuditSource, version: int) -> AuditReport:
    """Audit published version `version` (>= 1) of the run `source` reads; raises only on a chain outage."""
    report = AuditReport(run_id=source.spec.run_id.hex(), version=version)
    try:
        info = source.version_info(version, fresh=True) if version >= 1 else None
        if report.add("published", info is not None,
                      f"manifest digest {info.manifest_digest.hex()[:16]}… at block {info.published_block}"
                      if info is not None else f"version {version} is not a published version (1..latest)"):
            _audit_into(source, version, info, report)
            audit_ledger(source, version, info, report)
            report.add("coverage", *check_coverage(source, version))
    except ConnectionError:
        raise
    except Exception as exc:  # noqa: BLE001 - recorded as a failed check: the other versions' reports must survive
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        report.add("internal", False, f"the audit itself failed: {type(exc).__name__}: {exc} "
                                      f"(at {frame.filename}:{frame.lineno}); please report this")
    return report


def _audit_into(source: AuditSource, version: int, info, report: AuditReport) -> None:
    spec = source.spec
    try:
        record = source.record(version)
    except DATA_ERRORS as exc:
        report.add("record", False, f"aggregation record unavailable or invalid: {data_fault(exc)}")
        return
    problems = []
    if record.run_id != spec.run_id.hex() or record.version != version:
        problems.append(f"names run {record.run_id[:16]}… version {record.version}")
    if record.rule != spec.rule.model_dump(mode="json"):
        problems.append(f"rule {record.rule} is not the run spec's {spec.rule.model_dump(mode='json')}")
    report.add("record", not problems, "; ".join(problems) or
               f"{len(record.accepted)} accepted, {len(record.rejected)} rejected, closed by {record.closed_by}, "
               f"rule {record.rule.get('type', '?')}")
    try:
        parent = source.state(version - 1)
    except DATA_ERRORS as exc:
        report.add("parent", False, f"version {version - 1} unavailable: {data_fault(exc)}")
        return
    ok = (record.parent_manifest_cid == parent.manifest_cid and record.parent_record_cid == parent.record_cid)
    report.add("parent", ok, f"version {version - 1} manifest {_short(parent.manifest_cid)}" if ok else
               f"record names parent manifest {_short(record.parent_manifest_cid)} / record "
               f"{_short(record.parent_record_cid)}, the chain's are {_short(parent.manifest_cid)} / "
               f"{_short(parent.record_cid)}")
    _check_entry_sets(source, record, report)
    submissions = [audit_entry(source, version, entry, report) for entry in record.accepted]
    if any(s is None for s in submissions) or not ok:
        report.add("recompute", False, "not attempted: an input above failed")
        return
    _recompute_and_compare(source, version, info, record, parent, submissions, report)


def _check_entry_sets(source: AuditSource, record, report: AuditReport) -> None:
    accepted = [a.commit_id for a in record.accepted]
    rejected = [r.commit_id for r in record.rejected]
    problems = []
    if len(set(accepted)) != len(accepted):
        problems.append("a commit is accepted twice")
    if set(accepted) & set(rejected):
        problems.append(f"commits {sorted(set(accepted) & set(rejected))} are both accepted and rejected")
    cap = source.spec.version.max_per_worker
    if cap is not None:
        per_worker: dict[str, int] = {}
        for entry in record.accepted:
            per_worker[entry.worker] = per_worker.get(entry.worker, 0) + 1
        over = sorted((w, n) for w, n in per_worker.items() if n > cap)
        if over:
            problems.append("; ".join(f"{w} has {n} accepted contributions, over the run's cap of {cap} per worker"
                                      for w, n in over))
    unread: list[str] = []  # rejections whose payload could not be read: not judged
    for entry in record.rejected:
        try:
            commit = source.commit(entry.commit_id)
        except DATA_ERRORS as exc:
            problems.append(f"rejected commit {entry.commit_id} cannot be read on-chain: {data_fault(exc)}")
            continue
        if commit.run_id != source.spec.run_id or commit.worker.lower() != entry.worker:
            problems.append(f"rejected commit {entry.commit_id} is not a commit of {entry.worker} in this run")
        elif (false := false_rejection(source, record.version, entry.commit_id, entry.worker,
                                       entry.reason_code, unread)) is not None:
            problems.append(false)  # an honest commit cut out of the fold and the reward on a false reason
    reasons = sorted({r.reason_code for r in record.rejected})
    shown = "; ".join(unread[:3]) + (f"; and {len(unread) - 3} more" if len(unread) > 3 else "")
    report.add("entries", not problems, "; ".join(problems) or
               f"{len(accepted)} distinct accepted; {len(rejected)} rejected" + (f" ({', '.join(reasons)})" if reasons else "")
               + (f"; {len(unread)} rejection(s) not judged, payload not readable: {shown}" if unread else ""))


def _recompute_and_compare(source: AuditSource, version: int, info, record, parent, submissions, report) -> None:
    from krill.model.manifest import Manifest, ShardEntry
    from krill.model.shards import shard_to_bytes
    from krill.protocol.step import fold_version
    from krill.store.cid import digest_to_cid, file_cid

    outcomes = {o.shard: o for o in record.shards}
    if len(outcomes) != len(record.shards) or not set(outcomes) <= set(range(parent.manifest.num_shards)):
        report.add("recompute", False, f"record lists shards {[o.shard for o in record.shards]}")
        return
    try:
        learners = {v: source.state(v) for v in sorted({s.model_version for s in submissions})}
        results = fold_version(source.spec, parent, submissions, learners, shards=sorted(outcomes))
    except DATA_ERRORS as exc:
        report.add("recompute", False, f"fold failed: {data_fault(exc)}")
        return
    report.add("recompute", True, f"folded {len(submissions)} contributions into shards {sorted(outcomes)}")
    try:
        published = source.state(version).manifest
    except DATA_ERRORS as exc:
        published = None
        report.add("published manifest", False, data_fault(exc))
    shards = list(parent.manifest.shards)
    for r in results:
        outcome, s = outcomes[r.shard], r.shard
        names = parent.manifest.shard_names(s)
        if r.submissions:
            data = shard_to_bytes({n: r.tensors[n] for n in names})
            shards[s] = ShardEntry(index=s, cid=file_cid(data), sha256=hashlib.sha256(data).hexdigest(),
                                   size=len(data), parameters=parent.manifest.shards[s].parameters)
        want = shards[s]
        got = published.shards[s] if published is not None and s < published.num_shards else None
        same = got is not None and (got.sha256, got.cid, got.size) == (want.sha256, want.cid, want.size)
        report.add(f"shard {s} weights", same, f"sha256 {want.sha256[:16]}… cid {_short(want.cid)}" if same else
                   f"published sha256 {_short(got.sha256 if got else None)}, recomputed {want.sha256[:16]}…")
        _compare_outcome(r, outcome, report)
        if r.submissions and published is not None:  # kept where it matches the record: the next audit starts there
            source.state(version).preload_optimizer_state(s, r.optimizer_state)
    for s in set(range(parent.manifest.num_shards)) - set(outcomes):
        got = published.shards[s] if published is not None and s < published.num_shards else None
        report.add(f"shard {s} weights", got == parent.manifest.shards[s],
                   "not in the record: unchanged from the parent" if got == parent.manifest.shards[s] else
                   "not in the record, yet differs from the parent's")
    _compare_masks(source, version, record, parent, results, report)
    manifest = Manifest(version=version, parent=parent.manifest_cid, architecture=parent.manifest.architecture,
                        tokenizer=parent.manifest.tokenizer, shards=shards)
    data = manifest.canonical_bytes()
    digest = hashlib.sha256(data).digest()
    report.add("manifest digest", digest == info.manifest_digest,
               f"sha256 {digest.hex()[:16]}… matches the chain" if digest == info.manifest_digest else
               f"on-chain {info.manifest_digest.hex()[:16]}…, recomputed {digest.hex()[:16]}…")
    cid = file_cid(data)
    report.add("manifest cid", cid == record.manifest_cid and record.manifest_cid == digest_to_cid(info.manifest_digest),
               f"{_short(cid)}" if cid == record.manifest_cid else
               f"record says {_short(record.manifest_cid)}, recomputed {_short(cid)}")


def _compare_masks(source: AuditSource, version: int, record, parent, results, report: AuditReport) -> None:
    """The record's masks against the ones the recomputed optimizer states give, and the stored blob."""
    from krill.protocol.mask_blob import encode_masks
    from krill.protocol.state import derive_masks
    from krill.protocol.step import new_optimizer_states
    from krill.store.cid import file_cid

    spec, shapes = source.spec, parent.shapes()
    try:
        blob = encode_masks(derive_masks(spec, version, shapes, new_optimizer_states(parent, results)), shapes,
                            spec.run_id.hex(), version)
    except DATA_ERRORS as exc:
        report.add("masks", False, f"could not derive: {data_fault(exc)}")
        return
    sha, cid = hashlib.sha256(blob).hexdigest(), file_cid(blob)
    if (record.masks_sha256, record.masks_cid) != (sha, cid):
        report.add("masks", False, f"record names sha256 {_short(record.masks_sha256)} cid {_short(record.masks_cid)}, "
                                   f"the momentum gives {sha[:16]}… {_short(cid)}")
        return
    try:
        stored = hashlib.sha256(source.store.get(record.masks_cid)).hexdigest() == sha
    except DATA_ERRORS as exc:
        report.add("masks", False, f"match the momentum, but the blob is not retrievable: {data_fault(exc)}")
        return
    report.add("masks", stored, f"sha256 {sha[:16]}… matches the momentum" if stored else
               "match the momentum, but the stored blob differs")


def _compare_outcome(result, outcome, report: AuditReport) -> None:
    """Submission count, optimizer state and aggregation statistics of one shard against the record."""
    from krill.store.cid import file_cid

    s, problems = result.shard, []
    if result.submissions != outcome.submissions:
        problems.append(f"{outcome.submissions} submissions in the record, {result.submissions} recomputed")
    stored = outcome.optimizer_state_cid is not None
    if result.submissions:
        sha = hashlib.sha256(result.optimizer_state).hexdigest()
        if outcome.optimizer_state_sha256 != sha or (stored and outcome.optimizer_state_cid != file_cid(result.optimizer_state)):
            problems.append(f"optimizer state: record sha256 {_short(outcome.optimizer_state_sha256)}, "
                            f"recomputed {sha[:16]}…")
        stats = ([repr(float(x)) for x in result.trimmed_fractions], result.clipped,
                 repr(float(result.update_norm)), repr(float(result.grad_norm)))
        claimed = (list(outcome.trimmed_fractions), outcome.clipped, outcome.update_norm, outcome.grad_norm)
        if stats != claimed:
            problems.append(f"statistics (trimmed, clipped, update norm, grad norm): record {claimed}, recomputed {stats}")
    elif outcome.optimizer_state_sha256 is not None:
        problems.append("record names an optimizer state for a shard nobody submitted to")
    report.add(f"shard {s} optimizer", not problems, "; ".join(problems) or
               (f"state sha256 matches{'' if stored else ' (not stored at this version)'}; "
                f"update norm {float(result.update_norm):.3g}" if result.submissions else "no submissions: unchanged"))
