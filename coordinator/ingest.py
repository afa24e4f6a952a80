"""Ingest: every commit of the run is fetched, validated and decided accepted or rejected, with a reason.

Design decisions:
- The index (`krill.db.Indexer`) says which commits exist; this module gives each one a row in the
  role-state `contributions` table: pending, accepted (valid, waiting to be folded) or rejected
  with a `RejectionCode` and a message naming the failing field. Nothing is silently dropped:
  every commit of the run ends in a row, and every rejection also goes into the next version's
  aggregation record.
- Validation is the core's (`validate_contribution`), cheapest checks first, against the context
  the chain gives: run, chain id, contract, worker, the worker's staked Ed25519 key at commit
  time, the committed version and its manifest CID, and the committed digest; gradients must
  have the lengths of that version's public masks. The header is checked before any file is
  fetched, so a forged header costs one small read.
- Payload errors map to codes: a key other than the staked one -> unknown_key; a signature that
  does not verify -> bad_signature; bytes that contradict the signed header or the digest ->
  digest_mismatch; anything else undecodable or inconsistent -> malformed_payload.
- Missing content is not a verdict on the worker yet: the commit stays pending and is retried
  until `spec.version.deadline_s` after its commit block, then it is rejected as unavailable.
  Retries back off per commit (`CONTENT_RETRY_S`, doubling up to `CONTENT_RETRY_MAX_S`; the last
  one at the deadline): on a networked store a fetch of content nobody has waits out the
  store's timeout (60 s on Kubo), and committing digests of content that does not exist is
  cheap, so retrying every one on every pass let a worker stall every pass by a minute per
  commit until the deadline. A store outage (unreachable, not merely missing) propagates to the loop, which
  backs off; it never turns into rejections.
- Fetches run on the context's fetch threads (`krill.store.fetcher`), one lane per worker: a pass
  submits every due fetch, waits at most `PASS_WAIT_S` for those it queued, decides what arrived
  and leaves the rest pending for a later pass. The first fetch of content nobody has therefore holds
  one thread of its worker's lane, not the pass, and honest contributions committed after a
  hundred junk commits are still decided in the pass that first sees them. Decoding and checking
  the files (`validate_contribution`) stay on the coordinator's thread.
- Before a contribution can be folded it also passes the verifier's cheap checks (assignment and
  rewards recomputed: a tokenizer pass and the task's reward function, no model), so reward
  forgery, cherry-picked prompts and copied payloads are never applied, checked or not. The
  expensive replays (re-sampling, gradients) stay with the verifiers: aggregation is optimistic
  for those (DESIGN §5), and the trust weight and the slash answer a failure.
- Staleness, jail and the trust floor are re-checked when a version closes (trust changes with
  verdicts), but a commit already too stale for the next version is rejected here at once.
- The commit times of the undecided commits are read `IN_CHUNK` ids at a time (`krill.db.session.in_chunks`,
  as `adopt` reads the index): a coordinator on a new database of a run with more than 65 535 commits bound every
  id in one IN (...), which PostgreSQL refuses, so every pass failed.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

from sqlalchemy import func, or_, select

from krill.coordinator.faults import halt_point
from krill.db.models import (
    ChainEventRow,
    Commit,
    Contribution,
    ContributionStatus,
    Participant,
    RejectionCode,
)
from krill.db.session import in_chunks
from krill.errors import ContentNotFoundError, IntegrityError, PayloadError, StoreError, StoreUnavailableError
from krill.payload import errors as pe
from krill.phases import phase
from krill.rl.staleness import rollout_lag_problem
from krill.store.fetcher import PASS_WAIT_S

_CODES: tuple[tuple[type[PayloadError], RejectionCode], ...] = (
    (pe.DigestMismatchError, RejectionCode.DIGEST_MISMATCH),
    (pe.SignatureError, RejectionCode.BAD_SIGNATURE),
)


def rejection_code(exc: PayloadError) -> RejectionCode:
    """The RejectionCode of a payload error."""
    if isinstance(exc, pe.SignatureError) and exc.field == "header.ed25519_key" and "different" in str(exc):
        return RejectionCode.UNKNOWN_KEY
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return RejectionCode.MALFORMED_PAYLOAD


@dataclass
class Outcome:
    """What examining one commit concluded."""

    status: ContributionStatus
    code: RejectionCode | None = None
    reason: str | None = None
    contribution: object | None = None  # krill.payload.contribution.Contribution when accepted
    bytes_received: int = 0


@dataclass
class IngestReport:
    accepted: int = 0
    rejected: int = 0
    pending: int = 0
    bytes_received: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class CommitView:
    """The facts of one commit the coordinator validates against (from the index)."""

    commit_id: int
    worker: str
    version: int
    header_digest: str
    worker_key: str | None
    block_time: int | None
    jailed: bool
    nonce: int  # the nonce of the on-chain commit, which the header must name
    nonce_first_commit: int | None = None  # the run's first commit by this worker with this nonce


CONTENT_RETRY_S = 5.0
CONTENT_RETRY_MAX_S = 120.0


def _reject(code: RejectionCode, reason: str) -> Outcome:
    return Outcome(ContributionStatus.REJECTED, code, reason[:500])


def fetch_and_validate(ctx, commit: CommitView):
    """The validated contribution of `commit`; PayloadError if it is invalid, ContentNotFoundError if
    some part is not in the store (yet)."""
    expected, lengths = expected_context(ctx, commit)
    header_bytes, files = fetch_content(ctx.store, ctx.spec.limits, expected, lengths)
    return validated(ctx, header_bytes, files, expected, lengths)


def expected_context(ctx, commit: CommitView):
    """What the chain says `commit`'s payload must name, and the gradient lengths of its version."""
    from krill.payload.contribution import ExpectedContext
    from krill.protocol.work import run_codec

    state = ctx.state(commit.version)
    expected = ExpectedContext(run_id=ctx.run_hex, chain_id=ctx.chain_id, contract=ctx.contract,
                               worker=commit.worker, ed25519_key=commit.worker_key, model_version=commit.version,
                               manifest_cid=state.manifest_cid, digest=bytes.fromhex(commit.header_digest),
                               nonce=commit.nonce, **run_codec(ctx.spec))
    return expected, ctx.grad_lengths(commit.version)


