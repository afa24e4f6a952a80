"""A malicious token recipient re-entering KrillProtocol is stopped by the reentrancy guard.

The protocol is deployed over `ReentrantToken` (test only), which calls the recipient back on
every transfer; `ReentrantReceiver` uses that call to re-enter `claim` or `withdraw` while the
first call is still paying it.
"""

from __future__ import annotations

import pytest
from chain_constants import RUN_ID, digest, key_of

from krill.chain import errors as E
from krill.chain.artifacts import load_artifact
from krill.chain.client import KrillChain
from krill.chain.deploy import TOKEN, deploy_contract
from krill.chain.tx import Transactor
from krill.chain.types import RunParams

REENTRY_CLAIM, REENTRY_WITHDRAW = 1, 2


def send(tx: Transactor, function, what: str):
    """Send a web3 ContractFunction of a test contract through the Transactor."""
    return tx.transact(function.address, function._encode_transaction_data(), what)


@pytest.fixture
def attack(env):
    admin = env.accounts[env.ADMIN]
    token = deploy_contract(env.w3, admin, "ReentrantToken", 1_000_000 * TOKEN).contract_address
    protocol = deploy_contract(env.w3, admin, "KrillProtocol", token, admin.address, 100 * TOKEN, 100 * TOKEN,
                               5).contract_address
    receiver = deploy_contract(env.w3, admin, "ReentrantReceiver", protocol, token).contract_address
    tx = Transactor(env.w3, admin)
    token_c = env.w3.eth.contract(address=token, abi=list(load_artifact("ReentrantToken").abi))
    receiver_c = env.w3.eth.contract(address=receiver, abi=list(load_artifact("ReentrantReceiver").abi))
    chain = KrillChain(env.w3, protocol, admin)
    send(tx, token_c.functions.approve(protocol, 2**256 - 1), "approve")
    params = RunParams(coordinator=admin.address, max_staleness=1, attestation_quorum=1, slash_fraction_bps=0,
                       verifier_bounty_bps=0, check_probability_ppm=0, challenge_window_blocks=2,
                       reward_per_version=1_000 * TOKEN)
    chain.create_run(RUN_ID, digest("base"), params)
    chain.fund_rewards(RUN_ID, 1_000 * TOKEN)
    return env, tx, chain, token_c, receiver_c


def test_reentrant_claim_is_rejected(attack):
    env, tx, chain, token_c, receiver_c = attack
    receiver = receiver_c.address
    chain.publish_version(RUN_ID, 1, digest("m1"), digest("r1"))
    chain.settle(RUN_ID, 1, [receiver], [300 * TOKEN])
    send(tx, receiver_c.functions.arm(REENTRY_CLAIM, False), "arm")
    with pytest.raises(E.ReentrancyGuardReentrantCall):
        send(tx, receiver_c.functions.claim(), "attack claim")
    assert chain.claimable_of(receiver) == 300 * TOKEN

    # Swallowing the failed re-entry: the outer claim pays exactly once.
    send(tx, receiver_c.functions.arm(REENTRY_CLAIM, True), "arm")
    send(tx, receiver_c.functions.claim(), "attack claim")
    assert token_c.functions.balanceOf(receiver).call() == 300 * TOKEN
    assert chain.claimable_of(receiver) == 0 and chain.total_claimable() == 0
    blocked = bytes(receiver_c.functions.lastRevertData().call())
    assert blocked == E.ReentrancyGuardReentrantCall.selector
    assert receiver_c.functions.hookCalls().call() == 1


def test_reentrant_withdraw_is_rejected(attack):
    env, tx, chain, token_c, receiver_c = attack
    receiver = receiver_c.address
    send(tx, token_c.functions.transfer(receiver, 200 * TOKEN), "fund attacker")
    send(tx, receiver_c.functions.stakeAsWorker(200 * TOKEN, key_of(9)), "stake")
    send(tx, receiver_c.functions.requestUnstake(100 * TOKEN), "unstake")
    env.mine(6)
    send(tx, receiver_c.functions.arm(REENTRY_WITHDRAW, False), "arm")
    with pytest.raises(E.ReentrancyGuardReentrantCall):
        send(tx, receiver_c.functions.withdraw(), "attack withdraw")
    send(tx, receiver_c.functions.arm(REENTRY_WITHDRAW, True), "arm")
    send(tx, receiver_c.functions.withdraw(), "attack withdraw")
    assert token_c.functions.balanceOf(receiver).call() == 100 * TOKEN
    info = chain.stake_of(receiver)
    assert (info.staked, info.unbonding) == (100 * TOKEN, 0)
    assert chain.total_unbonding() == 0
    assert bytes(receiver_c.functions.lastRevertData().call()) == E.ReentrancyGuardReentrantCall.selector


def test_a_payout_cannot_reenter_the_other_payout(attack):
    """Cross-function: claim's payment re-entering withdraw, and withdraw's re-entering claim, are refused
    by the one guard both share; each payout is paid once and the protocol still holds exactly its books."""
    env, tx, chain, token_c, receiver_c = attack
    receiver = receiver_c.address
    chain.publish_version(RUN_ID, 1, digest("m1"), digest("r1"))
    chain.settle(RUN_ID, 1, [receiver], [300 * TOKEN])
    send(tx, token_c.functions.transfer(receiver, 200 * TOKEN), "fund attacker")
    send(tx, receiver_c.functions.stakeAsWorker(200 * TOKEN, key_of(9)), "stake")
    send(tx, receiver_c.functions.requestUnstake(100 * TOKEN), "unstake")
    env.mine(6)
    send(tx, receiver_c.functions.arm(REENTRY_WITHDRAW, True), "arm")
    send(tx, receiver_c.functions.claim(), "claim, re-entering withdraw")
    assert bytes(receiver_c.functions.lastRevertData().call()) == E.ReentrancyGuardReentrantCall.selector
    assert token_c.functions.balanceOf(receiver).call() == 300 * TOKEN
    assert chain.stake_of(receiver).unbonding == 100 * TOKEN
    send(tx, receiver_c.functions.arm(REENTRY_CLAIM, True), "arm")
    send(tx, receiver_c.functions.withdraw(), "withdraw, re-entering claim")
    assert bytes(receiver_c.functions.lastRevertData().call()) == E.ReentrancyGuardReentrantCall.selector
    assert token_c.functions.balanceOf(receiver).call() == 400 * TOKEN
    held = token_c.functions.balanceOf(chain.address).call()
    assert held == chain.total_staked() + chain.total_unbonding() + chain.total_reward_pools() + chain.total_claimable()
