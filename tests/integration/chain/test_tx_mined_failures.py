"""A transaction that passed its estimate but failed once mined names the revert of what beat it.

The rival lands in the same block, ahead of it (a higher tip): the state of the block's parent lets
the transaction through, so only a replay against the block itself recovers the custom error
(`krill.chain.tx`). Anvil only: the in-process chain mines each transaction as it arrives.
"""

from __future__ import annotations

import pytest
from chain_constants import RUN_ID, digest

from krill.chain import errors as E
from krill.chain.types import to_bytes32, to_uint
from krill.testing.races import beaten_in_one_block


def _beaten_in_one_block(env, monkeypatch, client, rival, name: str, args: tuple) -> None:
    beaten_in_one_block(env.w3, env.deployment.protocol, monkeypatch, client, rival, name, args)


def test_a_commit_whose_digest_a_front_runner_took_in_its_block_names_digest_taken(staked, monkeypatch):
    env = staked
    worker, thief = env.at(env.WORKERS[0]), env.at(env.WORKERS[1])
    d = digest("front-run")
    _beaten_in_one_block(env, monkeypatch, worker, thief, "commit",
                         (to_bytes32(RUN_ID, "run_id"), to_uint(0, "version", 64), to_uint(777, "nonce", 64), d))
    with pytest.raises(E.CommitDigestTaken) as caught:
        worker.commit(RUN_ID, 0, 0, d)
    taken = worker.commit_id_by_digest(d)
    assert caught.value.revert_args == (d, taken)
    assert worker.commit_of(taken).worker == env.addr(env.WORKERS[1])
    assert worker.commit_id_of(RUN_ID, env.addr(env.WORKERS[0]), 0, 0) == 0  # ours failed on chain


def test_a_commit_made_stale_by_a_version_published_ahead_of_it_names_too_stale(staked, monkeypatch):
    env = staked
    for v in (1, 2):
        env.coordinator.publish_version(RUN_ID, v, digest(f"m{v}"), digest(f"r{v}"))
    worker = env.at(env.WORKERS[0])
    _beaten_in_one_block(env, monkeypatch, worker, env.coordinator, "publishVersion",
                         (to_bytes32(RUN_ID, "run_id"), to_uint(3, "version", 64), digest("m3"), digest("r3")))
    with pytest.raises(E.CommitVersionTooStale) as caught:
        worker.commit(RUN_ID, 0, 0, digest("late"))  # within S_max=2 of version 2 at its estimate
    assert caught.value.revert_args == (0, 3, 2)
    assert env.admin.run_of(RUN_ID).latest_version == 3
