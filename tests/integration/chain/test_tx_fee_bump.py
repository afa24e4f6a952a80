"""A transaction the base fee outgrew while it was pending is replaced under its nonce with raised fees.

On Anvil with automine off: after the first send the next block's base fee is set above the transaction's
maxFee (`anvil_setNextBlockBaseFeePerGas`), as a run of full blocks does on a live chain; without a
replacement it would never be mined (`ReceiptTimeout`). Blocks are mined by the test, at the moment it
names, so nothing depends on timing. The in-process chain mines each transaction as it arrives: the
replacement must never trigger there.
"""

from __future__ import annotations

import pytest
from chain_constants import MIN_WORKER, RUN_ID, digest, key_of

from krill.chain import errors as E
from krill.chain.events import Staked
from krill.chain.tx import FeeBumpPolicy, ReceiptTimeout
from krill.chain.types import Role

FAST = FeeBumpPolicy(check_s=0.05)


def _next_base_fee(w3) -> int:
    return int(w3.provider.make_request("eth_feeHistory", ["0x1", "latest", []])["result"]["baseFeePerGas"][-1], 16)


@pytest.fixture
def held(env):
    """`env` on Anvil with automine off; afterwards the pool is emptied, automine and the base fee restored."""
    if env.backend != "anvil":
        pytest.skip("the in-process chain mines each transaction as it arrives: nothing waits in a pool")
    rpc = env.w3.provider.make_request
    base = _next_base_fee(env.w3)
    rpc("evm_setAutomine", [False])
    try:
        yield env
    finally:
        rpc("anvil_dropAllTransactions", [])
        rpc("anvil_setNextBlockBaseFeePerGas", [hex(base)])
        rpc("evm_setAutomine", [True])


def _worker(env, monkeypatch, policy: FeeBumpPolicy, receipt_timeout_s: float = 3.0):
    """The first worker's client, its transactor on `policy` (restored after the test)."""
    client = env.at(env.WORKERS[0])
    monkeypatch.setattr(client._tx, "bump", policy)
    monkeypatch.setattr(client._tx, "receipt_timeout_s", receipt_timeout_s)
    return client


def _record_sends(env, monkeypatch, client, on_send) -> list[dict]:
    """Every transaction `client` sends from now on, as the node holds it (pending); `on_send(count, fields)`
    runs after each send the node took (`count` from 1) and before a send when it returns "before"."""
    tx, real = client._tx, client._tx._send_raw
    sent: list[dict] = []

    def send_raw(raw, what):
        if on_send(len(sent) + 1, None) == "before":
            sent.append({"raw": raw})
            return real(raw, what)
        tx_hash = real(raw, what)
        sent.append(dict(env.w3.eth.get_transaction(tx_hash)))
        on_send(len(sent), sent[-1])
        return tx_hash

    monkeypatch.setattr(tx, "_send_raw", send_raw)
    return sent


def _stake(client, env):
    return client.stake(Role.WORKER, MIN_WORKER * 2, key_of(env.WORKERS[0]))


