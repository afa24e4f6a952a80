"""A rival transaction mined in the same block as ours, ahead of it: front-runs and state races on Anvil.

Design decisions:
- Our client's transaction passes its gas estimate against the state before the rival; the rival is
  then sent with a ten times higher tip while Anvil's automining is paused, and one block mines
  both, the rival's first. That is how a front-runner who copies a transaction from the mempool,
  or a `publishVersion` landing just ahead of a commit it makes stale, looks to the client.
- Test-only (no role imports it); it patches the client's transactor through `monkeypatch`, so the
  patch ends with the test. Automining is turned back on whatever fails (the rival's send, ours):
  left off, the shared node hung every later test that waits for a receipt.
"""

from __future__ import annotations

from krill.chain.view_codec import function_codecs


def beaten_in_one_block(w3, protocol: str, monkeypatch, client, rival, name: str, args: tuple) -> None:
    """Make `client`'s next transaction pass its estimate, then have `rival` send `name(args)` to the
    contract at `protocol` with a ten times higher tip before it is sent, and mine both in one block."""
    ours = client._tx
    estimate, send_raw = ours._gas_limit, ours._send_raw

    def estimate_then_rival(probe, what):
        gas = estimate(probe, what)
        w3.provider.make_request("evm_setAutomine", [False])
        try:
            theirs = rival._tx
            fees = {k: 10 * v for k, v in ours._fees().items()}
            tx = {"from": theirs.address, "to": protocol, "value": 0, "gas": 500_000,
                  "data": function_codecs("KrillProtocol")[name].calldata(args), "chainId": w3.eth.chain_id,
                  **fees, "nonce": theirs.nonces.take(w3, theirs.address, theirs.retry)}
            theirs._send_raw(theirs.account.sign_transaction(tx).raw_transaction, f"rival {name}")
        except BaseException:  # the shared node must not be left paused for the tests after this one
            w3.provider.make_request("evm_setAutomine", [True])
            raise
        return gas

    def send_then_mine(raw, what):
        try:
            return send_raw(raw, what)
        finally:  # ours refused too: the rival is mined all the same, and the node automines again
            try:
                w3.provider.make_request("evm_mine", [])
            finally:
                w3.provider.make_request("evm_setAutomine", [True])

    monkeypatch.setattr(ours, "_gas_limit", estimate_then_rival)
    monkeypatch.setattr(ours, "_send_raw", send_then_mine)
