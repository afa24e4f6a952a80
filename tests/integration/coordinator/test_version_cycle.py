"""One full version cycle against Anvil + a local store + SQLite: honest, forged and stale contributions."""

from __future__ import annotations

import hashlib
import time

import torch
from conftest import index_with_headers, ingest_taken, step, wait_for  # at import: later, another 'conftest'
from sqlalchemy import select

from krill.db.models import Contribution, ContributionStatus, Eval, Metric, RejectionCode


def _forge_signature(header):
    """The same header, signed by a key other than the one it names (and the one staked)."""
    from nacl.signing import SigningKey

    from krill.payload.header import SignedHeader

    signature = SigningKey(b"\x42" * 32).sign(header.signing_digest()).signature.hex()
    return SignedHeader(**{**header.model_dump(), "signature": signature})


def test_create_run_then_one_version_with_forged_and_stale_contributions(coordinator_env):
    from krill.coordinator.loop import Coordinator, LoopOptions
    from krill.protocol.record import load_record

    env = coordinator_env()
    (a1, w1), (a2, w2), (a3, w3) = env.stake(1), env.stake(2), env.stake(3)
    honest = [env.produce(w1, nonce=0), env.produce(w2, nonce=0)]
    forged_header, forged_files = env.produce(w3, nonce=0)
    forged_header = _forge_signature(forged_header)
    late_header, late_files = env.produce(w3, nonce=1)
    ids = [env.commit(a, h) for a, (h, f) in zip((a1, a2), honest, strict=True) if env.upload(h, f) is None]
    env.upload(forged_header, forged_files)
    forged_id = env.commit(a3, forged_header)
    env.upload(late_header, late_files, with_files=False)  # its files arrive only after version 1
    late_id = env.commit(a3, late_header)

    ctx, indexer = env.context()
    lines: list[str] = []
    coordinator = Coordinator(ctx, indexer, LoopOptions(poll_interval_s=0.1, eval_every=1, max_versions=2),
                              echo=lines.append)
    published = step(coordinator)
    assert [f.version for f in published] == [1], lines
    assert env.chain.run_of(env.run_id).latest_version == 1

    with ctx.db.session() as s:
        rows = {c.commit_id: c for c in s.scalars(select(Contribution))}
    assert rows[ids[0]].status == rows[ids[1]].status == ContributionStatus.ACCEPTED
    assert rows[ids[0]].aggregated_version == rows[ids[1]].aggregated_version == 1
    assert rows[ids[0]].weight == 0.25 and rows[ids[0]].staleness == 0  # new workers: trust 1/(1+3), fresh
    assert rows[forged_id].status == ContributionStatus.REJECTED
    assert rows[forged_id].reason_code == RejectionCode.BAD_SIGNATURE
    assert "signature" in rows[forged_id].reason
    assert rows[late_id].status == ContributionStatus.PENDING  # files missing, before the deadline

    info = env.chain.version_of(env.run_id, 1)
    record = load_record(env.store, info.record_digest)
    assert [e.commit_id for e in record.accepted] == ids and record.closed_by == "count"
    assert [(e.commit_id, e.reason_code) for e in record.rejected] == [(forged_id, "bad_signature")]
    assert {e.weight for e in record.accepted} == {"0.25"}
    manifest = env.store.get(record.manifest_cid)
    assert hashlib.sha256(manifest).digest() == info.manifest_digest

    # The coordinator pinned what it folded (the workers' uploads here are not pinned): a garbage
    # collection of the store keeps it, and the replay below needs it.
    from krill.store.cid import digest_to_cid

    folded = [(h.cid, *(ref.cid for ref in h.files.values())) for h, _ in honest]
    assert all(cid in env.store.pins() for cids in folded for cid in cids)
    assert forged_header.cid not in env.store.pins()
    env.store.gc(grace_s=0.0)
    assert not env.store.has(digest_to_cid(forged_header.digest))

    # The coordinator keeps version 1 as it folded it; loaded back from chain and store by a new
    # context it is the same, with the optimizer states (not stored: every 10th version is) replayed.
    assert all(o.optimizer_state_cid is None for o in record.shards)
    fresh, _ = env.context()
    kept, loaded = ctx.state(1), fresh.state(1)
    assert kept.manifest_cid == loaded.manifest_cid and kept.record_cid == loaded.record_cid
    for shard in range(loaded.manifest.num_shards):
        assert kept.optimizer_state(shard) == loaded.optimizer_state(shard)
        a, b = kept.shard_tensors(shard), loaded.shard_tensors(shard)
        assert list(a) == list(b) and all(a[n].dtype == b[n].dtype and torch.equal(a[n], b[n]) for n in a)
    assert all(torch.equal(kept.masks()[n], m) for n, m in loaded.masks().items())

    # Settlement: the version's reward split evenly between the two equally weighted workers.
    reward = env.spec.chain.reward_per_version
    assert info.settled or env.chain.version_of(env.run_id, 1).settled
    assert env.chain.claimable_of(a1.address) == env.chain.claimable_of(a2.address) == reward // 2
    assert env.chain.claimable_of(a3.address) == 0

    # The late contribution's files arrive; by now it is too stale for version 2 (S_max = 0).
    for data in late_files.values():
        env.store.add(data)
    assert step(coordinator) == []
    with ctx.db.session() as s:
        late = s.get(Contribution, late_id)
        metric = s.get(Metric, (env.run_id.hex(), 1))
        evals = sorted(e.version for e in s.scalars(select(Eval)))
    assert late.status == ContributionStatus.REJECTED and late.reason_code == RejectionCode.STALE
    assert metric.accepted == 2 and metric.rejected == 1 and metric.bytes_received > 0 and metric.bytes_published > 0
    assert metric.sampled_tokens > 0 and metric.extra["closed_by"] == "count"
    assert evals == [0, 1]
    assert any(line.startswith("v1 ") and "accepted   2 rejected   1" in line for line in lines), lines


