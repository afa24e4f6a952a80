"""The per-worker cap over many versions and a restart: a worker's contributions over the cap wait, are
folded by later versions at most `max_per_worker` at a time, and those that turn stale while waiting
are rejected in a record; every commit ends in exactly one record, none twice, none lost."""

from __future__ import annotations

from conftest import step  # at import: later, 'conftest' is whichever ran last

SPEC = {"rollout": {"prompts_per_contribution": 2, "group_size": 4}, "chain": {"max_staleness": 1}, "eval_n": 8,
        "compression": {"dense_versions": 1},
        "version": {"contributions": 2, "deadline_s": 600.0, "max_per_worker": 1}}


def test_over_the_cap_contributions_wait_across_a_restart_then_fold_or_are_rejected_stale(coordinator_env):
    from krill.coordinator.loop import Coordinator, LoopOptions
    from krill.protocol.record import load_record

    env = coordinator_env(SPEC)
    (a, wa), (b, wb) = env.stake(1), env.stake(2)

    def commit(account, who, nonce, version):
        header, files = env.produce(who, nonce=nonce, version=version)
        env.upload(header, files)
        return env.commit(account, header, version=version)

    def coordinator():  # a new process: nothing cached, the same database
        ctx, indexer = env.context()
        return Coordinator(ctx, indexer, LoopOptions(eval_every=0), echo=lambda _: None)

    a0, a1, a2 = (commit(a, wa, n, 0) for n in range(3))
    b0 = commit(b, wb, 0, 0)
    assert [f.version for f in step(coordinator())] == [1]
    b1 = commit(b, wb, 1, 1)
    assert [f.version for f in step(coordinator())] == [2]  # restarted: a1 waited in the database
    b2, a3 = commit(b, wb, 2, 2), commit(a, wa, 3, 2)
    assert [f.version for f in step(coordinator())] == [3]  # a2 is stale for version 3 (S_max = 1)

    records = {v: load_record(env.store, env.chain.version_of(env.run_id, v).record_digest) for v in (1, 2, 3)}
    accepted = {v: [e.commit_id for e in r.accepted] for v, r in records.items()}
    assert accepted == {1: [a0, b0], 2: [a1, b1], 3: [b2, a3]}  # commit-id order, one of a's a version
    assert [(e.commit_id, e.reason_code) for e in records[3].rejected] == [(a2, "stale")]
    assert not records[1].rejected and not records[2].rejected
