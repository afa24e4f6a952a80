"""Every contract view, read through `krill.chain.view_codec`, returns what web3's contract call returns."""

from __future__ import annotations

import pytest
from chain_constants import RUN_ID, digest, key_of

from krill.chain import errors as E
from krill.chain.client import KrillChain
from krill.chain.events import Committed
from krill.chain.token import TokenClient
from krill.chain.view_codec import view_codecs
from krill.errors import ChainError


def _web3(client, name, *args):
    """The same view through web3's contract call (the reference)."""
    function = getattr(client._contract.functions, name)(*args)
    return client._tx.call(function.call, name)


def _protocol_calls(env, cid: int) -> list[tuple[str, tuple]]:
    worker, verifier = env.addr(2), env.addr(5)
    role = env.admin.run_admin_role()
    return [
        ("BPS", ()), ("PPM", ()), ("MAX_ATTESTATIONS", ()), ("MAX_SETTLE_BATCH", ()), ("ROLE_WORKER", ()),
        ("ROLE_VERIFIER", ()), ("DEFAULT_ADMIN_ROLE", ()), ("RUN_ADMIN_ROLE", ()), ("token", ()),
        ("unbondingBlocks", ()), ("maxChallengeWindow", ()), ("minimumStake", (1,)), ("minimumStake", (2,)),
        ("stakeOf", (worker,)), ("isEligible", (worker, 1)),
        ("isEligible", (verifier, 1)), ("runOf", (RUN_ID,)), ("versionOf", (RUN_ID, 0)), ("versionOf", (RUN_ID, 1)),
        ("commitCount", ()), ("commitOf", (cid,)), ("commitIdOf", (RUN_ID, worker, 0, 0)),
        ("commitIdByDigest", (digest("view"),)), ("randomnessOf", (cid,)), ("isCheckSelected", (cid, key_of(5))),
        ("attestationOf", (cid, verifier)), ("attestationOf", (cid, worker)), ("failingVerifiersOf", (cid,)),
        ("claimableOf", (worker,)), ("windowEndOf", (worker,)), ("totalStaked", ()), ("totalUnbonding", ()), ("totalRewardPools", ()),
        ("totalClaimable", ()), ("totalBurned", ()), ("hasRole", (role, env.addr(0))), ("getRoleAdmin", (role,)),
        ("supportsInterface", (bytes.fromhex("01ffc9a7"),)),
    ]


def test_every_view_reads_the_same_through_both_paths(staked):
    env = staked
    cid = env.at(2).commit(RUN_ID, 0, 0, digest("view")).event(Committed).commit_id
    env.mine(1)
    env.at(5).seal_randomness(cid)
    env.at(5).attest(cid, False, digest("evidence"))
    env.coordinator.publish_version(RUN_ID, 1, digest("manifest-1"), digest("record-1"))
    calls = _protocol_calls(env, cid)
    assert {name for name, _ in calls} == set(view_codecs("KrillProtocol"))  # every view is compared
    client = env.at(2)
    for name, args in calls:
        assert client._view(name, *args) == _web3(client, name, *args), name

    # web3 refuses an address without its checksum capitals; the codec reads it (a bad checksum is refused).
    assert client._view("stakeOf", env.addr(2).lower()) == client._view("stakeOf", env.addr(2))
    wrong = env.addr(2)[:2] + env.addr(2)[2:].swapcase()
    with pytest.raises(E.ChainInputError, match="wrong checksum"):
        client._view("stakeOf", wrong)
    with pytest.raises(E.ChainInputError, match="not a 0x-prefixed"):
        client._view("stakeOf", "0x1234")

    token, holder = env.token(2), env.addr(2)
    token_calls = [("name", ()), ("symbol", ()), ("decimals", ()), ("totalSupply", ()), ("balanceOf", (holder,)),
                   ("allowance", (holder, env.deployment.protocol)), ("DEFAULT_ADMIN_ROLE", ()), ("MINTER_ROLE", ()),
                   ("hasRole", (bytes(32), env.addr(0))), ("getRoleAdmin", (bytes(32),)),
                   ("supportsInterface", (bytes.fromhex("01ffc9a7"),))]
    assert {name for name, _ in token_calls} == set(view_codecs("KrillToken"))
    for name, args in token_calls:
        assert token._view(name, *args) == _web3(token, name, *args), name


def test_a_reverting_view_raises_the_same_error_through_both_paths(staked):
    env = staked
    client = env.at(2)
    for read in (lambda: client._view("isCheckSelected", 99, key_of(5)),
                 lambda: _web3(client, "isCheckSelected", 99, key_of(5))):
        with pytest.raises(E.CommitUnknown) as err:
            read()
        assert err.value.revert_args == (99,)


def test_a_view_of_an_address_without_a_contract_is_a_chain_error_naming_it(env):
    """An address without code answers every call with no data (a wrong address, or a devnet restarted under
    running roles): a ChainError that names the address, not eth_abi's bare decoding error."""
    nowhere = env.addr(env.OUTSIDER)  # an account, not a contract
    protocol = KrillChain(env.w3, nowhere, env.accounts[env.WORKERS[0]])
    for read in (protocol.commit_count, protocol.token_address, lambda: protocol.run_of(RUN_ID),
                 lambda: TokenClient(env.w3, nowhere).balance_of(nowhere)):
        with pytest.raises(ChainError, match=f"{nowhere}.*no contract at this address"):
            read()
