"""At start-up the per-version cap learns this worker's earlier commits from its `Committed` events, at the
versions it may still commit at (the newest and S_max before it) and no others."""

from __future__ import annotations

import hashlib

from worker_accounts import WORKERS

from krill.worker.runner import committed_per_version


def test_the_per_version_counts_start_from_this_workers_commits_at_the_recent_versions(worker_env):
    env = worker_env
    run = env.new_run("per-version-seed", max_staleness=1)
    me, other = env.chain(WORKERS[0]), env.chain(WORKERS[1])

    def publish(v: int) -> None:
        env.admin.publish_version(run.run_id, v, hashlib.sha256(b"m%d" % v).digest(),
                                  hashlib.sha256(b"r%d" % v).digest())

    def commit(chain, version: int, nonce: int) -> None:
        chain.commit(run.run_id, version, nonce, hashlib.sha256(b"%s/%d" % (chain.sender.encode(), nonce)).digest())

    commit(me, 0, 0)
    assert committed_per_version(me, run.run_id, me.sender) == {0: 1}
    publish(1)
    commit(me, 0, 1)
    commit(me, 1, 2)
    commit(me, 1, 3)
    commit(other, 1, 0)  # another worker's commit is not ours to count
    assert committed_per_version(me, run.run_id, me.sender) == {0: 2, 1: 2}
    publish(2)
    publish(3)  # versions 0 and 1 are out of reach: only 2..3 count, and nothing is committed there
    assert committed_per_version(me, run.run_id, me.sender) == {}
    commit(me, 2, 4)
    assert committed_per_version(me, run.run_id, me.sender.lower()) == {2: 1}
