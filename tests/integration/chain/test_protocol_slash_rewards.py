"""KrillProtocol runs, slashing economics, versions, settlement and claims, on py-evm and on Anvil."""

from __future__ import annotations

from dataclasses import replace

import pytest
from chain_constants import (
    BASE_MANIFEST,
    CHALLENGE_WINDOW,
    MIN_WORKER,
    POOL,
    RUN_ID,
    TOKEN,
    UNBONDING,
    WIDE_RUN,
    digest,
)

from krill.chain import errors as E
from krill.chain.events import (
    Attested,
    BountyCredited,
    Claimed,
    Committed,
    ReleaseDelayed,
    RewardCredited,
    RewardsFunded,
    RunCreated,
    Slashed,
    UnstakeRequested,
    VersionPublished,
    VersionSettled,
    Withdrawn,
    WorkerJailed,
)
from krill.chain.types import Role


def _failed_commit(env, worker: int = 2, verifiers=(5, 6), label: str = "bad") -> int:
    cid = env.at(worker).commit(RUN_ID, 0, 0, digest(label)).event(Committed).commit_id
    for v in verifiers:
        env.at(v).attest(cid, False, digest(f"evidence-{v}"))
    return cid


def test_create_run_records_params_and_version_zero(env):
    run = env.admin.run_of(RUN_ID)
    assert run.exists and run.params == env.params and run.latest_version == 0 and run.reward_pool == POOL
    v0 = env.admin.version_of(RUN_ID, 0)
    assert (v0.manifest_digest, v0.settled) == (BASE_MANIFEST, True)
    receipt = env.admin.create_run(digest("run 2"), digest("base 2"), env.params)
    event = receipt.event(RunCreated)
    assert (event.run_id, event.coordinator, event.base_manifest_digest, event.params) == (
        digest("run 2"), env.params.coordinator, digest("base 2"), env.params)
    assert env.admin.run_of(digest("run 2")).created_block == receipt.block_number


@pytest.mark.parametrize(("change", "error", "args"), [
    ({"coordinator": "0x" + "0" * 40}, "RunZeroCoordinator", ()),
    ({"attestation_quorum": 0}, "RunParamOutOfRange", ("attestationQuorum", 0)),
    ({"attestation_quorum": 33}, "RunParamOutOfRange", ("attestationQuorum", 33)),
    ({"slash_fraction_bps": 10_001}, "RunParamOutOfRange", ("slashFractionBps", 10_001)),
    ({"verifier_bounty_bps": 10_001}, "RunParamOutOfRange", ("verifierBountyBps", 10_001)),
    ({"check_probability_ppm": 1_000_001}, "RunParamOutOfRange", ("checkProbabilityPpm", 1_000_001)),
    ({"challenge_window_blocks": 0}, "RunParamOutOfRange", ("challengeWindowBlocks", 0)),
    ({"challenge_window_blocks": 20}, "RunParamOutOfRange", ("challengeWindowBlocks", 20)),  # = unbonding
])
def test_create_run_validates_params(env, change, error, args):
    with pytest.raises(getattr(E, error)) as err:
        env.admin.create_run(digest("run 2"), digest("base"), replace(env.params, **change))
    assert err.value.revert_args == args


def test_create_run_rejects_bad_ids_and_outsiders(env):
    with pytest.raises(E.RunAlreadyExists) as err:
        env.admin.create_run(RUN_ID, digest("base"), env.params)
    assert err.value.revert_args == (RUN_ID,)
    with pytest.raises(E.RunZeroId):
        env.admin.create_run(b"\x00" * 32, digest("base"), env.params)
    with pytest.raises(E.RunZeroDigest):
        env.admin.create_run(digest("run 2"), b"\x00" * 32, env.params)
    with pytest.raises(E.AccessControlUnauthorizedAccount) as err:
        env.coordinator.create_run(digest("run 2"), digest("base"), env.params)
    assert err.value.revert_args == (env.addr(env.COORDINATOR), env.admin.run_admin_role())


def test_fund_rewards(env):
    event = env.at(env.OUTSIDER).fund_rewards(RUN_ID, 10).event(RewardsFunded)
    assert (event.funder, event.amount, event.reward_pool) == (env.addr(env.OUTSIDER), 10, POOL + 10)
    assert env.admin.total_reward_pools() == POOL + 10
    with pytest.raises(E.RunZeroFunding):
        env.admin.fund_rewards(RUN_ID, 0)
    with pytest.raises(E.RunUnknown):
        env.admin.fund_rewards(digest("nope"), 1)


