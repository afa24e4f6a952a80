"""Another sender on the same key (another process, with its own nonce book) takes nonces this client's book
does not know: the refused write is signed again with the next nonce and lands once."""

from __future__ import annotations

from krill.chain.tx import NonceBook, Transactor
from krill.chain.view_codec import function_codecs


def test_a_write_whose_nonce_another_process_took_is_sent_again_with_the_next_nonce(env):
    admin = env.token(env.ADMIN)
    outsider = env.addr(env.OUTSIDER)
    other_process = Transactor(env.w3, env.accounts[env.ADMIN])
    other_process.nonces = NonceBook()  # a second process on the admin's key: its own book
    before = admin.balance_of(outsider)
    admin.transfer(outsider, 1)  # this client's book now holds the admin's next nonce
    other_process.transact(admin.address, function_codecs("KrillToken")["transfer"].calldata((outsider, 2)), "transfer")
    receipt = admin.transfer(outsider, 4)  # its book's nonce was taken by the other process
    assert admin.balance_of(outsider) == before + 7  # each transfer landed, once
    sent = env.w3.eth.get_transaction(receipt.transaction_hash)
    assert sent["nonce"] == env.w3.eth.get_transaction_count(env.addr(env.ADMIN)) - 1
    admin.transfer(outsider, 8)  # the book goes on from the nonce it took again
    assert admin.balance_of(outsider) == before + 15
