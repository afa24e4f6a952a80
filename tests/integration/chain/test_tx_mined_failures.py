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
from krill.chain.view_codec import function_codecs


def _beaten_in_one_block(env, monkeypatch, client, rival, name: str, args: tuple) -> None:
    """Make `client`'s next transaction pass its estimate, then have `rival` send `name(args)` with a ten
    times higher tip before it is sent, and mine both in one block."""
    if env.backend != "anvil":
        pytest.skip("needs a node whose automining can be paused")
    w3, ours = env.w3, client._tx
    estimate, send_raw = ours._gas_limit, ours._send_raw

    def estimate_then_rival(probe, what):
        gas = estimate(probe, what)
        w3.provider.make_request("evm_setAutomine", [False])
        theirs = rival._tx
        fees = {k: 10 * v for k, v in ours._fees().items()}
        tx = {"from": theirs.address, "to": env.deployment.protocol, "value": 0, "gas": 500_000,
              "data": function_codecs("KrillProtocol")[name].calldata(args), "chainId": w3.eth.chain_id, **fees,
              "nonce": theirs.nonces.take(w3, theirs.address, theirs.retry)}
        theirs._send_raw(theirs.account.sign_transaction(tx).raw_transaction, f"rival {name}")
        return gas

    def send_then_mine(raw, what):
        tx_hash = send_raw(raw, what)
        try:
            w3.provider.make_request("evm_mine", [])
        finally:
            w3.provider.make_request("evm_setAutomine", [True])
        return tx_hash

    monkeypatch.setattr(ours, "_gas_limit", estimate_then_rival)
    monkeypatch.setattr(ours, "_send_raw", send_then_mine)


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