def fetch_content(store, limits, expected, lengths) -> tuple[bytes, dict[str, bytes]]:
    """The header and files of a commit. The header is checked (digest, context, signature, file names
    and sizes) before any file is fetched, so a forged header costs one small read. Touches only the
    store and its arguments: it runs on the fetch threads."""
    from krill.payload.contribution import check_context, check_file_names
    from krill.payload.header import ROLLOUTS_FILE, decode_header
    from krill.store.cid import digest_to_cid

    with phase("fetch"):
        header_bytes = store.get(digest_to_cid(expected.digest), max_bytes=limits.max_header_bytes)
    with phase("validate"):
        if hashlib.sha256(header_bytes).digest() != expected.digest:
            raise pe.DigestMismatchError("header bytes do not hash to the committed digest", field="header")
        header = decode_header(header_bytes, limits, verify=False)
        check_context(header, expected)
        header.verify(expected.ed25519_key)
        check_file_names(header, lengths)  # before any file is fetched: names it may not carry cost no bytes
        for name, ref in sorted(header.files.items()):
            cap = limits.max_rollout_bytes if name == ROLLOUTS_FILE else limits.max_grad_bytes
            if ref.size > cap:
                raise pe.PayloadTooLargeError(f"{ref.size} bytes, over the cap of {cap}", field=f"{name}.size")
    files = {}
    for name, ref in sorted(header.files.items()):
        try:
            with phase("fetch"):
                files[name] = store.get(ref.cid, max_bytes=ref.size)
        except IntegrityError as exc:  # the store refused bytes not matching the CID the worker signed
            raise pe.DigestMismatchError(f"content under {ref.cid} does not match it: {exc}", field=name) from None
    return header_bytes, files