def test_publish_version_is_coordinator_only_and_sequential(env):
    c = env.coordinator
    event = c.publish_version(RUN_ID, 1, digest("m1"), digest("r1")).event(VersionPublished)
    assert (event.version, event.manifest_digest, event.record_digest) == (1, digest("m1"), digest("r1"))
    v1 = c.version_of(RUN_ID, 1)
    assert (v1.manifest_digest, v1.record_digest, v1.published_block, v1.settled) == (
        digest("m1"), digest("r1"), event.block_number, False)
    assert c.run_of(RUN_ID).latest_version == 1
    with pytest.raises(E.VersionNotNext) as err:
        c.publish_version(RUN_ID, 3, digest("m3"), digest("r3"))
    assert err.value.revert_args == (RUN_ID, 3, 2)
    with pytest.raises(E.VersionNotNext):
        c.publish_version(RUN_ID, 1, digest("m1"), digest("r1"))
    with pytest.raises(E.RunZeroDigest):
        c.publish_version(RUN_ID, 2, b"\x00" * 32, digest("r2"))
    with pytest.raises(E.RunNotCoordinator) as err:
        env.admin.publish_version(RUN_ID, 2, digest("m2"), digest("r2"))
    assert err.value.revert_args == (RUN_ID, env.addr(env.ADMIN))


