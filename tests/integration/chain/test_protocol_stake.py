"""KrillProtocol stake, unbonding, withdrawal and administration, on py-evm and on Anvil."""

from __future__ import annotations

import pytest
from chain_constants import MIN_VERIFIER, MIN_WORKER, UNBONDING, key_of

from krill.chain import errors as E
from krill.chain.events import MinimumStakeSet, Staked, UnbondingBlocksSet, UnstakeRequested, Withdrawn
from krill.chain.types import Role


def test_stake_records_role_key_and_moves_tokens(env):
    w = env.at(2)
    before = env.token(2).balance_of(env.addr(2))
    receipt = w.stake(Role.WORKER, MIN_WORKER, key_of(2))
    event = receipt.event(Staked)
    assert (event.account, event.role, event.amount, event.staked) == (env.addr(2), Role.WORKER, MIN_WORKER, MIN_WORKER)
    assert event.ed25519_public_key == key_of(2)
    info = w.stake_of(env.addr(2))
    assert (info.role, info.jailed, info.ed25519_public_key, info.staked, info.unbonding) == (
        Role.WORKER, False, key_of(2), MIN_WORKER, 0)
    assert env.token(2).balance_of(env.addr(2)) == before - MIN_WORKER
    assert w.total_staked() == MIN_WORKER
    assert w.is_eligible(env.addr(2), Role.WORKER)
    assert not w.is_eligible(env.addr(2), Role.VERIFIER)


def test_top_up_adds_to_stake(env):
    w = env.at(5)
    w.stake(Role.VERIFIER, MIN_VERIFIER, key_of(5))
    receipt = w.stake(Role.VERIFIER, 7, key_of(5))
    assert receipt.event(Staked).staked == MIN_VERIFIER + 7
    assert w.stake_of(env.addr(5)).staked == MIN_VERIFIER + 7


def test_stake_rejects_bad_role_amount_key(env):
    w = env.at(2)
    with pytest.raises(E.StakeInvalidRole) as err:
        w.stake(3, MIN_WORKER, key_of(2))
    assert err.value.revert_args == (3,)
    with pytest.raises(E.StakeInvalidRole):
        w.stake(0, MIN_WORKER, key_of(2))
    with pytest.raises(E.StakeZeroAmount):
        w.stake(Role.WORKER, 0, key_of(2))
    with pytest.raises(E.StakeZeroKey):
        w.stake(Role.WORKER, MIN_WORKER, b"\x00" * 32)
    with pytest.raises(E.StakeBelowMinimum) as err:
        w.stake(Role.WORKER, MIN_WORKER - 1, key_of(2))
    assert err.value.revert_args == (Role.WORKER, MIN_WORKER - 1, MIN_WORKER)


def test_role_and_key_are_fixed_by_the_first_stake(env):
    w = env.at(2)
    w.stake(Role.WORKER, MIN_WORKER, key_of(2))
    with pytest.raises(E.StakeRoleMismatch) as err:
        w.stake(Role.VERIFIER, MIN_VERIFIER, key_of(2))
    assert err.value.revert_args == (env.addr(2), Role.WORKER, Role.VERIFIER)
    with pytest.raises(E.StakeKeyMismatch) as err:
        w.stake(Role.WORKER, 1, key_of(99))
    assert err.value.revert_args == (env.addr(2), key_of(2), key_of(99))
    assert err.value.named_args["given"] == key_of(99)


def test_stake_without_allowance_reverts_with_token_error(env):
    w = env.at(2)
    env.token(2).approve(env.deployment.protocol, 0)
    with pytest.raises(E.ERC20InsufficientAllowance) as err:
        w.stake(Role.WORKER, MIN_WORKER, key_of(2))
    assert err.value.revert_args == (env.deployment.protocol, 0, MIN_WORKER)


def test_unstake_then_withdraw_after_unbonding(env):
    w = env.at(2)
    w.stake(Role.WORKER, MIN_WORKER * 2, key_of(2))
    balance = env.token(2).balance_of(env.addr(2))
    receipt = w.request_unstake(MIN_WORKER)
    event = receipt.event(UnstakeRequested)
    assert (event.amount, event.unbonding, event.release_block) == (MIN_WORKER, MIN_WORKER,
                                                                    receipt.block_number + UNBONDING)
    info = w.stake_of(env.addr(2))
    assert (info.staked, info.unbonding, info.release_block) == (MIN_WORKER, MIN_WORKER, event.release_block)
    assert (w.total_staked(), w.total_unbonding()) == (MIN_WORKER, MIN_WORKER)
    with pytest.raises(E.StakeStillUnbonding) as err:
        w.withdraw()
    assert err.value.revert_args[:2] == (env.addr(2), event.release_block)
    # The withdrawal transaction lands in the next block: mine up to one block before release.
    env.mine(event.release_block - env.block() - 2)
    with pytest.raises(E.StakeStillUnbonding):
        w.withdraw()
    env.mine(1)
    out = w.withdraw()
    assert out.block_number == event.release_block
    assert out.event(Withdrawn).amount == MIN_WORKER
    assert env.token(2).balance_of(env.addr(2)) == balance + MIN_WORKER
    assert w.stake_of(env.addr(2)).unbonding == 0
    assert w.total_unbonding() == 0
    with pytest.raises(E.StakeNothingUnbonding) as err:
        w.withdraw()
    assert err.value.revert_args == (env.addr(2),)


