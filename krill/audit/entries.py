"""One accepted contribution of an aggregation record, checked against chain + store.

Design decisions:
- An accepted entry must be one an honest coordinator accepts (`coordinator/ingest.py`), so the audit
  runs the coordinator's admission rules on it, cheapest first, each a row of the report:
  * `on-chain`: the commit exists for this run and names the entry's worker, learner version and
    header digest (the record cannot credit work nobody committed);
  * `weight`: staleness = version - 1 - learner version within S_max, trust a finite number in
    [0, 1] at or above the run's floor, and weight = trust x staleness weight of the run spec, a
    positive number (a weight of zero or less cannot be folded: such an entry is not folded, and the
    recompute fails as not attempted). Trust is the coordinator's Beta posterior over the verdicts it
    counted, which the audit cannot pin down; it checks that the claim is reachable
    (`unreachable_trust`: some p passing and f failing verdicts, at most those on the worker's commits
    before the version's publication that the coordinator's rule counts, give exactly that value: the
    commit's draw selected the verifier, whose key was on-chain by the commit's block,
    `AuditSource.counts_towards_trust`);
  * `nonce`: the commit is the run's first by its worker with its nonce. The rule is read from the
    chain's `Committed` events of the run (`AuditSource.first_commit`), so a nonce reused in a commit
    the record never mentions (rejected, or of another version) is caught as the coordinator catches it;
  * `rollout staleness`: the rollouts were sampled at most S_max versions before the learner version;
  * `payload`: the header and every file it names are fetched by CID and validated exactly as a
    coordinator does (`validate_contribution` with the same `ExpectedContext`: digest, run, chain,
    contract, worker, staked Ed25519 key, learner version and manifest, the commit's on-chain nonce,
    the run's codec and block size; file digests, decoders, mask lengths of the learner version);
    its behaviour version and gradient shards are the entry's. As the coordinator does, the header's
    own checks (digest, context, staked key and signature, file names and size caps) come before any
    file is fetched, so a hostile header costs the audit one small read;
  * `assignment` and `rewards`: the verifier's cheap replay the coordinator runs before folding
    (`krill.protocol.work.check_assignment` / `check_rewards`: prompts, seeds and sampling parameters
    are the assignment's; every reward is the task's). They need the validated payload: when it is
    not valid they fail as not run;
  * `figures`: the completion tokens and mean reward the entry states are its rollouts' (nothing is
    folded or paid by them, but the release's contributors table and the run's metrics report them);
    a row only when the payload validated;
  * `applied once`: no earlier version in the staleness window accepted the same commit.
  Not re-checked: whether the worker was jailed when the version closed (jails come from this
  coordinator's slashes, judged by the ledger).
- A rejection's reason is checked where public data can bear it out or contradict it
  (`false_rejection`): payload reasons against the payload, replay reasons against the replay,
  and stale, jailed, slashed and below-floor against the chain before the version's publication.
  A code the protocol does not define is false outright: otherwise any made-up code would cut an
  honest commit out of the fold and the reward unchecked. A payload or replay reason whose payload
  the audit cannot read is not judged, and the `entries` row names those commits: it passed
  without a word, so an audit reading a partial store (a held repo's blocks, a node that lacks a
  rejected worker's content) looked as if it had judged every rejection.
- Public data that cannot be read or decoded (`krill.audit.source.DATA_ERRORS`) fails the row that
  read it, with the reason; it never stops the audit.
- The submission fed to the fold carries the record's weight (`float(entry.weight)`), exactly the
  float64 the coordinator used; a weight that is consistent but not the one folded shows up as
  digests that differ.
- The coordinator's rules live in `coordinator/ingest.py`, which the audit may not import (the core
  never imports a role): the replay checks and the codec are the shared `krill.protocol.work`
  functions, and the rollout-staleness rule is `krill.rl.staleness.rollout_lag_problem`; the nonce
  rule is one comparison and is restated here.
"""

from __future__ import annotations

import hashlib
import math

