"""`krill.runtime.connect_chain`: what every command that talks to the chain meets first."""

from __future__ import annotations

import pytest

from krill.config import load_config
from krill.errors import ConfigError


def test_an_address_without_a_contract_is_refused_at_connect(monkeypatch):
    """Before: a protocol address with no code connected; `krill worker status` then died decoding the empty
    answer of `stakeOf` (eth_abi InsufficientDataBytes traceback) and `krill index sync` indexed the empty
    address, after which the right address's sync was refused until `krill index rebuild`."""
    from krill.chain import rpc
    from krill.chain.deploy import deploy
    from krill.runtime import connect_chain

    w3 = rpc.connect_in_process(accounts=1)
    monkeypatch.setattr(rpc, "connect_http", lambda url, timeout_s=10.0: w3)
    deployment = deploy(w3, rpc.dev_account(0))
    nobody = "0x0000000000000000000000000000000000000001"
    with pytest.raises(ConfigError, match=rf"no contract at chain\.protocol_address {nobody} .*chain id"):
        connect_chain(load_config(None, [f"chain.protocol_address={nobody}"], environ={}))
    with pytest.raises(ConfigError, match=rf"no contract at --protocol {nobody}"):
        connect_chain(load_config(None, [f"chain.protocol_address={nobody}"], environ={}), address_from="--protocol")
    chain = connect_chain(load_config(None, [f"chain.protocol_address={deployment.protocol}"], environ={}))
    assert chain.address == deployment.protocol and chain.token_address() == deployment.token