def validated(ctx, header_bytes: bytes, files: dict[str, bytes], expected, lengths):
    """The contribution the fetched bytes make; PayloadError if they do not make a valid one."""
    from krill.payload.contribution import validate_contribution

    with phase("validate"):
        return validate_contribution(header_bytes, files, ctx.spec.limits, expected, lengths)


def contribution_bytes(contribution) -> int:
    """Bytes a contribution occupies on the wire: header + every file it names."""
    header = contribution.header
    return len(header.encode()) + sum(ref.size for ref in header.files.values())


def examine(ctx, commit: CommitView, next_version: int, now: float) -> Outcome:
    """Decide one commit: accepted, rejected (with a code), or still pending, waiting at most
    `PASS_WAIT_S` for its content (`ingest` does the same for all of a pass's commits at once)."""
    early = admit(ctx, commit, next_version, now)
    if early is not None:
        return early
    if submit_fetch(ctx, commit):
        with phase("fetch"):
            ctx.fetcher.wait([commit.commit_id], PASS_WAIT_S)
    return decide(ctx, commit, now)


def admit(ctx, commit: CommitView, next_version: int, now: float) -> Outcome | None:
    """What is decided before any fetch: a rejection the index's facts alone decide (`precheck`), or
    pending while the content's back-off runs; None: fetch it."""
    early = precheck(ctx, commit, next_version)
    if early is not None:
        ctx.fetcher.forget(commit.commit_id)  # queued, running or fetched before it turned stale or jailed: not needed
        return early
    if not _fetch_due(ctx, commit, now):
        return Outcome(ContributionStatus.PENDING, reason="waiting for content (backing off)")
    return None


def precheck(ctx, commit: CommitView, next_version: int) -> Outcome | None:
    """The rejection the index's facts alone decide (jailed, no key, a reused nonce, too stale), else None."""
    if commit.jailed:
        return _reject(RejectionCode.JAILED, "the worker is jailed (a commit was slashed)")
    if commit.worker_key is None:
        return _reject(RejectionCode.UNKNOWN_KEY, "the worker had no staked Ed25519 key when it committed")
    if commit.nonce_first_commit is not None and commit.nonce_first_commit != commit.commit_id:
        return _reject(RejectionCode.WRONG_ASSIGNMENT,
                       f"nonce {commit.nonce} was already committed by this worker in commit "
                       f"{commit.nonce_first_commit}: the assignment it derives would repeat")
    staleness = next_version - 1 - commit.version
    if staleness > ctx.spec.staleness.max_staleness:
        return _reject(RejectionCode.STALE, f"staleness {staleness} exceeds S_max = "
                                            f"{ctx.spec.staleness.max_staleness} for version {next_version}")
    return None


def submit_fetch(ctx, commit: CommitView, key=None, lane: str | None = None) -> bool:
    """Queue the fetch of `commit`'s content in `lane` (default its worker's), under `key` (default its commit
    id); False when it is already queued, running or fetched. The version's facts are read here, on the
    coordinator's thread; the fetch touches only the store. `fetched_contribution` decodes the result."""
    key = commit.commit_id if key is None else key
    lane = commit.worker if lane is None else lane
    if key in ctx.fetcher:
        return False
    expected, lengths = expected_context(ctx, commit)
    store, limits = ctx.store, ctx.spec.limits

    def job():
        return (*fetch_content(store, limits, expected, lengths), expected, lengths)

    return ctx.fetcher.submit(lane, key, job)


def fetched_contribution(ctx, fetched):
    """The validated contribution of a finished `submit_fetch` job; raises what fetching or validating raised."""
    header_bytes, files, expected, lengths = fetched.result()
    return validated(ctx, header_bytes, files, expected, lengths)