def test_after_its_first_pass_the_coordinator_reads_the_run_only_to_publish_and_settle(coordinator_env):
    from krill.coordinator.loop import Coordinator, LoopOptions

    env = coordinator_env()
    for index in (1, 2):
        account, who = env.stake(index)
        header, files = env.produce(who, nonce=0)
        env.upload(header, files)
        env.commit(account, header)
    ctx, indexer = env.context()
    reads = []
    run_of = ctx.chain.run_of
    ctx.chain.run_of = lambda run_id: reads.append(run_id) or run_of(run_id)
    coordinator = Coordinator(ctx, indexer, LoopOptions(eval_every=0, max_versions=3), echo=lambda _: None)
    assert [f.version for f in step(coordinator)] == [1]
    assert len(reads) == 3  # the pass's own read, then publication and settlement read it once each
    for _ in range(3):  # passes waiting for contributions to version 2
        assert step(coordinator) == []
    assert len(reads) == 3 and not coordinator.done()


def test_a_header_must_name_its_commit_nonce_carry_a_gradient_and_never_reuse_a_nonce(coordinator_env):
    """Three ways to get the same work counted twice or to count work with nothing to fold: a header
    whose nonce differs from its on-chain commit's, a header with rollouts and no gradient, and a
    nonce committed again at a later version. Each is rejected, recorded, and never folded."""
    from krill.coordinator.loop import Coordinator, LoopOptions
    from krill.payload.header import HeaderBody
    from krill.protocol.record import load_record

    env = coordinator_env()
    (a1, w1), (a2, w2), (a4, w4), (a5, w5) = env.stake(1), env.stake(2), env.stake(4), env.stake(5)
    ids = []
    for account, who in ((a1, w1), (a2, w2)):
        header, files = env.produce(who, nonce=0)
        env.upload(header, files)
        ids.append(env.commit(account, header))
    header, files = env.produce(w4, nonce=2)
    env.upload(header, files)
    from krill.chain.events import Committed

    other_nonce = env.chain.as_account(a4).commit(env.run_id, 0, 7, header.digest).event(Committed).commit_id
    header, files = env.produce(w5, nonce=0)
    body = {k: v for k, v in header.model_dump().items() if k != "signature"}
    body["files"] = {name: ref for name, ref in body["files"].items() if not name.startswith("grad-")}
    rollouts_only = HeaderBody(**body).sign(w5.signing_key)
    env.upload(rollouts_only, files)
    no_gradient = env.commit(a5, rollouts_only)

    ctx, indexer = env.context()
    coordinator = Coordinator(ctx, indexer, LoopOptions(poll_interval_s=0.1, eval_every=0, max_versions=3),
                              echo=lambda _: None)
    assert [f.version for f in step(coordinator)] == [1]
    with ctx.db.session() as s:
        rows = {c.commit_id: c for c in s.scalars(select(Contribution))}
    assert [rows[i].status for i in ids] == [ContributionStatus.ACCEPTED] * 2
    assert rows[other_nonce].status == ContributionStatus.REJECTED
    assert rows[other_nonce].reason_code == RejectionCode.MALFORMED_PAYLOAD and "header.nonce" in rows[other_nonce].reason
    assert rows[no_gradient].status == ContributionStatus.REJECTED
    assert "no gradient file" in rows[no_gradient].reason
    record = load_record(env.store, env.chain.version_of(env.run_id, 1).record_digest)
    assert [e.commit_id for e in record.accepted] == ids
    assert sorted(e.commit_id for e in record.rejected) == sorted([other_nonce, no_gradient])

    header, files = env.produce(w1, nonce=0, version=1)  # nonce 0 again, at version 1
    env.upload(header, files)
    again = env.commit(a1, header, version=1)
    assert step(coordinator) == []
    with ctx.db.session() as s:
        row = s.get(Contribution, again)
    assert row.status == ContributionStatus.REJECTED and row.reason_code == RejectionCode.WRONG_ASSIGNMENT
    assert f"nonce 0 was already committed by this worker in commit {ids[0]}" in row.reason