from krill.audit.report import AuditReport, EntryFigures
from krill.audit.source import DATA_ERRORS, AuditSource, data_fault
from krill.errors import PayloadError, StoreError
from krill.protocol.record import AcceptedEntry
from krill.protocol.step import Submission
from krill.rl.staleness import StalenessError, rollout_lag_problem, staleness_weight
from krill.store.unixfs import ObjectTooLargeError

WEIGHT_REL_TOL = 1e-12


def _float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _exists(commit) -> bool:
    return int(commit.worker, 16) != 0


def check_on_chain(source: AuditSource, entry: AcceptedEntry) -> list[str]:
    try:
        commit = source.commit(entry.commit_id)
    except DATA_ERRORS as exc:
        return [f"commit id {entry.commit_id} cannot be read on-chain: {data_fault(exc)}"]
    if not _exists(commit):
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
    elif (unreachable := unreachable_trust(source, version, entry.worker, trust)) is not None:
        problems.append(unreachable)
    if weight is None or weight <= 0.0:
        problems.append(f"weight {entry.weight!r} is not a finite positive number")
    try:
        sw = staleness_weight(staleness, spec.staleness)
    except StalenessError as exc:
        problems.append(str(exc))
        sw = None
    if not problems and not math.isclose(weight, trust * sw, rel_tol=WEIGHT_REL_TOL, abs_tol=0.0):
        problems.append(f"weight {weight!r} is not trust x staleness weight = {trust!r} x {sw!r} = {trust * sw!r}")
    return problems, (trust if trust is not None else math.nan), (weight if weight is not None else math.nan)


def unreachable_trust(source: AuditSource, version: int, worker: str, trust: float) -> str | None:
    """Why `trust` cannot be what the coordinator computed for `worker` at `version`, or None.

    The coordinator's trust is (prior_alpha + p) / (prior_alpha + prior_beta + p + f) over the passing
    and failing verdicts it counts (`coordinator/trust.py`): those of selected verifiers on the
    worker's commits of the run, less refuted ones, read before the version closed. The audit cannot
    tell which verdicts counted, but every counted one is among the `Attested` events on the worker's
    commits before the version's publication block whose verifier the commit's draw selected, keyed by
    the commit's block (`AuditSource.verdict_counts`): p and f are at most those counts (P, F). A claim no
    p <= P, f <= F gives (a sybil at 1.0, or passed by its own unselected verifiers; an honest worker held
    at the floor) fails."""
    t = source.spec.trust
    info = source.version_info(version)
    passes, fails = source.verdict_counts(worker, int(info.published_block) if info is not None else 0)
    for p in range(passes + 1):
        alpha = t.prior_alpha + p
        if trust <= 0.0:
            break
        beta = alpha / trust - alpha
        if not math.isfinite(beta):  # a trust below alpha / 1.8e308: no finite count of verdicts reaches it
            continue
        guess = round(beta - t.prior_beta)
        for f in (guess - 1, guess, guess + 1):
            beta = t.prior_beta + f  # as `coordinator/trust.py` adds them, so the bits agree
            if 0 <= f <= fails and float(alpha / (alpha + beta)) == trust:
                return None
    return (f"trust {trust!r} is not (prior {t.prior_alpha:g} + p) / (prior {t.prior_alpha:g} + {t.prior_beta:g} + "
            f"p + f) for any p <= {passes} passing and f <= {fails} failing verdicts on the worker's commits before "
            "the version's publication")


def check_nonce(source: AuditSource, entry: AcceptedEntry) -> list[str]:
    """The commit is the run's first by its worker with its nonce (the coordinator's rule: a repeated
    nonce repeats the assignment it derives)."""
    try:
        commit = source.commit(entry.commit_id)
    except DATA_ERRORS as exc:
        return [f"not checked: the commit cannot be read on-chain ({data_fault(exc)})"]
    if not _exists(commit):
        return ["not checked: no such commit on-chain"]
    first = source.first_commit(commit.worker, commit.nonce)
    if first is None:
        return [f"commit {entry.commit_id} is not among the run's Committed events"]
    if first != entry.commit_id:
        return [f"nonce {commit.nonce} was already committed by this worker in commit {first}: "
                "the assignment it derives would repeat"]
    return []