def decide(ctx, commit: CommitView, now: float) -> Outcome:
    """Decide a commit `admit` let through from its fetch: pending while the fetch runs or the content is
    missing (before the deadline), else accepted or rejected."""
    from krill.store.unixfs import ObjectTooLargeError

    fetched = ctx.fetcher.take(commit.commit_id)
    if fetched is None:
        return Outcome(ContributionStatus.PENDING, reason="fetching content")
    try:
        contribution = fetched_contribution(ctx, fetched)
        ctx.content_retry.pop(commit.commit_id, None)
    except ObjectTooLargeError as exc:
        return _reject(RejectionCode.MALFORMED_PAYLOAD, f"too large: {exc}")
    except PayloadError as exc:
        return _reject(rejection_code(exc), f"{type(exc).__name__}: {exc}")
    except (ContentNotFoundError, IntegrityError) as exc:
        waited = None if commit.block_time is None else now - commit.block_time
        if waited is not None and waited > ctx.spec.version.deadline_s:
            message = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
            return _reject(RejectionCode.UNAVAILABLE, f"content still missing {waited:.0f} s after the commit "
                                                      f"(deadline {ctx.spec.version.deadline_s:g} s): {message}")
        _missed(ctx, commit.commit_id)
        return Outcome(ContributionStatus.PENDING, reason=f"waiting for content: {type(exc).__name__}")
    except StoreUnavailableError:
        raise  # the loop backs off
    except StoreError as exc:  # this coordinator's store failing (a 5xx): never the worker's, retried
        _missed(ctx, commit.commit_id)
        return Outcome(ContributionStatus.PENDING, reason=f"store fault, retrying: {str(exc)[:200]}")
    lag = rollout_lag_problem(contribution.header.model_version, contribution.header.behaviour_version,
                              ctx.spec.staleness.max_staleness)
    if lag is not None:
        return _reject(RejectionCode.STALE, lag)
    served = ctx.served_shards()
    if not set(contribution.gradients) & set(served):
        from krill.coordinator.close import no_served_shard

        return _reject(RejectionCode.NO_SERVED_SHARD, no_served_shard(contribution, served))
    with phase("replay"):
        cheap = cheap_replay(ctx, contribution)
    if cheap is not None:
        return cheap
    return Outcome(ContributionStatus.ACCEPTED, contribution=contribution,
                   bytes_received=contribution_bytes(contribution))


def cheap_replay(ctx, contribution) -> Outcome | None:
    """The verifier's two cheap checks, run on every contribution before it can be folded: the
    prompts, seeds and sampling parameters are the assignment's, and every claimed reward is the
    task's reward of its completion. None when both hold, else the rejection."""
    from krill.protocol.work import check_assignment, check_rewards

    header, batch = contribution.header, contribution.rollouts
    assignment = check_assignment(ctx.spec, ctx.task, ctx.tokenizer, header, batch)
    if not assignment.ok:
        return _reject(RejectionCode.WRONG_ASSIGNMENT, f"assignment: {assignment.detail}")
    rewards = check_rewards(ctx.spec, ctx.task, ctx.tokenizer, header, batch)
    if not rewards.ok:
        return _reject(RejectionCode.WRONG_REWARDS, f"rewards: {rewards.detail}")
    return None


def _fetch_due(ctx, commit: CommitView, now: float) -> bool:
    """Whether to fetch `commit`'s content this pass: always, unless it was missing at the last try and
    its back-off has not run out (past the deadline it is always tried, so it is rejected on time)."""
    retry = ctx.content_retry.get(commit.commit_id)
    if retry is None or time.monotonic() >= retry[0]:
        return True
    return commit.block_time is not None and now - commit.block_time > ctx.spec.version.deadline_s


def _missed(ctx, commit_id: int) -> None:
    """Content of `commit_id` was missing: next try after a doubled delay."""
    _, delay = ctx.content_retry.get(commit_id, (0.0, CONTENT_RETRY_S / 2))
    delay = min(CONTENT_RETRY_MAX_S, delay * 2)
    ctx.content_retry[commit_id] = (time.monotonic() + delay, delay)