def test_unstake_below_minimum_removes_eligibility_and_restarts_release(env):
    w = env.at(2)
    w.stake(Role.WORKER, MIN_WORKER, key_of(2))
    first = w.request_unstake(1).event(UnstakeRequested)
    assert not w.is_eligible(env.addr(2), Role.WORKER)
    env.mine(3)
    second = w.request_unstake(2).event(UnstakeRequested)
    assert second.unbonding == 3
    assert second.release_block > first.release_block
    with pytest.raises(E.StakeZeroAmount):
        w.request_unstake(0)
    with pytest.raises(E.StakeInsufficient) as err:
        w.request_unstake(MIN_WORKER)
    assert err.value.revert_args == (env.addr(2), MIN_WORKER - 3, MIN_WORKER)


def test_admin_sets_minimum_stake_and_unbonding(env):
    admin = env.admin
    assert admin.set_minimum_stake(Role.VERIFIER, 5).event(MinimumStakeSet).amount == 5
    assert admin.minimum_stake(Role.VERIFIER) == 5
    with pytest.raises(E.StakeInvalidRole):
        admin.set_minimum_stake(7, 5)
    assert admin.set_unbonding_blocks(UNBONDING + 5).event(UnbondingBlocksSet).blocks == UNBONDING + 5
    assert admin.unbonding_blocks() == UNBONDING + 5
    window = admin.max_challenge_window()
    assert window == env.params.challenge_window_blocks
    with pytest.raises(E.ProtocolUnbondingTooShort) as err:
        admin.set_unbonding_blocks(window)
    assert err.value.revert_args == (window, window)


def test_only_admin_administers(env):
    outsider = env.at(env.OUTSIDER)
    default_admin = env.admin.default_admin_role()
    with pytest.raises(E.AccessControlUnauthorizedAccount) as err:
        outsider.set_minimum_stake(Role.WORKER, 1)
    assert err.value.revert_args == (env.addr(env.OUTSIDER), default_admin)
    with pytest.raises(E.AccessControlUnauthorizedAccount):
        outsider.set_unbonding_blocks(1_000)
    with pytest.raises(E.AccessControlUnauthorizedAccount):
        outsider.grant_role(env.admin.run_admin_role(), env.addr(env.OUTSIDER))
    with pytest.raises(E.AccessControlBadConfirmation):
        outsider.renounce_role(default_admin, env.addr(env.ADMIN))


def test_roles_can_be_granted_revoked_and_renounced(env):
    role = env.admin.run_admin_role()
    who = env.addr(env.OUTSIDER)
    env.admin.grant_role(role, who)
    assert env.admin.has_role(role, who)
    assert env.admin.get_role_admin(role) == env.admin.default_admin_role()
    env.admin.revoke_role(role, who)
    assert not env.admin.has_role(role, who)
    env.admin.grant_role(role, who)
    env.at(env.OUTSIDER).renounce_role(role, who)
    assert not env.admin.has_role(role, who)
    assert env.admin.supports_interface(bytes.fromhex("7965db0b"))  # IAccessControl


def test_views_and_constants(env):
    c = env.admin.constants()
    assert c == {"ROLE_WORKER": 1, "ROLE_VERIFIER": 2, "MAX_ATTESTATIONS": 32, "MAX_SETTLE_BATCH": 64,
                 "BPS": 10_000, "PPM": 1_000_000}
    assert env.admin.token_address() == env.deployment.token
    assert env.admin.minimum_stake(Role.WORKER) == MIN_WORKER
    assert env.admin.stake_of(env.addr(env.OUTSIDER)).role == 0


def test_http_client_asks_the_chain_id_once_per_thread(env):
    """web3's validation middleware wants the chain id around every call and estimate; over HTTP
    it is asked once and cached, so a view call is one round trip (`connect_http`)."""
    if env.backend != "anvil":
        pytest.skip("request caching is a property of the HTTP provider")
    provider, sent = env.w3.provider, []
    original = provider._make_request

    def counting(method, params):
        sent.append(method)
        return original(method, params)

    provider._make_request = counting
    try:
        w = env.at(2)
        for _ in range(3):
            w.stake_of(env.addr(2))
        w.stake(Role.WORKER, MIN_WORKER, key_of(2))
    finally:
        provider._make_request = original
    assert sent.count("eth_call") >= 3 and "eth_estimateGas" in sent
    assert sent.count("eth_chainId") <= 1, sent