def test_a_coordinator_serving_some_shards_rejects_contributions_that_carry_none_of_them(coordinator_env):
    from krill.payload.header import HeaderBody

    env = coordinator_env()
    (a1, w1), (a2, w2) = env.stake(1), env.stake(2)
    both, files = env.produce(w1, nonce=0)
    env.upload(both, files)
    carries_both = env.commit(a1, both)
    header, files = env.produce(w2, nonce=0)
    body = {k: v for k, v in header.model_dump().items() if k != "signature"}
    body["files"] = {name: ref for name, ref in body["files"].items() if name != "grad-1.safetensors"}
    only_shard_0 = HeaderBody(**body).sign(w2.signing_key)
    env.upload(only_shard_0, files)
    carries_0 = env.commit(a2, only_shard_0)

    ctx, indexer = env.context()
    ctx.shards = [1]
    indexer.sync()
    report = ingest_taken(ctx, next_version=1)
    assert (report.accepted, report.rejected) == (1, 1)
    with ctx.db.session() as s:
        rows = {c.commit_id: c for c in s.scalars(select(Contribution))}
    assert rows[carries_both].status == ContributionStatus.ACCEPTED
    assert rows[carries_0].reason_code == RejectionCode.NO_SERVED_SHARD
    assert "carries gradients for shards [0] only; this coordinator serves shards [1]" in rows[carries_0].reason


def _commit_junk(env, account, label: bytes, n: int) -> tuple[list[int], set[str]]:
    """`n` commits by `account` of digests of content nobody has: (commit ids, the CIDs of that content)."""
    from krill.chain.events import Committed
    from krill.store.cid import digest_to_cid

    digests = [hashlib.sha256(label + b" %d" % i).digest() for i in range(n)]
    ids = [env.chain.as_account(account).commit(env.run_id, 0, i, d).event(Committed).commit_id
           for i, d in enumerate(digests)]
    return ids, {digest_to_cid(d) for d in digests}


def _networked(ctx, missing: set[str]):
    """Make `ctx.store` look for the `missing` CIDs as a networked store does for content nobody has: until
    its timeout (here: until `release` is set), then not found. Returns (release, the CIDs asked for)."""
    import threading

    from krill.errors import ContentNotFoundError

    release, started, get = threading.Event(), [], ctx.store.get

    def networked_get(cid, **kwargs):
        if cid in missing:
            started.append(cid)
            release.wait(120)  # until the test sets it
            raise ContentNotFoundError(f"the store found no {cid} within its timeout")
        return get(cid, **kwargs)

    ctx.store.get = networked_get
    return release, started