def check_rollout_staleness(source: AuditSource, entry: AcceptedEntry) -> list[str]:
    """The rollouts (sampled at the entry's behaviour version, which `payload` checks against the
    header) are at most S_max versions older than the learner version."""
    lag = rollout_lag_problem(entry.model_version, entry.behaviour_version, source.spec.staleness.max_staleness)
    return [] if lag is None else [lag]


def fetch_contribution(source: AuditSource, entry: AcceptedEntry):
    """The validated contribution of `entry`, in the context the coordinator validates it in
    (raises one of `DATA_ERRORS`)."""
    commit = source.commit(entry.commit_id)
    return fetch_payload(source, entry.worker, entry.model_version, bytes.fromhex(entry.header_digest),
                         commit.nonce if _exists(commit) else None)


def fetch_payload(source: AuditSource, worker: str, model_version: int, digest: bytes, nonce: int | None):
    """The validated contribution committed under `digest` by `worker` at `model_version` with `nonce`
    (raises one of `DATA_ERRORS`)."""
    from krill.payload.contribution import (
        ExpectedContext,
        check_context,
        check_file_names,
        validate_contribution,
    )
    from krill.payload.errors import DigestMismatchError, PayloadTooLargeError
    from krill.payload.header import ROLLOUTS_FILE, decode_header
    from krill.protocol.work import run_codec
    from krill.store.cid import digest_to_cid

    spec, store, limits = source.spec, source.store, source.spec.limits
    header_bytes = store.get(digest_to_cid(digest), max_bytes=limits.max_header_bytes)
    if hashlib.sha256(header_bytes).digest() != digest:
        raise DigestMismatchError("header bytes do not hash to the committed digest", field="header")
    header = decode_header(header_bytes, limits, verify=False)
    learner = source.state(model_version)
    context = ExpectedContext(run_id=spec.run_id.hex(), chain_id=source.chain_id, contract=source.contract,
                              worker=worker, ed25519_key=source.staked_key(worker).hex(),
                              model_version=model_version, manifest_cid=learner.manifest_cid, digest=digest,
                              nonce=nonce, **run_codec(spec))
    lengths = source.grad_lengths(model_version)
    # The header's own checks come before any file is fetched, as the coordinator makes them
    # (`coordinator/ingest.py` fetch_content): a header naming hundreds of files, or files of any size
    # up to 1 TiB, must cost one small read, not every byte it names.
    check_context(header, context)
    header.verify(context.ed25519_key)
    check_file_names(header, lengths)
    for name, ref in sorted(header.files.items()):
        cap = limits.max_rollout_bytes if name == ROLLOUTS_FILE else limits.max_grad_bytes
        if ref.size > cap:
            raise PayloadTooLargeError(f"{ref.size} bytes, over the cap of {cap}", field=f"{name}.size")
    files = {name: store.get(ref.cid, max_bytes=ref.size, sha256=bytes.fromhex(ref.sha256))
             for name, ref in sorted(header.files.items())}
    return validate_contribution(header_bytes, files, limits, context, lengths)


def check_payload(source: AuditSource, entry: AcceptedEntry):
    """(problems, contribution or None)."""
    try:
        contribution = fetch_contribution(source, entry)
    except PayloadError as exc:
        where = f" ({exc.field})" if getattr(exc, "field", None) else ""
        return [f"payload rejected{where}: {exc}"], None
    except DATA_ERRORS as exc:
        return [data_fault(exc)], None
    problems = []
    header = contribution.header
    if header.behaviour_version != entry.behaviour_version:
        problems.append(f"header behaviour version {header.behaviour_version}, the record says {entry.behaviour_version}")
    if sorted(contribution.gradients) != sorted(entry.shards):
        problems.append(f"header carries shards {sorted(contribution.gradients)}, the record says {sorted(entry.shards)}")
    return problems, contribution