@pytest.mark.parametrize("cause", ["base fee rose above its maxFee", "its tip is too low"])
def test_a_pending_transaction_is_replaced_with_raised_fees_and_the_replacement_is_decoded(held, monkeypatch, cause):
    env = held
    rpc = env.w3.provider.make_request
    policy = FAST if cause.startswith("base") else FeeBumpPolicy(check_s=0.05, after_s=0.2)
    client = _worker(env, monkeypatch, policy)
    spike = {}

    def on_send(count, fields):
        if fields is None:
            return None
        if count == 1 and cause.startswith("base"):
            spike["fee"] = 2 * fields["maxFeePerGas"]  # full blocks ahead: the base fee doubled its maxFee
            rpc("anvil_setNextBlockBaseFeePerGas", [hex(spike["fee"])])
        if count == 2:
            rpc("evm_mine", [])  # a block at the (risen) base fee: only the replacement can be in it
        return None

    sent = _record_sends(env, monkeypatch, client, on_send)
    receipt = _stake(client, env)
    assert len(sent) == 2, "sent once: never replaced"
    first, second = sent
    assert receipt.transaction_hash == "0x" + bytes(second["hash"]).hex()
    assert receipt.event(Staked).account == env.addr(env.WORKERS[0])  # the replacement's receipt, decoded
    assert second["nonce"] == first["nonce"]
    assert second["maxFeePerGas"] >= -(-first["maxFeePerGas"] * 9 // 8)  # +12.5%, above geth's +10% minimum
    assert second["maxPriorityFeePerGas"] >= -(-first["maxPriorityFeePerGas"] * 9 // 8)
    if spike:
        assert second["maxFeePerGas"] >= 2 * spike["fee"]
    rpc("evm_setAutomine", [True])
    after = _stake(client, env)  # the book goes on from the nonce the replacement used
    assert env.w3.eth.get_transaction(after.transaction_hash)["nonce"] == first["nonce"] + 1


def test_a_replaced_transaction_that_lands_first_is_the_one_decoded(held, monkeypatch):
    """The base fee falls back and the first transaction is mined before its replacement arrives: the node
    refuses the replacement ("nonce too low"), which is no error, and the first one's receipt is returned."""
    env = held
    rpc = env.w3.provider.make_request
    client = _worker(env, monkeypatch, FAST)
    base = _next_base_fee(env.w3)

    def on_send(count, fields):
        if count == 1 and fields is not None:
            rpc("anvil_setNextBlockBaseFeePerGas", [hex(2 * fields["maxFeePerGas"])])
        if count == 2 and fields is None:
            rpc("anvil_setNextBlockBaseFeePerGas", [hex(base)])
            rpc("evm_mine", [])  # the first transaction lands; its replacement comes too late
            return "before"
        return None

    sent = _record_sends(env, monkeypatch, client, on_send)
    receipt = _stake(client, env)
    assert len(sent) == 2
    assert receipt.transaction_hash == "0x" + bytes(sent[0]["hash"]).hex()
    assert receipt.event(Staked).amount == MIN_WORKER * 2
    assert env.w3.eth.get_transaction_count(env.addr(env.WORKERS[0])) == sent[0]["nonce"] + 1  # landed once
    rpc("evm_setAutomine", [True])
    after = _stake(client, env)
    assert env.w3.eth.get_transaction(after.transaction_hash)["nonce"] == sent[0]["nonce"] + 1


def test_replacements_stop_at_the_fee_cap(held, monkeypatch):
    """A fee spike far above the cap: one replacement at the cap (which Anvil refuses, under its base fee;
    geth would pool it), then none (the cap leaves no room for the +12.5% a replacement needs), and the
    wait ends in `ReceiptTimeout`."""
    env = held
    rpc = env.w3.provider.make_request
    client = _worker(env, monkeypatch, FeeBumpPolicy(check_s=0.05, cap_factor=1.5), receipt_timeout_s=0.8)
    account, signed = client._tx.account, []
    sign = account.sign_transaction

    def recording_sign(fields):
        signed.append(dict(fields))
        return sign(fields)

    monkeypatch.setattr(account, "sign_transaction", recording_sign)

    def on_send(count, fields):
        if count == 1 and fields is not None:
            rpc("anvil_setNextBlockBaseFeePerGas", [hex(100 * fields["maxFeePerGas"])])
        return None

    _record_sends(env, monkeypatch, client, on_send)
    with pytest.raises(ReceiptTimeout):
        _stake(client, env)
    assert len(signed) == 2, "not one replacement at the cap, then none"
    first, capped = signed
    assert capped["nonce"] == first["nonce"]
    assert capped["maxFeePerGas"] == int(1.5 * first["maxFeePerGas"])
    assert env.addr(env.WORKERS[0]) not in client._tx.nonces._next  # read from the chain at the next send


def test_a_transaction_mined_at_once_is_never_replaced(env, monkeypatch):
    """py-evm (and an automining Anvil) mine on arrival: one send, and in process not even a look at the base
    fee, however eager the policy."""
    eager = FeeBumpPolicy(check_s=0.0, after_s=0.0) if env.backend == "py-evm" else FAST
    client = _worker(env, monkeypatch, eager)
    if env.backend == "py-evm":
        def no_look():
            raise AssertionError("looked at the base fee in process")

        monkeypatch.setattr(client._tx, "_next_base_fee", no_look)
    sent = _record_sends(env, monkeypatch, client, lambda count, fields: None)
    receipt = _stake(client, env)
    assert len(sent) == 1 and receipt.transaction_hash == "0x" + bytes(sent[0]["hash"]).hex()


def test_a_pending_write_the_chain_now_refuses_is_not_replaced(staked, held, monkeypatch):
    """A worker's commit sent, then evicted from the pool while the worker slept (a laptop's lid closed), and
    meanwhile the run moved past S_max: a replacement could only land a revert (it did: gas for nothing). None
    is sent; with none of its hashes pending or mined the wait ends with the contract's reason at once, as a
    fresh estimate gives it, and nothing of the account is mined."""
    env = held
    rpc = env.w3.provider.make_request
    client = _worker(env, monkeypatch, FeeBumpPolicy(check_s=0.05, after_s=0.2), receipt_timeout_s=60.0)
    worker = env.addr(env.WORKERS[0])

    def on_send(count, fields):
        if count == 1 and fields is not None:
            rpc("anvil_dropTransaction", ["0x" + bytes(fields["hash"]).hex()])
            rpc("evm_setAutomine", [True])
            for v in (1, 2, 3):  # max_staleness 2: a commit at version 0 is refused from version 3 on
                env.coordinator.publish_version(RUN_ID, v, digest(f"manifest-{v}"), digest(f"record-{v}"))
        return None

    sent = _record_sends(env, monkeypatch, client, on_send)
    mined = env.w3.eth.get_transaction_count(worker)
    with pytest.raises(E.CommitVersionTooStale):
        client.commit(RUN_ID, 0, 0, digest("asleep"))
    assert len(sent) == 1, "replaced: a revert landed"
    assert env.w3.eth.get_transaction_count(worker) == mined  # no gas spent
    assert client.commit(RUN_ID, 3, 0, digest("awake")).block_number  # the nonce book goes on from the chain


def test_a_pending_write_the_chain_now_refuses_is_still_replaced_while_it_holds_its_nonce(staked, held, monkeypatch):
    """A commit the run moved past while it stayed in the pool (a node that keeps a write under the base fee,
    as geth does, here one queued behind a nonce gap): not replaced, it held its nonce and every later write of
    the account behind it until the wait timed out; replaced, it lands as a revert and frees the nonce."""
    env = held
    rpc = env.w3.provider.make_request
    client = _worker(env, monkeypatch, FeeBumpPolicy(check_s=0.05, after_s=0.2), receipt_timeout_s=2.0)
    sender = client._tx.address
    # One past the account's next nonce: the node keeps the commit queued, never mined, whatever the blocks.
    monkeypatch.setitem(client._tx.nonces._next, sender, env.w3.eth.get_transaction_count(sender, "pending") + 1)

    def on_send(count, fields):
        if count == 1 and fields is not None:
            rpc("evm_setAutomine", [True])
            for v in (1, 2, 3):  # max_staleness 2: a commit at version 0 is refused from version 3 on
                env.coordinator.publish_version(RUN_ID, v, digest(f"manifest-{v}"), digest(f"record-{v}"))
        return None

    sent = _record_sends(env, monkeypatch, client, on_send)
    with pytest.raises(ReceiptTimeout):
        client.commit(RUN_ID, 0, 0, digest("queued"))
    assert len(sent) >= 2, "not replaced: its nonce stays held"
    assert {s["nonce"] for s in sent} == {sent[0]["nonce"]}
    assert sent[1]["maxFeePerGas"] > sent[0]["maxFeePerGas"]