def test_slash_economics(staked):
    env = staked
    worker = env.addr(2)
    cid = _failed_commit(env, verifiers=(5, 6))
    env.at(2).request_unstake(MIN_WORKER + 50 * TOKEN)  # leaving after the commit: staked 50, unbonding 150
    supply = env.token(0).total_supply()
    receipt = env.coordinator.slash(cid)
    amount = 200 * TOKEN * 5_000 // 10_000
    bounty = amount * 2_000 // 10_000
    event = receipt.event(Slashed)
    assert (event.commit_id, event.worker, event.amount, event.bounty, event.burned) == (
        cid, worker, amount, bounty, amount - bounty)
    assert receipt.event(WorkerJailed).worker == worker
    assert [(b.verifier, b.amount) for b in receipt.events_of(BountyCredited)] == [
        (env.addr(5), bounty // 2), (env.addr(6), bounty // 2)]
    info = env.admin.stake_of(worker)
    assert (info.staked, info.unbonding, info.jailed) == (0, 100 * TOKEN, True)  # staked taken first
    assert env.token(0).total_supply() == supply - (amount - bounty)
    assert env.admin.total_burned() == amount - bounty
    assert env.admin.commit_of(cid).slashed
    assert env.admin.claimable_of(env.addr(5)) == bounty // 2
    with pytest.raises(E.SlashAlreadyDone) as err:
        env.coordinator.slash(cid)
    assert err.value.revert_args == (cid,)
    with pytest.raises(E.StakeJailed) as err:
        env.at(2).commit(RUN_ID, 0, 1, digest("after jail"))
    assert err.value.revert_args == (worker,)
    with pytest.raises(E.StakeJailed):
        env.at(2).stake(Role.WORKER, MIN_WORKER, env.admin.stake_of(worker).ed25519_public_key)
    balance = env.token(5).balance_of(env.addr(5))
    assert env.at(5).claim().event(Claimed).amount == bounty // 2
    assert env.token(5).balance_of(env.addr(5)) == balance + bounty // 2


def test_slash_reaches_unbonding_stake_and_burns_dust(staked):
    env = staked
    cid = _failed_commit(env, verifiers=(5, 6, 7))
    env.at(2).request_unstake(200 * TOKEN)  # everything unbonding
    event = env.coordinator.slash(cid).event(Slashed)
    amount = 100 * TOKEN
    share = (amount * 2_000 // 10_000) // 3
    assert (event.amount, event.bounty, event.burned) == (amount, share * 3, amount - share * 3)
    assert env.admin.stake_of(env.addr(2)).unbonding == 100 * TOKEN
    # The jailed worker still gets the rest of its unbonding stake back after release.
    release = env.admin.stake_of(env.addr(2)).release_block
    env.mine(max(0, release - env.block()))
    assert env.at(2).withdraw().events[0].amount == 100 * TOKEN


def test_a_worker_leaving_right_after_a_commit_stays_slashable_for_unbonding_after_its_window(staked):
    """Counted from the request alone, the release came unbondingBlocks - window blocks after the window
    closed (10 here): a worker could commit a forgery, unstake in the next block and withdraw before
    the coordinator's slash landed. The release now counts from the close of its latest commit's window."""
    env = staked
    worker = env.addr(2)
    committed = env.at(2).commit(RUN_ID, 0, 0, digest("forged")).event(Committed)
    window_end = committed.block_number + CHALLENGE_WINDOW
    assert env.admin.window_end_of(worker) == window_end and env.admin.window_end_of(env.addr(3)) == 0
    request = env.at(2).request_unstake(200 * TOKEN).event(UnstakeRequested)
    assert request.release_block == window_end + UNBONDING
    for v in (5, 6):
        env.at(v).attest(committed.commit_id, False, digest(f"evidence-{v}"))
    env.mine(window_end + UNBONDING - env.block() - 2)  # the last block before release: the slash still lands
    with pytest.raises(E.StakeStillUnbonding):
        env.at(2).withdraw()
    assert env.coordinator.slash(committed.commit_id).event(Slashed).amount == 100 * TOKEN
    env.mine(1)
    assert env.at(2).withdraw().event(Withdrawn).amount == 100 * TOKEN


def test_a_commit_while_stake_is_unbonding_delays_its_release(staked):
    env = staked
    worker = env.addr(2)
    request = env.at(2).request_unstake(50 * TOKEN).event(UnstakeRequested)  # 150 still staked: still eligible
    assert request.release_block == request.block_number + UNBONDING
    env.mine(UNBONDING - CHALLENGE_WINDOW + 3)  # a commit now has its window close after that release
    receipt = env.at(2).commit(RUN_ID, 0, 0, digest("while unbonding"))
    delayed = receipt.event(ReleaseDelayed)
    commit_block = receipt.event(Committed).block_number
    assert (delayed.account, delayed.commit_id, delayed.release_block) == (
        worker, receipt.event(Committed).commit_id, commit_block + CHALLENGE_WINDOW + UNBONDING)
    assert env.admin.stake_of(worker).release_block == delayed.release_block
    env.mine(request.release_block - env.block())
    with pytest.raises(E.StakeStillUnbonding) as err:
        env.at(2).withdraw()
    assert err.value.revert_args[1] == delayed.release_block
    early = env.at(3).commit(RUN_ID, 0, 0, digest("not unbonding"))  # nothing unbonding: nothing delayed
    assert not early.events_of(ReleaseDelayed)


def test_slash_requires_coordinator_and_quorum(staked):
    env = staked
    cid = _failed_commit(env, verifiers=(5,))
    env.at(6).attest(cid, True, digest("fine"))
    with pytest.raises(E.SlashQuorumNotReached) as err:
        env.coordinator.slash(cid)
    assert err.value.revert_args == (cid, 1, 2)
    env.at(7).attest(cid, False, digest("bad"))
    with pytest.raises(E.RunNotCoordinator) as err:
        env.at(5).slash(cid)
    assert err.value.revert_args == (RUN_ID, env.addr(5))
    with pytest.raises(E.CommitUnknown):
        env.coordinator.slash(42)
    env.coordinator.slash(cid)


@pytest.mark.slow
def test_passing_attestations_cannot_crowd_out_a_slash(crowd, staked):
    """A cheating worker's own verifiers fill the passing cap at once; honest failures still land and
    reach quorum (with one shared cap every failing verdict here was refused and no slash was possible)."""
    env = staked
    cid = env.at(2).commit(WIDE_RUN, 0, 0, digest("cheat")).event(Committed).commit_id
    for verifier in crowd[:32]:
        verifier.attest(cid, True, b"\x00" * 32)
    event = env.at(5).attest(cid, False, digest("evidence-5")).event(Attested)
    assert (event.pass_count, event.fail_count) == (32, 1)
    with pytest.raises(E.AttestationLimitReached) as err:
        crowd[32].attest(cid, True, b"\x00" * 32)
    assert err.value.revert_args == (cid, True, 32)
    with pytest.raises(E.SlashQuorumNotReached) as err:
        env.coordinator.slash(cid)
    assert err.value.revert_args == (cid, 1, 2)
    env.at(6).attest(cid, False, digest("evidence-6"))
    receipt = env.coordinator.slash(cid)
    assert (receipt.event(Slashed).worker, receipt.event(WorkerJailed).worker) == (env.addr(2), env.addr(2))
    assert [b.verifier for b in receipt.events_of(BountyCredited)] == [env.addr(5), env.addr(6)]
    info = env.admin.stake_of(env.addr(2))
    assert (info.staked, info.jailed) == (MIN_WORKER, True)  # half of twice the minimum taken


def test_settle_and_claim(staked):
    env = staked
    c = env.coordinator
    c.publish_version(RUN_ID, 1, digest("m1"), digest("r1"))
    accounts, amounts = [env.addr(2), env.addr(3), env.addr(2)], [100, 200, 50]
    receipt = c.settle(RUN_ID, 1, accounts, amounts)
    assert [(e.account, e.amount) for e in receipt.events_of(RewardCredited)] == list(zip(accounts, amounts,
                                                                                          strict=True))
    settled = receipt.event(VersionSettled)
    assert (settled.version, settled.accounts, settled.total) == (1, 3, 350)
    assert c.version_of(RUN_ID, 1).settled
    assert c.run_of(RUN_ID).reward_pool == POOL - 350
    assert (c.claimable_of(env.addr(2)), c.total_claimable()) == (150, 350)
    with pytest.raises(E.SettleAlreadyDone) as err:
        c.settle(RUN_ID, 1, [env.addr(2)], [1])
    assert err.value.revert_args == (RUN_ID, 1)
    balance = env.token(2).balance_of(env.addr(2))
    assert env.at(2).claim().event(Claimed).amount == 150
    assert env.token(2).balance_of(env.addr(2)) == balance + 150
    with pytest.raises(E.ClaimNothing) as err:
        env.at(2).claim()
    assert err.value.revert_args == (env.addr(2),)


def test_settle_rejects_bad_batches(staked):
    env = staked
    c = env.coordinator
    with pytest.raises(E.VersionNotPublished) as err:
        c.settle(RUN_ID, 1, [env.addr(2)], [1])
    assert err.value.revert_args == (RUN_ID, 1, 0)
    with pytest.raises(E.VersionNotPublished):
        c.settle(RUN_ID, 0, [env.addr(2)], [1])
    c.publish_version(RUN_ID, 1, digest("m1"), digest("r1"))
    with pytest.raises(E.SettleLengthMismatch) as err:
        c.settle(RUN_ID, 1, [env.addr(2)], [1, 2])
    assert err.value.revert_args == (1, 2)
    with pytest.raises(E.SettleBatchSize) as err:
        c.settle(RUN_ID, 1, [], [])
    assert err.value.revert_args == (0, 64)
    with pytest.raises(E.SettleBatchSize) as err:
        c.settle(RUN_ID, 1, [env.addr(2)] * 65, [1] * 65)
    assert err.value.revert_args == (65, 64)
    with pytest.raises(E.SettleZeroAccount) as err:
        c.settle(RUN_ID, 1, [env.addr(2), "0x" + "0" * 40], [1, 1])
    assert err.value.revert_args == (1,)
    cap = env.params.reward_per_version
    with pytest.raises(E.SettleExceedsRewardPerVersion) as err:
        c.settle(RUN_ID, 1, [env.addr(2)], [cap + 1])
    assert err.value.revert_args == (cap + 1, cap)
    with pytest.raises(E.RunNotCoordinator):
        env.admin.settle(RUN_ID, 1, [env.addr(2)], [1])
    run2 = digest("unfunded run")
    env.admin.create_run(run2, digest("base"), env.params)
    env.coordinator.publish_version(run2, 1, digest("m"), digest("r"))
    with pytest.raises(E.RunRewardPoolInsufficient) as err:
        c.settle(run2, 1, [env.addr(2)], [5])
    assert err.value.revert_args == (run2, 0, 5)
    c.settle(RUN_ID, 1, [env.addr(i) for i in range(64 % 10)] + [env.addr(2)] * 60, [1] * 64)