def test_junk_commits_hold_one_fetch_thread_of_their_workers_lane_not_the_pass(coordinator_env):
    """A worker committing digests of content nobody has: on a networked store each such fetch waits out
    the store's timeout. Its fetches queue in its own lane, one at a time, and a pass waits at most
    FETCH_WAIT_S, so an honest commit made after them is accepted by the first pass."""
    from krill.coordinator import ingest as ingest_module

    env = coordinator_env()
    (junk_account, _), (honest_account, honest) = env.stake(1), env.stake(2)
    junk, missing = _commit_junk(env, junk_account, b"junk", 4)
    header, files = env.produce(honest, nonce=0)
    env.upload(header, files)
    honest_id = env.commit(honest_account, header)
    ctx, indexer = env.context()
    index_with_headers(indexer)  # else the index's own fetches of the junk meet the patched store
    release, started = _networked(ctx, missing)
    try:
        report = ingest_module.ingest(ctx, next_version=1)
        assert (report.accepted, report.pending) == (1, 4)
        wait_for(lambda: started, 30, "the junk lane's first fetch to start")  # a fetch thread starts on its own time
        time.sleep(0.3)
        assert len(started) == 1  # the junk worker's lane runs one fetch at a time
        with ctx.db.session() as s:
            assert s.get(Contribution, honest_id).status == ContributionStatus.ACCEPTED
            assert {s.get(Contribution, c).reason for c in junk} == {"fetching content"}
    finally:
        release.set()
    ctx.fetcher.wait(junk, 10)
    assert sorted(started) == sorted(missing)
    report = ingest_module.ingest(ctx, next_version=1)
    assert (report.accepted, report.pending) == (0, 4)  # missing, before the deadline: backing off
    with ctx.db.session() as s:
        assert {s.get(Contribution, c).reason for c in junk} == {"waiting for content: ContentNotFoundError"}


def test_commits_decided_while_their_fetches_run_leave_nothing_held(coordinator_env):
    """Junk commits rejected as stale while their fetches were queued or running: the queued ones never run,
    the running one's result is discarded, and no back-off entry outlives the decision. Before, every such
    result (a whole payload, or its exception) and back-off entry stayed for the coordinator's lifetime."""
    from krill.coordinator import ingest as ingest_module

    env = coordinator_env()
    junk_account, _ = env.stake(1)
    junk, missing = _commit_junk(env, junk_account, b"stale junk", 3)
    ctx, indexer = env.context()
    index_with_headers(indexer)  # else the index's own fetches of the junk meet the patched store
    release, started = _networked(ctx, missing)
    try:
        assert ingest_module.ingest(ctx, next_version=1).pending == 3
        wait_for(lambda: started, 30, "the lane's first fetch to start")  # else all three are still queued
        assert len(started) == 1
        report = ingest_module.ingest(ctx, next_version=10)  # versions later: every one is too stale
        assert (report.rejected, report.reasons) == (3, {"stale": 3})
    finally:
        release.set()
    deadline = time.monotonic() + 10
    while ctx.fetcher.in_flight() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(started) == 1  # the two queued fetches were dropped, never run
    assert ctx.fetcher.in_flight() == 0 and not any(c in ctx.fetcher for c in junk)
    assert not any(c in ctx.content_retry for c in junk)


def test_content_missing_at_ingest_is_retried_with_back_off_then_rejected_at_the_deadline(coordinator_env,
                                                                                          monkeypatch):
    """Committing digests of content nobody has costs a worker only gas; on a networked store each fetch of
    such content waits out the store's timeout, so a pending commit is not refetched on every pass."""
    import time as clock

    from krill.coordinator import ingest as ingest_module
    from krill.store.cid import digest_to_cid

    env = coordinator_env()
    account, who = env.stake(1)
    header, files = env.produce(who, nonce=0)
    env.upload(header, files, with_files=False)  # the files never arrive
    commit = env.commit(account, header)
    ctx, indexer = env.context()
    index_with_headers(indexer)  # else the index's own fetch of the header meets the counting store
    header_cid = digest_to_cid(header.digest)
    fetched, get = [], ctx.store.get
    ctx.store.get = lambda cid, **k: fetched.append(cid) or get(cid, **k)
    now = clock.time()

    assert ingest_taken(ctx, next_version=1, now=now).pending == 1  # fetched, found missing: backing off
    assert fetched.count(header_cid) == 1
    assert ingest_module.ingest(ctx, next_version=1, now=now).pending == 1
    assert fetched.count(header_cid) == 1  # backing off: not fetched again
    later = clock.monotonic() + ingest_module.CONTENT_RETRY_S + 0.1
    monkeypatch.setattr(ingest_module.time, "monotonic", lambda: later)
    assert ingest_module.ingest(ctx, next_version=1, now=now).pending == 1
    assert fetched.count(header_cid) == 2  # the back-off ran out: tried again, still missing
    past_deadline = now + env.spec.version.deadline_s + 3600
    assert ingest_module.ingest(ctx, next_version=1, now=past_deadline).rejected == 1  # the deadline is never skipped
    with ctx.db.session() as s:
        assert s.get(Contribution, commit).reason_code == RejectionCode.UNAVAILABLE