def check_figures(entry: AcceptedEntry, contribution) -> list[str]:
    """The entry's completion tokens and mean reward are its rollouts', as `coordinator/close.py` writes them
    (the release's contributors table and the run's metrics read them from the record)."""
    import numpy as np

    rollouts, problems = contribution.rollouts, []
    tokens = int((np.diff(rollouts.offsets) - rollouts.prompt_lengths).sum())
    mean_reward = repr(float(np.float32(rollouts.rewards.mean())) if rollouts.n_sequences else 0.0)
    if entry.tokens != tokens:
        problems.append(f"the record says {entry.tokens} completion tokens, the rollouts have {tokens}")
    if entry.mean_reward != mean_reward:
        problems.append(f"the record says mean reward {entry.mean_reward}, the rollouts' is {mean_reward}")
    return problems


def check_replay(source: AuditSource, contribution) -> list[tuple[str, bool, str]]:
    """(name, ok, detail) of the cheap replay's two checks, assignment then rewards, as the coordinator
    runs them before folding (`krill.protocol.work`)."""
    from krill.protocol.work import check_assignment, check_rewards

    if contribution is None:
        return [(name, False, "not run: the payload is not valid") for name in ("assignment", "rewards")]
    try:
        task, tokenizer = source.task, source.tokenizer
    except DATA_ERRORS as exc:
        return [(name, False, f"not run: the run's tokenizer: {data_fault(exc)}") for name in ("assignment", "rewards")]
    header, batch = contribution.header, contribution.rollouts
    return [(c.name, c.ok, c.detail) for c in (check_assignment(source.spec, task, tokenizer, header, batch),
                                               check_rewards(source.spec, task, tokenizer, header, batch))]


# Rejection reasons the audit can check from public data: the payload's own validity, the cheap replay,
# and the standing and staleness rules the chain's events decide.
PAYLOAD_REASONS = frozenset({"bad_signature", "unknown_key", "digest_mismatch", "malformed_payload"})
REPLAY_REASONS = {"wrong_assignment": "assignment", "wrong_rewards": "rewards"}
STANDING_REASONS = frozenset({"stale", "jailed", "slashed", "below_trust_floor"})
# Reasons an honest coordinator gives that public data cannot judge (see `false_rejection`).
UNJUDGED_REASONS = frozenset({"unavailable", "no_served_shard"})
# Every reason code a coordinator gives (`krill.db.models.RejectionCode`, restated: the audit reads no database).
REASON_CODES = PAYLOAD_REASONS | frozenset(REPLAY_REASONS) | STANDING_REASONS | UNJUDGED_REASONS


def false_rejection(source: AuditSource, version: int, commit_id: int, worker: str, reason_code: str,
                    unread: list[str] | None = None) -> str | None:
    """Why record `version`'s rejection of `commit_id` is false, or None when it stands or cannot be judged.

    A payload reason stands when the payload, fetched by the on-chain digest and validated in the
    coordinator's context, is invalid; a replay reason when that check fails (or, for an assignment,
    when the commit reused a nonce); a standing reason when the chain bears it out before the
    version's publication (`false_standing`). A payload the audit cannot read cannot be judged; nor
    can `unavailable` (the audit cannot see when content appeared) or `no_served_shard` (which shards
    a coordinator serves is its own setting). A code that is none of the protocol's (`REASON_CODES`) is
    false whatever the commit: no honest coordinator gives it, and the record's pattern admits any.
    `unread` gets one line per rejection not judged because its payload could not be read."""
    if reason_code not in REASON_CODES:
        return f"commit {commit_id} is rejected as {reason_code}, which is not a reason the protocol defines"
    if reason_code in STANDING_REASONS:
        return false_standing(source, version, commit_id, worker, reason_code)
    if reason_code in UNJUDGED_REASONS:
        return None
    commit = source.commit(commit_id)
    nonce = int(commit.nonce)
    if reason_code == "wrong_assignment" and source.first_commit(worker, nonce) not in (None, commit_id):
        return None  # a reused nonce: the assignment it derives repeats an earlier commit's
    try:
        contribution = fetch_payload(source, worker, int(commit.version), bytes(commit.header_digest), nonce)
    except DATA_ERRORS as exc:  # invalid (a payload error: the rejection stands) or unreadable (not judged)
        # An object over its cap was read far enough to judge: the coordinator rejects it as malformed.
        if isinstance(exc, StoreError) and not isinstance(exc, ObjectTooLargeError) and unread is not None:
            unread.append(f"commit {commit_id} ({reason_code}): {data_fault(exc)}")
        return None
    if reason_code in PAYLOAD_REASONS:
        return (f"commit {commit_id} is rejected as {reason_code}, but its payload validates in the coordinator's "
                "context")
    check = REPLAY_REASONS[reason_code]
    outcome = {name: ok for name, ok, _ in check_replay(source, contribution)}
    if outcome.get(check) is False:
        return None
    return f"commit {commit_id} is rejected as {reason_code}, but the audit's {check} check passes"


