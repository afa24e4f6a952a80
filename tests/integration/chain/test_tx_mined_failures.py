"""A transaction that passed its estimate but failed once mined names the revert of what beat it.

The rival lands in the same block, ahead of it (a higher tip): the state of the block's parent lets
the transaction through, so only a replay against the block itself recovers the custom error
(`krill.chain.tx`). Anvil only: the in-process chain mines each transaction as it arrives.
"""

from __future__ import annotations

import pytest
from chain_constants import MIN_VERIFIER, RUN_ID, digest, key_of

from krill.chain import errors as E
from krill.chain.events import BountyCredited, Committed
from krill.chain.tx import TransactionOutOfGas
from krill.chain.types import Role, to_bytes32, to_uint
from krill.chain.view_codec import function_codecs
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


def test_a_slash_that_ran_out_of_gas_as_more_verdicts_landed_ahead_of_it_is_sent_again(staked, monkeypatch):
    """The coordinator slashes at quorum; three more failing verdicts land in the same block ahead of the slash,
    which loops over every failing verifier: it runs out of the gas estimated for two. The failed transaction
    changed nothing, so it is estimated again and sent once more, and the slash pays all five verifiers."""
    env = staked
    if env.backend != "anvil":
        pytest.skip("the in-process chain gives every transaction 10M gas and mines each as it arrives")
    for i in (8, 9):
        env.at(i).stake(Role.VERIFIER, MIN_VERIFIER, key_of(i))
    verifiers = (5, 6, 7, 8, 9)
    cid = env.at(env.WORKERS[0]).commit(RUN_ID, 0, 0, digest("forged")).event(Committed).commit_id
    for v in verifiers[:2]:  # the quorum
        env.at(v).attest(cid, False, digest(f"evidence {v}"))
    ours = env.coordinator._tx
    estimate, send_raw = ours._gas_limit, ours._send_raw
    sent: list[bytes] = []

    def estimate_then_verdicts_land(probe, what):
        gas = estimate(probe, what)
        if not sent:
            env.w3.provider.make_request("evm_setAutomine", [False])
            for v in verifiers[2:]:
                theirs = env.at(v)._tx
                fees = {k: 10 * value for k, value in ours._fees().items()}  # ahead of the slash in the block
                tx = {"from": theirs.address, "to": env.deployment.protocol, "value": 0, "gas": 500_000,
                      "data": function_codecs("KrillProtocol")["attest"].calldata((cid, False, digest(f"late {v}"))),
                      "chainId": env.w3.eth.chain_id, **fees, "nonce": theirs.nonces.take(env.w3, theirs.address,
                                                                                          theirs.retry)}
                theirs._send_raw(theirs.account.sign_transaction(tx).raw_transaction, "late attest")
        return gas

    def send_then_mine(raw, what):
        tx_hash = send_raw(raw, what)
        sent.append(tx_hash)
        if len(sent) == 1:
            try:
                env.w3.provider.make_request("evm_mine", [])
            finally:
                env.w3.provider.make_request("evm_setAutomine", [True])
        return tx_hash

    monkeypatch.setattr(ours, "_gas_limit", estimate_then_verdicts_land)
    monkeypatch.setattr(ours, "_send_raw", send_then_mine)
    receipt = env.coordinator.slash(cid)
    assert len(sent) == 2
    first = env.w3.eth.get_transaction_receipt(sent[0])
    assert first["status"] == 0 and first["gasUsed"] == env.w3.eth.get_transaction(sent[0])["gas"]  # out of gas
    assert env.admin.commit_of(cid).fail_count == 5
    assert [b.verifier for b in receipt.events_of(BountyCredited)] == [env.addr(v) for v in verifiers]


def _commit_at_failing_quorum(env) -> int:
    """A commit the quorum (verifiers 5 and 6) failed, due for a slash; on Anvil only, as a slash sent with
    too little gas must fail there."""
    if env.backend != "anvil":
        pytest.skip("the in-process chain gives every transaction 10M gas")
    cid = env.at(env.WORKERS[0]).commit(RUN_ID, 0, 0, digest("forged")).event(Committed).commit_id
    for v in (5, 6):
        env.at(v).attest(cid, False, digest(f"evidence {v}"))
    return cid


def test_a_transaction_out_of_gas_twice_is_raised_as_out_of_gas(staked, monkeypatch):
    env = staked
    cid = _commit_at_failing_quorum(env)
    ours = env.coordinator._tx
    estimates = []
    monkeypatch.setattr(ours, "_gas_limit", lambda probe, what: estimates.append(what) or 60_000)  # far too little
    with pytest.raises(TransactionOutOfGas, match="ran out of gas"):
        env.coordinator.slash(cid)
    assert len(estimates) == 2 and not env.admin.commit_of(cid).slashed


def test_a_resend_after_out_of_gas_reads_the_fees_again(staked, monkeypatch):
    """The resend after an out-of-gas failure was signed with the fees the first send was built with; had
    the base fee risen past them meanwhile (the first send may even have been replaced with raised fees),
    the node refused it with a raw error instead of the write being sent once more."""
    env = staked
    cid = _commit_at_failing_quorum(env)
    ours = env.coordinator._tx
    estimates, fees = [], []
    sign = ours.account.sign_transaction

    def signed(tx):
        fees.append(tx["maxFeePerGas"])
        return sign(tx)

    def too_little(probe, what):
        estimates.append(what)
        if len(estimates) == 2:  # the first send ran out of gas: the base fee has risen far since it was built
            env.w3.provider.make_request("anvil_setNextBlockBaseFeePerGas", [hex(20 * fees[0])])
            env.w3.provider.make_request("evm_mine", [])
        return 60_000  # far too little

    monkeypatch.setattr(ours, "_gas_limit", too_little)
    monkeypatch.setattr(ours.account, "sign_transaction", signed)
    rpc = env.w3.provider.make_request
    base = int(rpc("eth_feeHistory", ["0x1", "latest", []])["result"]["baseFeePerGas"][-1], 16)
    try:
        with pytest.raises(TransactionOutOfGas, match="ran out of gas"):  # sent twice, out of gas twice
            env.coordinator.slash(cid)
    finally:  # a snapshot's revert keeps Anvil's base fee: the session's later tests need the old one
        rpc("anvil_setNextBlockBaseFeePerGas", [hex(base)])
    assert len(estimates) == 2 and len(fees) == 2 and fees[1] > 20 * fees[0]


def test_a_rival_whose_send_fails_leaves_the_node_automining(staked, monkeypatch):
    """Before: automining was paused before the rival's send and turned back on only after ours was mined, so a
    rival refused by the node (here: no ether for its gas) left the shared Anvil paused, and every later test
    that waits for a receipt hung until its timeout."""
    from eth_account import Account

    env = staked
    if env.backend != "anvil":
        pytest.skip("the in-process chain mines each transaction as it arrives: nothing to pause")
    worker = env.at(env.WORKERS[0])
    broke = worker.as_account(Account.create())
    _beaten_in_one_block(env, monkeypatch, worker, broke, "commit",
                         (to_bytes32(RUN_ID, "run_id"), to_uint(0, "version", 64), to_uint(778, "nonce", 64),
                          digest("never sent")))
    with pytest.raises(Exception, match="(?i)insufficient funds|funds"):
        worker.commit(RUN_ID, 0, 0, digest("ours"))
    assert env.w3.provider.make_request("anvil_getAutomine", [])["result"] is True