def undecided_commits(ctx) -> list[CommitView]:
    """Commits of the run without a final ingest decision, in commit-id order."""
    with ctx.db.session() as s:
        rows = s.execute(
            select(Commit.commit_id, Commit.worker, Commit.version, Commit.header_digest, Commit.worker_key,
                   Commit.nonce, Participant.jailed)
            .join(Participant, Participant.address == Commit.worker)
            .outerjoin(Contribution, Contribution.commit_id == Commit.commit_id)
            .where(Commit.run_id == ctx.run_hex,
                   or_(Contribution.commit_id.is_(None), Contribution.status == ContributionStatus.PENDING))
            .order_by(Commit.commit_id)).all()
        ids = [r.commit_id for r in rows]
        times = {}
        for part in in_chunks(ids):  # PostgreSQL refuses more than 65 535 bind parameters
            times.update(s.execute(select(ChainEventRow.commit_id, ChainEventRow.block_time)
                                   .where(ChainEventRow.kind == "Committed",
                                          ChainEventRow.commit_id.in_(part))).all())
        first = {}
        workers = sorted({r.worker for r in rows})
        for part in in_chunks(workers):
            first.update({(w, int(n)): c for w, n, c in s.execute(
                select(Commit.worker, Commit.nonce, func.min(Commit.commit_id))
                .where(Commit.run_id == ctx.run_hex, Commit.worker.in_(part))
                .group_by(Commit.worker, Commit.nonce)).all()})
    return [CommitView(r.commit_id, r.worker, int(r.version), r.header_digest, r.worker_key, times.get(r.commit_id),
                       bool(r.jailed), int(r.nonce), first.get((r.worker, int(r.nonce)))) for r in rows]


def ingest(ctx, next_version: int, now: float | None = None) -> IngestReport:
    """One pass over undecided commits; the pass's decisions are written to the contributions table in
    one transaction (one write lock per pass, not one per commit: the database is shared with the
    indexer, the verifiers and the explorer)."""
    now = time.time() if now is None else now
    report = IngestReport()
    commits = undecided_commits(ctx)
    early = {c.commit_id: admit(ctx, c, next_version, now) for c in commits}
    queued = [c.commit_id for c in commits if early[c.commit_id] is None and submit_fetch(ctx, c)]
    if queued:
        with phase("fetch"):
            ctx.fetcher.wait(queued, PASS_WAIT_S)
    decided = [(c, early[c.commit_id] if early[c.commit_id] is not None else decide(ctx, c, now)) for c in commits]
    if not decided:
        return report
    written = []
    with ctx.db.write() as s:
        for commit, outcome in decided:
            row = s.get(Contribution, commit.commit_id)
            if row is None:
                row = Contribution(commit_id=commit.commit_id, run_id=ctx.run_hex, worker=commit.worker,
                                   version=commit.version, status=ContributionStatus.PENDING)
                s.add(row)
            elif row.status != ContributionStatus.PENDING:
                continue  # decided meanwhile (another pass of ours after a restart): keep the first decision
            row.status, row.reason_code, row.reason = outcome.status, outcome.code, outcome.reason
            written.append((commit, outcome))
    for commit, outcome in decided:
        if outcome.status != ContributionStatus.PENDING:
            ctx.content_retry.pop(commit.commit_id, None)  # its back-off is over, whatever the decision
    for commit, outcome in written:
        if outcome.status == ContributionStatus.ACCEPTED:
            ctx.remember(commit.commit_id, outcome.contribution)
            halt_point("ingested")
            report.accepted += 1
            report.bytes_received += outcome.bytes_received
        elif outcome.status == ContributionStatus.REJECTED:
            report.rejected += 1
            report.reasons[outcome.code.value] = report.reasons.get(outcome.code.value, 0) + 1
        else:
            report.pending += 1
    return report