def false_standing(source: AuditSource, version: int, commit_id: int, worker: str, reason_code: str) -> str | None:
    """Why a rejection of `commit_id` in record `version` as stale, jailed, slashed or below the trust
    floor is false, or None. The coordinator decides each before the version is published, from
    the chain (`coordinator/ingest.py`, `coordinator/trust.py`), and each only grows harder to meet
    with time: staleness grows as versions are published, a jail is for good, a slash stays, and the
    lowest trust the worker's verdicts allow (no passes counted, every failure) only falls. So the
    rejection is false when, as of the version's publication block,
    * `stale`: the commit's learner version is within S_max of the version's parent, and its
      rollouts (read from its header) within S_max of its learner version;
    * `jailed`: the worker had no `WorkerJailed` event and is not jailed now (a jail is never lifted);
    * `slashed`: the commit had no `Slashed` event;
    * `below_trust_floor`: even counting every failing verdict on the worker's commits that the
      coordinator's rule counts (`AuditSource.verdict_counts`) and no passing one, its trust is at or above the run's floor, and that trust x the commit's staleness
      weight is a positive weight."""
    spec, info = source.spec, source.version_info(version)
    published = int(info.published_block) if info is not None else 0
    said = f"commit {commit_id} is rejected as {reason_code}"
    if reason_code == "stale":
        commit = source.commit(commit_id)
        staleness = version - 1 - int(commit.version)
        if staleness < 0 or staleness > spec.staleness.max_staleness:
            return None
        try:
            contribution = fetch_payload(source, worker, int(commit.version), bytes(commit.header_digest),
                                         int(commit.nonce))
        except DATA_ERRORS:
            return None  # unreadable or invalid: not judged (an invalid one is out of the fold either way)
        header = contribution.header
        if rollout_lag_problem(header.model_version, header.behaviour_version, spec.staleness.max_staleness):
            return None
        return (f"{said}, but its learner version {commit.version} is {staleness} behind version {version}'s parent (S_max "
                f"{spec.staleness.max_staleness}) and its rollouts of version {header.behaviour_version} are within "
                f"S_max of it")
    if reason_code == "jailed":
        jailed = source.history.jailed.get(worker.lower())
        if jailed is not None and jailed < published:
            return None
        if jailed is None and source.jailed_now(worker):
            return None  # jailed before the run began: the jail's event is older than the history's scan
        return (f"{said}, but the worker was not jailed before version {version} was published (block {published})" +
                (f": its jail came at block {jailed}" if jailed is not None else ""))
    if reason_code == "slashed":
        slash = source.history.slashes.get(commit_id)
        if slash is not None and int(slash.block_number) < published:
            return None
        return f"{said}, but the commit was not slashed before version {version} was published (block {published})"
    t = spec.trust
    _, fails = source.verdict_counts(worker, published)
    lowest = float(t.prior_alpha / (t.prior_alpha + (t.prior_beta + fails)))  # as `coordinator/trust.py` computes it
    if lowest < t.floor or not _lowest_weight(source, version, commit_id, lowest) > 0.0:
        return None
    return (f"{said}, but with all {fails} failing verdicts on the worker's commits before version {version} was published "
            f"and no passing one its trust would be {lowest!r}, not below the floor {t.floor!r}")


