"""The receipt wait: found as soon as the transaction is mined, a clear timeout when it never is."""

from __future__ import annotations

import time

import pytest
from web3.exceptions import TimeExhausted, TransactionIndexingInProgress

from krill.chain.rpc import connect_in_process, dev_account
from krill.chain.tx import Transactor


def test_receipt_of_a_mined_transfer_is_returned():
    w3 = connect_in_process(accounts=2)
    sender, receiver = dev_account(0), dev_account(1)
    tx = Transactor(w3, sender)
    receipt = tx._send(lambda params: {**params, "to": receiver.address, "value": 1}, "transfer")
    assert receipt.gas_used == 21_000
    assert receipt.block_number == w3.eth.block_number
    assert w3.eth.get_transaction(receipt.transaction_hash)["value"] == 1


def test_a_transaction_never_mined_times_out_naming_it():
    tx = Transactor(connect_in_process(accounts=1), dev_account(0), receipt_timeout_s=0.1)
    started = time.monotonic()
    with pytest.raises(TimeExhausted, match=r"commit: transaction 0x(ab){32} is not in the chain after 0.1 seconds"):
        tx._wait_receipt(bytes.fromhex("ab" * 32), "commit")
    assert time.monotonic() - started < 2.0


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
