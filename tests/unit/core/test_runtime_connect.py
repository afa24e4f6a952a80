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


def test_a_roles_send_settings_reach_every_client_it_makes(monkeypatch):
    """Before: every role sent its writes on the built-in policy (120 s receipt timeout, replacements capped
    at 4x the first maxFee); `chain.receipt_timeout_s` and `chain.fee_bump_*` now reach the protocol client,
    the token client and any client made for another account over the same connection."""
    from krill.chain import rpc
    from krill.chain.deploy import deploy
    from krill.chain.tx import FeeBumpPolicy, SendPolicy
    from krill.runtime import connect_chain

    w3 = rpc.connect_in_process(accounts=2)
    monkeypatch.setattr(rpc, "connect_http", lambda url, timeout_s=10.0: w3)
    deployment = deploy(w3, rpc.dev_account(0))
    config = load_config(None, [f"chain.protocol_address={deployment.protocol}", "chain.receipt_timeout_s=45",
                                "chain.fee_bump_after_s=12.5", "chain.fee_bump_cap_factor=2",
                                "chain.fee_bump_cap_gwei=0.7"], environ={})
    expected = SendPolicy(receipt_timeout_s=45.0, bump=FeeBumpPolicy(after_s=12.5, cap_factor=2.0, cap_wei=700_000_000))
    chain = connect_chain(config, rpc.dev_account(0))
    other = chain.as_account(rpc.dev_account(1))
    for client in (chain, chain.token, other, other.token):
        assert client._tx.policy == expected
        assert (client._tx.receipt_timeout_s, client._tx.bump) == (45.0, expected.bump)
    default = connect_chain(load_config(None, [f"chain.protocol_address={deployment.protocol}"], environ={}))
    assert default._tx.policy == SendPolicy() and default.token._tx.policy == SendPolicy()


@pytest.mark.parametrize("setting", ["chain.receipt_timeout_s=0", "chain.fee_bump_after_s=-1",
                                     "chain.fee_bump_cap_factor=0.5", "chain.fee_bump_cap_gwei=0",
                                     "chain.fee_bump_cap_gwei=nan"])
def test_send_settings_out_of_bounds_are_refused_naming_the_key(setting):
    key = setting.split("=")[0]
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [setting], environ={})
