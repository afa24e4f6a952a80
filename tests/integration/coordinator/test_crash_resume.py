"""Crash safety: `kill -9` at every critical point of a version, restart, and the same version is published."""

from __future__ import annotations

import hashlib

from sqlalchemy import select

from krill.db.models import Contribution, ContributionStatus, Header, Metric
from krill.store.cid import digest_to_cid

SPEC = {"rollout": {"prompts_per_contribution": 2, "group_size": 4},
        "version": {"contributions": 3, "deadline_s": 600.0}, "chain": {"max_staleness": 1}, "eval_n": 8,
        "compression": {"dense_versions": 1}}


def _populate(env) -> list[int]:
    """Three workers, one honest contribution each at version 0, uploaded and committed."""
    return _contribute(env, [env.stake(index) for index in (1, 2, 3)], version=0)


def _contribute(env, workers, version: int) -> list[int]:
    """One honest contribution of each staked (account, identity) at `version` (nonce = version)."""
    ids = []
    for account, who in workers:
        header, files = env.produce(who, nonce=version, version=version)
        env.upload(header, files)
        ids.append(env.commit(account, header, version=version))
    return ids


def test_kill_9_at_each_point_then_restart_publishes_the_same_version(coordinator_env):
    from krill.coordinator.loop import Coordinator, LoopOptions
    from krill.protocol.record import load_record

    # Reference: an uninterrupted coordinator over the same inputs (fresh chain, same addresses).
    reference = coordinator_env(SPEC)
    ids = _populate(reference)
    ctx, indexer = reference.context()
    ctx.optimizer_state_every = 1  # every version's states stored, as the restarts below are told
    Coordinator(ctx, indexer, LoopOptions(eval_every=0, max_versions=1), echo=lambda _: None).run()
    expected = reference.chain.version_of(reference.run_id, 1)
    assert reference.chain.run_of(reference.run_id).latest_version == 1

    env = coordinator_env(SPEC)
    assert env.deployment.protocol == reference.deployment.protocol and env.run_id == reference.run_id
    assert _populate(env) == ids
    args = ("--set", "coordinator.max_versions=1", "--set", "coordinator.eval_every=0",
            "--set", "coordinator.optimizer_state_every=1", "run")
    for point in ("ingested", "decided", "stored", "published", "settled"):
        # The restart after the transaction runs with another optimizer_state_every: the journal's
        # settings, not the process's, rebuild the published bytes.
        run_args = args if point != "settled" else (*args[:-3], "--set", "coordinator.optimizer_state_every=7", "run")
        proc = env.spawn(*run_args, halt=point)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == -9, f"{point}: exit {proc.returncode}\n{out}"
        latest = env.chain.run_of(env.run_id).latest_version
        assert latest == (1 if point in ("published", "settled") else 0), point
        if point == "published":  # killed after the transaction: the record names optimizer states not stored yet
            states = [o.optimizer_state_cid for o in load_record(
                env.store, env.chain.version_of(env.run_id, 1).record_digest).shards if o.optimizer_state_cid is not None]
            assert states and not any(env.store.has(cid) for cid in states)
        if point == "settled":  # killed after settling, before reporting: the restart still reports
            assert env.chain.version_of(env.run_id, 1).settled and "v1 " not in out
    proc = env.spawn(*args)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "v1 " in out and "accepted   3" in out, out

    got = env.chain.version_of(env.run_id, 1)
    assert (got.manifest_digest, got.record_digest) == (expected.manifest_digest, expected.record_digest)
    assert env.chain.run_of(env.run_id).latest_version == 1 and got.settled
    record = load_record(env.store, got.record_digest)
    assert [e.commit_id for e in record.accepted] == ids  # each applied once, none lost
    for outcome in record.shards:  # the restart stored them, with the bytes the record names
        if outcome.optimizer_state_cid is not None:
            blob = env.store.get(outcome.optimizer_state_cid)
            assert hashlib.sha256(blob).hexdigest() == outcome.optimizer_state_sha256
    ctx, indexer = env.context()
    with ctx.db.session() as s:
        rows = list(s.scalars(select(Contribution).order_by(Contribution.commit_id)))
    assert [(r.commit_id, r.status, r.aggregated_version) for r in rows] == [
        (i, ContributionStatus.ACCEPTED, 1) for i in ids]
    # Reported by the restart after the kill between settling and reporting: nothing cached, so the
    # bytes come from the signed headers alone (files named with their sizes), no gradient refetched.
    headers = {bytes.fromhex(e.header_digest) for e in record.accepted}
    with ctx.db.session() as s:
        metric = s.get(Metric, (env.run_id.hex(), 1))
        sizes = sum(s.scalars(select(Header.total_bytes).where(Header.commit_id.in_(ids))))
    assert metric.bytes_received == sizes + sum(len(env.store.get(digest_to_cid(d))) for d in headers)
    fetched, get = [], ctx.store.get
    ctx.store.get = lambda cid, **k: fetched.append(cid) or get(cid, **k)
    entries = [e.model_dump(mode="json") for e in record.accepted]
    assert Coordinator(ctx, indexer, LoopOptions(), echo=print)._received_bytes(entries) == metric.bytes_received
    assert sorted(fetched) == sorted(digest_to_cid(d) for d in headers)


def test_a_restarted_coordinator_replays_the_optimizer_states_it_did_not_store(coordinator_env):
    """Version 1's optimizer states are named by sha256 only (they are stored every 10 versions); a new
    coordinator process folds version 2 on them by replaying version 1, and publishes exactly what a
    coordinator that kept them in memory did."""
    from krill.coordinator.loop import Coordinator, LoopOptions
    from krill.protocol.record import load_record

    reference = coordinator_env(SPEC)
    workers = [reference.stake(index) for index in (1, 2, 3)]
    _contribute(reference, workers, version=0)
    ctx, indexer = reference.context()
    assert ctx.optimizer_state_every == 10
    Coordinator(ctx, indexer, LoopOptions(eval_every=0, max_versions=1), echo=lambda _: None).run()
    _contribute(reference, workers, version=1)
    Coordinator(ctx, indexer, LoopOptions(eval_every=0, max_versions=2), echo=lambda _: None).run()
    expected = reference.chain.version_of(reference.run_id, 2)

    env = coordinator_env(SPEC)
    workers = [env.stake(index) for index in (1, 2, 3)]
    _contribute(env, workers, version=0)
    for versions in (1, 2):
        proc = env.spawn("--set", f"coordinator.max_versions={versions}", "--set", "coordinator.eval_every=0", "run")
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
        if versions == 1:
            record = load_record(env.store, env.chain.version_of(env.run_id, 1).record_digest)
            assert all(o.optimizer_state_cid is None and o.optimizer_state_sha256 for o in record.shards)
            _contribute(env, workers, version=1)
    got = env.chain.version_of(env.run_id, 2)
    assert (got.manifest_digest, got.record_digest) == (expected.manifest_digest, expected.record_digest)
