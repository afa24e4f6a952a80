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