def test_a_version_folds_at_most_max_per_worker_contributions_of_one_worker(coordinator_env):
    """One staked account committing many contributions could fill a version and outweigh the robust fold's
    trim: the decision takes at most `version.max_per_worker` of a worker's, in commit order; the rest wait."""
    from krill.coordinator.close import decide
    from krill.coordinator.journal import ensure_tables

    env = coordinator_env({"rollout": {"prompts_per_contribution": 2, "group_size": 4}, "chain": {"max_staleness": 0},
                           "eval_n": 16, "compression": {"dense_versions": 1},
                           "version": {"contributions": 2, "deadline_s": 600.0, "max_per_worker": 1}})
    assert env.spec.version.max_per_worker == 1
    (a1, w1), (a2, w2) = env.stake(1), env.stake(2)
    ids = []
    for account, who, nonce in ((a1, w1, 0), (a1, w1, 1), (a1, w1, 2)):
        header, files = env.produce(who, nonce=nonce)
        env.upload(header, files)
        ids.append(env.commit(account, header))
    ctx, indexer = env.context()
    ensure_tables(ctx.db)
    indexer.sync()
    assert ingest_taken(ctx, next_version=1).accepted == 3
    assert decide(ctx, 1) is None  # three of one worker's: one eligible, short of K = 2
    header, files = env.produce(w2, nonce=0)
    env.upload(header, files)
    other = env.commit(a2, header)
    indexer.sync()
    assert ingest_taken(ctx, next_version=1).accepted == 1
    decision = decide(ctx, 1)
    assert decision is not None and [e["commit_id"] for e in decision.accepted] == [ids[0], other]
    with ctx.db.session() as s:
        waiting = [s.get(Contribution, c) for c in ids[1:]]
    assert all(c.status == ContributionStatus.ACCEPTED and c.aggregated_version is None for c in waiting)


def test_a_journalled_version_stays_publishable_through_a_store_garbage_collection(coordinator_env):
    """The decision is journalled before anything is published; a crash then restarts the version from the
    journal and the contributions' content. The coordinator pinned that content only after the publication,
    so a garbage collection of its store in between (the workers' uploads are not pinned in it) left a
    journalled version no restart could fold: every restart stopped on the missing content."""
    from krill.coordinator.close import decide
    from krill.coordinator.journal import ensure_tables
    from krill.coordinator.publish import complete_version

    env = coordinator_env()
    contributions = []
    for index in (1, 2):
        account, who = env.stake(index)
        header, files = env.produce(who, nonce=0)
        env.upload(header, files)
        env.commit(account, header)
        contributions.append((header, files))
    ctx, indexer = env.context()
    ensure_tables(ctx.db)
    indexer.sync()
    ingest_taken(ctx, next_version=1)
    assert decide(ctx, 1) is not None
    pinned = set(env.store.pins())
    assert all({h.cid, *(ref.cid for ref in h.files.values())} <= pinned for h, _ in contributions)

    env.store.gc(grace_s=0.0)  # the coordinator crashed after the decision; its store is collected meanwhile
    restarted, _ = env.context()
    published = complete_version(restarted, 1)
    assert env.chain.run_of(env.run_id).latest_version == 1
    assert env.chain.version_of(env.run_id, 1).record_digest == published.record_digest
