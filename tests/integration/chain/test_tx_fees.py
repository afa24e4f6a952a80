"""A transactor reads the fee market at most once a second, and again after a failure or a reset."""

from __future__ import annotations

import pytest
from chain_constants import MIN_WORKER, key_of

from krill.chain import errors as E
from krill.chain.types import Role


def _count_fee_reads(w3, monkeypatch) -> list[str]:
    """Every `eth.get_block` call (how a transactor reads the base fee) from now on."""
    seen: list[str] = []
    original = w3.eth.get_block

    def counting(*args, **kwargs):
        seen.append("eth_getBlockByNumber")
        return original(*args, **kwargs)

    monkeypatch.setattr(w3.eth, "get_block", counting)
    return seen


def test_fees_are_reused_within_a_second_and_read_again_after_a_reset_or_a_failure(env, monkeypatch):
    import krill.chain.tx

    monkeypatch.setattr(krill.chain.tx, "FEE_REUSE_S", 60.0)  # a slow machine must not expire them mid-test
    seen = _count_fee_reads(env.w3, monkeypatch)
    worker = env.at(env.WORKERS[0])
    worker.reset_nonces()  # earlier tests' transactions of this client left fees behind
    worker.stake(Role.WORKER, MIN_WORKER * 2, key_of(env.WORKERS[0]))
    worker.token.approve(env.deployment.protocol, 2**256 - 1)
    reads = seen.count("eth_getBlockByNumber")
    assert reads >= 1
    worker.stake(Role.WORKER, MIN_WORKER, key_of(env.WORKERS[0]))  # a top-up, moments later
    assert seen.count("eth_getBlockByNumber") == reads  # the fees read by the stake are reused
    worker.reset_nonces()
    worker.stake(Role.WORKER, MIN_WORKER, key_of(env.WORKERS[0]))
    assert seen.count("eth_getBlockByNumber") == reads + 1
    with pytest.raises(E.StakeRoleMismatch):  # refused at the estimate: nothing sent, fees kept
        worker.stake(Role.VERIFIER, MIN_WORKER, key_of(env.WORKERS[0]))
    assert seen.count("eth_getBlockByNumber") == reads + 1
