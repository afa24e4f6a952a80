"""The receipt wait: found as soon as the transaction is mined, a clear timeout when it never is."""

from __future__ import annotations

import time

import pytest
from web3.exceptions import TimeExhausted, TransactionIndexingInProgress

from krill.chain.rpc import connect_in_process, dev_account
from krill.chain.tx import SendPolicy, Transactor


def test_receipt_of_a_mined_transfer_is_returned():
    w3 = connect_in_process(accounts=2)
    sender, receiver = dev_account(0), dev_account(1)
    tx = Transactor(w3, sender)
    receipt = tx._send(lambda params: {**params, "to": receiver.address, "value": 1}, "transfer")
    assert receipt.gas_used == 21_000
    assert receipt.block_number == w3.eth.block_number
    assert w3.eth.get_transaction(receipt.transaction_hash)["value"] == 1


def test_a_transaction_never_mined_times_out_naming_it():
    """The timeout is a Krill chain error (web3's `TimeExhausted` is no `KrillError`, and a coordinator
    pass whose publication was not mined in time stopped the coordinator on it) that handlers of
    `TimeExhausted` still match (the worker's back-off, the verifier's passing faults). It is no
    `ChainUnavailableError`, which aborts a verifier's whole pass rather than retrying that commit."""
    from krill.chain.tx import ReceiptTimeout
    from krill.errors import ChainError, ChainUnavailableError, KrillError

    tx = Transactor(connect_in_process(accounts=1), dev_account(0), policy=SendPolicy(receipt_timeout_s=0.1))
    started = time.monotonic()
    with pytest.raises(ReceiptTimeout, match=r"commit: transaction 0x(ab){32} is not in the chain after 0.1 seconds") \
            as caught:
        tx._wait_receipt(bytes.fromhex("ab" * 32), "commit")
    assert time.monotonic() - started < 2.0
    error = caught.value
    assert isinstance(error, ChainError) and isinstance(error, KrillError) and isinstance(error, TimeExhausted)
    assert not isinstance(error, ChainUnavailableError)
    assert error.transaction_hash == "0x" + "ab" * 32


def test_a_send_whose_receipt_never_comes_raises_the_krill_timeout_and_forgets_the_nonce(monkeypatch):
    """Through the whole write (`_send`): a node that mines nothing within the timeout."""
    from web3.exceptions import TransactionNotFound

    from krill.chain.tx import ReceiptTimeout

    w3 = connect_in_process(accounts=2)
    sender, receiver = dev_account(0), dev_account(1)
    tx = Transactor(w3, sender, policy=SendPolicy(receipt_timeout_s=0.05))

    def never_mined(tx_hash):
        raise TransactionNotFound(f"transaction {tx_hash!r} not found")

    monkeypatch.setattr(w3.eth, "get_transaction_receipt", never_mined)
    with pytest.raises(ReceiptTimeout, match="transfer: transaction 0x[0-9a-f]{64} is not in the chain"):
        tx._send(lambda params: {**params, "to": receiver.address, "value": 1}, "transfer")
    assert sender.address not in tx.nonces._next  # read from the chain again at the next send


def test_a_node_still_indexing_is_waited_for(monkeypatch):
    """A node that answers "indexing in progress" is asked again, as web3's own wait does."""
    w3 = connect_in_process(accounts=2)
    sender, receiver = dev_account(0), dev_account(1)
    tx = Transactor(w3, sender)
    real = w3.eth.get_transaction_receipt
    answers = iter([TransactionIndexingInProgress("transaction indexing is in progress")] * 2)

    def indexing_first(tx_hash):
        error = next(answers, None)
        if error is not None:
            raise error
        return real(tx_hash)

    monkeypatch.setattr(w3.eth, "get_transaction_receipt", indexing_first)
    receipt = tx._send(lambda params: {**params, "to": receiver.address, "value": 1}, "transfer")
    assert receipt.gas_used == 21_000 and next(answers, None) is None


def test_a_new_connection_never_inherits_the_nonces_of_a_collected_one():
    """The nonce book goes with its Web3 object. Keyed by `id(w3)`, a connection allocated where a
    collected one had been took over its nonces, and its first transaction to a fresh node was
    never mined (a worker fixture's deploy timed out after 120 s)."""
    import gc

    from web3 import Web3

    from krill.chain.tx import nonce_book

    seen, reused = set(), 0
    for _ in range(50):
        w3 = Web3()
        book = nonce_book(w3)
        assert book._next == {}, "a new connection started with another connection's nonces"
        reused += id(w3) in seen
        seen.add(id(w3))
        book._next["0x" + "11" * 20] = 5
        del w3, book
        gc.collect()
    assert reused, "no Web3 object was allocated where a collected one had been: the test did not exercise reuse"
