"""The audit's judgement of when a slash came (`krill.audit.ledger.judge_slash`) against the contract's own
release rule, on py-evm, with the unbonding period changed by the admin around the commit.

The audit used to count the commit's deadline with the unbonding period in force when it ran: a period
raised after the worker's unstake request made a slash that came after the worker had withdrawn look on
time, and one lowered after the slash made an on-time slash look late.
"""

from __future__ import annotations

import types

import pytest
from chain_constants import CHALLENGE_WINDOW, RUN_ID, TOKEN, UNBONDING, digest

from krill.chain.events import Committed, Slashed, UnstakeRequested, Withdrawn

pytestmark = pytest.mark.parametrize("chain_session", ["py-evm"], indirect=True)

LATE = "when the stake behind it could already have left"


@pytest.fixture
def judge(monkeypatch):
    """`judge_slash` on a fresh audit of the test run, judging the slash's timing alone (the replay's
    verdict is stubbed: it fails the commit, so a slash in time stands)."""
    from krill.audit import ledger
    from krill.audit.refusals import Judgement
    from krill.audit.source import AuditSource

    monkeypatch.setattr(ledger, "judge_refusal", lambda source, commit_id: Judgement(False, "the replay fails it"))

    def judged(env, commit_id: int) -> str | None:
        source = AuditSource(env.admin, None, types.SimpleNamespace(run_id=RUN_ID), from_block=0)
        return ledger.judge_slash(source, commit_id, CHALLENGE_WINDOW)

    return judged


def _failed_commit(env, label: str) -> Committed:
    committed = env.at(2).commit(RUN_ID, 0, 0, digest(label)).event(Committed)
    for v in (5, 6):  # the run's quorum
        env.at(v).attest(committed.commit_id, False, digest(f"evidence-{v}"))
    return committed


def test_a_period_raised_after_the_unstake_request_does_not_excuse_a_slash_after_the_withdrawal(staked, judge):
    env = staked
    committed = _failed_commit(env, "forged")
    release = env.at(2).request_unstake(200 * TOKEN).event(UnstakeRequested).release_block
    assert release == committed.block_number + CHALLENGE_WINDOW + UNBONDING
    env.admin.set_unbonding_blocks(5 * UNBONDING)  # the request keeps its release block
    env.mine(release - env.block())
    assert env.at(2).withdraw().event(Withdrawn).amount == 200 * TOKEN  # the stake left
    slashed = env.coordinator.slash(committed.commit_id).event(Slashed)
    assert slashed.amount == 0
    why = judge(env, committed.commit_id)
    assert why is not None and LATE in why and f"(from block {release})" in why, why


def test_a_period_lowered_after_the_slash_does_not_make_it_late(staked, judge):
    env = staked
    env.admin.set_unbonding_blocks(5 * UNBONDING)
    committed = _failed_commit(env, "forged")
    env.at(2).request_unstake(200 * TOKEN)
    env.mine(committed.block_number + CHALLENGE_WINDOW + 2 * UNBONDING - env.block())
    assert env.coordinator.slash(committed.commit_id).event(Slashed).amount == 100 * TOKEN  # the stake was there
    env.admin.set_unbonding_blocks(UNBONDING)
    assert judge(env, committed.commit_id) is None


def test_a_period_lowered_after_the_window_counts_from_the_lowering(staked, judge):
    """Lowered after the commit's window closed, the shorter period lets the stake leave that period after
    the lowering (a new request restarts the release), not after the window's close."""
    env = staked
    env.admin.set_unbonding_blocks(5 * UNBONDING)
    committed = _failed_commit(env, "forged")
    env.mine(committed.block_number + CHALLENGE_WINDOW + UNBONDING - env.block())
    lowered = env.admin.set_unbonding_blocks(UNBONDING).block_number
    env.mine(UNBONDING - 2)  # the slash lands in the last block before lowered + UNBONDING: in time
    assert env.coordinator.slash(committed.commit_id).event(Slashed).block_number == lowered + UNBONDING - 1
    assert judge(env, committed.commit_id) is None


def test_a_period_lowered_after_the_window_lets_the_stake_leave_before_a_late_slash(staked, judge):
    env = staked
    env.admin.set_unbonding_blocks(5 * UNBONDING)
    committed = _failed_commit(env, "forged")
    env.at(2).request_unstake(150 * TOKEN)
    env.mine(committed.block_number + CHALLENGE_WINDOW + UNBONDING - env.block())
    lowered = env.admin.set_unbonding_blocks(UNBONDING).block_number
    release = env.at(2).request_unstake(50 * TOKEN).event(UnstakeRequested).release_block  # restarts the release
    assert release == lowered + 1 + UNBONDING < committed.block_number + CHALLENGE_WINDOW + 5 * UNBONDING
    env.mine(release - env.block())
    assert env.at(2).withdraw().event(Withdrawn).amount == 200 * TOKEN
    assert env.coordinator.slash(committed.commit_id).event(Slashed).amount == 0
    why = judge(env, committed.commit_id)  # a request in the lowering's own block could leave a block earlier
    assert why is not None and LATE in why and f"(from block {lowered + UNBONDING})" in why, why