def _lowest_weight(source: AuditSource, version: int, commit_id: int, lowest: float) -> float:
    """The smallest weight `lowest` trust gives `commit_id` at any close up to `version` (`coordinator/trust.py`
    rejects a weight that is not positive as below the floor: with a floor of 0 and a tiny prior it underflows
    to 0): its staleness in `version`, at most S_max, since a close weighs only what S_max admits and a
    rejection may be named in a later record than the close that made it. inf when the commit cannot be read."""
    try:
        staleness = version - 1 - int(source.commit(commit_id).version)
    except DATA_ERRORS:
        return math.inf
    config = source.spec.staleness
    return float(lowest * staleness_weight(min(max(staleness, 0), config.max_staleness), config))


def check_applied_once(source: AuditSource, version: int, entry: AcceptedEntry) -> list[str]:
    """Earlier versions that could have accepted the commit (model_version + 1 .. version - 1) did not."""
    for earlier in range(entry.model_version + 1, version):
        try:
            record = source.record(earlier)
        except DATA_ERRORS as exc:
            return [f"record of version {earlier} unavailable: {data_fault(exc)}"]
        if any(a.commit_id == entry.commit_id for a in record.accepted):
            return [f"already applied in version {earlier}"]
    return []


def audit_entry(source: AuditSource, version: int, entry: AcceptedEntry, report: AuditReport) -> Submission | None:
    """Check one accepted entry into `report`; its submission when its payload could be validated and
    its weight can be folded."""
    name = f"commit {entry.commit_id}"
    problems = check_on_chain(source, entry)
    report.add(f"{name} on-chain", not problems,
               "; ".join(problems) or f"worker {entry.worker}, version {entry.model_version}, digest matches")
    problems, trust, weight = check_weight(source, version, entry)
    report.add(f"{name} weight", not problems, "; ".join(problems)
               or f"staleness {entry.staleness}, trust {trust:.4g} (coordinator's), weight {weight:.4g}")
    report.entries.append(EntryFigures(entry.commit_id, entry.worker, entry.model_version, entry.behaviour_version,
                                       entry.staleness, trust, weight, list(entry.shards)))
    problems = check_nonce(source, entry)
    report.add(f"{name} nonce", not problems, "; ".join(problems) or "the worker's first commit with this nonce")
    problems = check_rollout_staleness(source, entry)
    report.add(f"{name} rollout staleness", not problems, "; ".join(problems) or
               f"rollouts {entry.model_version - entry.behaviour_version} behind the learner version")
    problems, contribution = check_payload(source, entry)
    ok = report.add(f"{name} payload", not problems, "; ".join(problems) or
                    f"signed by the staked key, {len(contribution.gradients)} shard gradients, "
                    f"{contribution.rollouts.n_sequences} rollouts")
    if contribution is not None:
        problems = check_figures(entry, contribution)
        report.add(f"{name} figures", not problems, "; ".join(problems) or
                   f"{entry.tokens} completion tokens, mean reward {entry.mean_reward}, as the rollouts give")
    for check, passed, detail in check_replay(source, contribution):
        report.add(f"{name} {check}", passed, detail)
    problems = check_applied_once(source, version, entry)
    report.add(f"{name} applied once", not problems, "; ".join(problems) or "not accepted by an earlier version")
    if contribution is None or not ok or not weight > 0.0:  # NaN compares false: not folded either
        return None
    return entry_submission(entry, contribution)


def entry_submission(entry: AcceptedEntry, contribution) -> Submission:
    """The fold's input for an accepted entry: its validated gradients with the record's weight."""
    values = {s: g.values for s, g in contribution.gradients.items()}
    return Submission(commit_id=entry.commit_id, weight=float(entry.weight), model_version=entry.model_version,
                      values=values)
