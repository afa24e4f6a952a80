"""Resending after a lost reply: a transaction that landed counts as sent, whatever the node says to the resend."""

from __future__ import annotations

import pytest
import requests
from web3.exceptions import Web3RPCError

from krill.chain.rpc import RetryPolicy, connect_in_process, dev_account
from krill.chain.tx import NONCE_RETAKES, Transactor

RETRY = RetryPolicy(attempts=3, initial_delay_s=0.0)


def _transfer(params: dict) -> dict:
    return {**params, "to": dev_account(1).address, "value": 1}


@pytest.mark.parametrize("refusal", ["py-evm", "anvil", "anvil-pending", "geth-pending"])
def test_a_resend_refused_for_its_nonce_counts_as_sent_when_the_first_send_landed(monkeypatch, refusal):
    """The first send reaches the node and is mined (or pooled), but its reply is lost (a read timeout,
    retried as transient); the resend is refused, in each node's words, because of this very transaction."""
    w3 = connect_in_process(accounts=2)
    tx = Transactor(w3, dev_account(0), retry=RETRY)
    real = w3.eth.send_raw_transaction
    sends = []

    def reply_lost_once(raw):
        sends.append(raw)
        if len(sends) == 1:
            real(raw)  # reaches the node and is mined
            raise requests.ReadTimeout("read timed out")
        if refusal == "anvil":  # what Anvil (and geth) answer, through web3
            raise Web3RPCError("{'code': -32003, 'message': 'nonce too low'}")
        if refusal == "anvil-pending":  # Anvil with a block time, while the first send is in its pool
            raise Web3RPCError("{'code': -32003, 'message': 'transaction already imported'}")
        if refusal == "geth-pending":
            raise Web3RPCError("{'code': -32000, 'message': 'already known'}")
        return real(raw)  # py-evm's own refusal: "Invalid transaction nonce: Expected 1, but got 0"

    monkeypatch.setattr(w3.eth, "send_raw_transaction", reply_lost_once)
    before = w3.eth.get_balance(dev_account(1).address)
    receipt = tx._send(_transfer, "transfer")
    assert len(sends) == 2 and sends[0] == sends[1]
    assert receipt.gas_used == 21_000 and w3.eth.get_transaction(receipt.transaction_hash)["nonce"] == 0
    assert w3.eth.get_balance(dev_account(1).address) == before + 1  # sent once
    assert tx.nonces.take(w3, dev_account(0).address, RETRY) == 1  # the book moved on; nothing was forgotten


def test_a_resend_refused_for_a_nonce_another_transaction_used_is_sent_again_with_the_next_nonce(monkeypatch):
    """The first send never arrived, and meanwhile another transaction of the account took the nonce: the
    resend's refusal does not count as sent (the node lacks the transaction), and the write is signed again
    with the next nonce and lands once."""
    import krill.chain.tx

    monkeypatch.setattr(krill.chain.tx, "LOOKUP_GRACE_S", 0.2)  # the refused resend is looked up this long
    w3 = connect_in_process(accounts=2)
    sender = dev_account(0)
    tx = Transactor(w3, sender, retry=RETRY)
    real = w3.eth.send_raw_transaction
    sends = []

    def lost_while_another_lands(raw):
        sends.append(raw)
        if len(sends) == 1:
            fields = {"from": sender.address, "to": sender.address, "value": 0, "gas": 21_000, "nonce": 0,
                      "chainId": w3.eth.chain_id, "maxFeePerGas": 10**10, "maxPriorityFeePerGas": 10**9}
            real(sender.sign_transaction(fields).raw_transaction)
            raise requests.ReadTimeout("read timed out")
        return real(raw)

    monkeypatch.setattr(w3.eth, "send_raw_transaction", lost_while_another_lands)
    before = w3.eth.get_balance(dev_account(1).address)
    receipt = tx._send(_transfer, "transfer")
    assert len(sends) == 3 and sends[1] == sends[0] and sends[2] != sends[0]  # resent, then signed anew
    assert w3.eth.get_transaction(receipt.transaction_hash)["nonce"] == 1
    assert w3.eth.get_balance(dev_account(1).address) == before + 1  # sent once
    assert tx.nonces.take(w3, sender.address, RETRY) == 2


def test_a_refused_resend_that_the_lookups_see_only_late_counts_as_sent(monkeypatch):
    """The first send lands but its reply is lost; the resend is refused ("nonce too low") by a node whose hash
    and receipt lookups lag (a load-balanced endpoint's back ends): it is looked up again for a short while
    and counts as sent, never signed again under a fresh nonce (a single look sent the write twice)."""
    from web3.exceptions import TransactionNotFound

    w3 = connect_in_process(accounts=2)
    tx = Transactor(w3, dev_account(0), retry=RETRY)
    real_send, real_get, real_receipt = w3.eth.send_raw_transaction, w3.eth.get_transaction, \
        w3.eth.get_transaction_receipt
    sends, hidden = [], []

    def reply_lost_once(raw):
        sends.append(raw)
        if len(sends) == 1:
            real_send(raw)
            raise requests.ReadTimeout("read timed out")
        if raw == sends[0]:  # the node mined it
            raise Web3RPCError("{'code': -32003, 'message': 'nonce too low'}")
        return real_send(raw)  # the same write signed again under a fresh nonce: a second transfer

    def lagging(real):
        def lookup(tx_hash):
            if len(hidden) < 4:
                hidden.append(tx_hash)
                raise TransactionNotFound(f"transaction {tx_hash!r} not found")
            return real(tx_hash)
        return lookup

    monkeypatch.setattr(w3.eth, "send_raw_transaction", reply_lost_once)
    monkeypatch.setattr(w3.eth, "get_transaction", lagging(real_get))
    monkeypatch.setattr(w3.eth, "get_transaction_receipt", lagging(real_receipt))
    before = w3.eth.get_balance(dev_account(1).address)
    receipt = tx._send(_transfer, "transfer")
    assert w3.eth.get_balance(dev_account(1).address) == before + 1  # sent once
    assert len(sends) == 2 and sends[0] == sends[1] and len(hidden) == 4
    assert real_get(receipt.transaction_hash)["nonce"] == 0 and w3.eth.get_transaction_count(dev_account(0).address) == 1


def test_a_send_refused_for_its_nonce_every_time_gives_up_after_the_retakes(monkeypatch):
    w3 = connect_in_process(accounts=2)
    tx = Transactor(w3, dev_account(0), retry=RETRY)
    sends = []

    def always_too_low(raw):
        sends.append(raw)
        raise Web3RPCError("{'code': -32003, 'message': 'nonce too low'}")

    monkeypatch.setattr(w3.eth, "send_raw_transaction", always_too_low)
    with pytest.raises(Web3RPCError, match="nonce too low"):
        tx._send(_transfer, "transfer")
    assert len(sends) == NONCE_RETAKES + 1
    assert tx.nonces._next == {}  # forgotten: the next send reads the nonce from the chain again


def test_a_refusal_for_another_reason_is_raised_without_a_new_nonce(monkeypatch):
    w3 = connect_in_process(accounts=2)
    tx = Transactor(w3, dev_account(0), retry=RETRY)
    sends = []

    def no_funds(raw):
        sends.append(raw)
        raise Web3RPCError("{'code': -32003, 'message': 'insufficient funds for gas * price + value'}")

    monkeypatch.setattr(w3.eth, "send_raw_transaction", no_funds)
    with pytest.raises(Web3RPCError, match="insufficient funds"):
        tx._send(_transfer, "transfer")
    assert len(sends) == 1 and tx.nonces._next == {}
