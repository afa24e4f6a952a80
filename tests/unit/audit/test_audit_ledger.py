"""The `settlement` and `slashing` rows: what the chain paid and took, against the rules.

The one-shard run of `audit_fakes.py`, with records written by hand: their entries name commits
that need not validate (those rows fail; these tests read only the two ledger rows). The fake
chain plays the coordinator's settlements, fundings, verdicts and slashes.
"""

from __future__ import annotations

import dataclasses

from audit_fakes import COORDINATOR, World, entry

from krill.audit import audit_versions
from krill.protocol.rewards import reward_split

A, B, C = "0x" + "0a" * 20, "0x" + "0b" * 20, "0x" + "0c" * 20
ACCEPTED = [entry(1, weight="0.5", worker=A), entry(2, weight="0.25", worker=B), entry(3, weight="0.125", worker=A)]


def _row(report, name):
    return next(c for c in report.checks if c.name == name)


def _world(tmp_path, pool_per_versions=10):
    world = World(tmp_path)
    world.chain.fund(pool_per_versions * world.chain.params.reward_per_version)
    return world


def _split(total):
    return reward_split(total, [{"worker": e.worker, "weight": e.weight} for e in ACCEPTED])


def test_a_settlement_by_the_record_passes(tmp_path):
    world = _world(tmp_path)
    per_version = world.chain.params.reward_per_version
    world.publish(1, accepted=ACCEPTED)
    world.chain.settle(1, _split(per_version))
    (report,) = audit_versions(world.source(), [1])
    row = _row(report, "settlement")
    assert row.ok, row.detail
    assert f"{per_version} credited to 2 accounts" in row.detail
    assert dict(_split(per_version)) == {A: per_version * 5 // 7, B: per_version * 2 // 7 + 1}  # B's remainder is larger


def test_a_settlement_after_the_audit_read_the_events_passes(tmp_path):
    """The run's events are read once per audit run. On a live run the coordinator settles the latest
    version while `--all` (or a release's lineage audit) works through the earlier ones: the chain's view
    then says settled, and the events read before held no settlement, which failed an honest version."""
    world = _world(tmp_path)
    per_version = world.chain.params.reward_per_version
    world.publish(1)
    world.publish(2, accepted=ACCEPTED)
    source = world.source()
    (first,) = audit_versions(source, [1])  # reads the run's events
    world.chain.settle(2, _split(per_version))
    (second,) = audit_versions(source, [2])
    row = _row(second, "settlement")
    assert row.ok, row.detail
    assert f"{per_version} credited to 2 accounts" in row.detail


def test_a_settlement_breaks_ties_by_the_runs_rule(tmp_path):
    """Equal weights (newcomers at the trust prior) tie for the remainders' units: a new run orders them by
    a hash of the run id, the version and the address, a run published before the option by address, and
    the audit recomputes each run's settlement under its own rule."""
    from krill.protocol.rewards import version_split
    from krill.protocol.spec import RewardSpec

    workers = ["0x" + f"{i:02x}" * 20 for i in range(1, 8)]
    tied = [entry(i, weight="0.25", worker=w) for i, w in enumerate(workers, 1)]
    as_dicts = [{"worker": e.worker, "weight": e.weight} for e in tied]
    for ties, root in (("hashed", "new"), ("address", "old")):
        world = World(tmp_path / root, reward=RewardSpec(ties=ties))
        world.chain.fund(10 * world.chain.params.reward_per_version)
        per_version = world.chain.params.reward_per_version
        assert per_version % len(workers) and world.spec.reward.ties == ties
        by_address = reward_split(per_version, as_dicts)
        by_hash = reward_split(per_version, as_dicts, ties="hashed", run_id=world.spec.run_id, version=1)
        assert by_address != by_hash  # the two rules give the leftover units to other accounts here
        assert version_split(world.spec, 1, per_version, as_dicts) == (by_hash if ties == "hashed" else by_address)
        world.publish(1, accepted=tied)
        world.chain.settle(1, by_hash if ties == "hashed" else by_address)
        other = by_address if ties == "hashed" else by_hash  # the other run's rule
        assert version_split(world.spec, 2, per_version, as_dicts) != other
        world.publish(2, accepted=tied)
        world.chain.settle(2, other)
        first, second = (_row(r, "settlement") for r in audit_versions(world.source(), [1, 2]))
        assert first.ok, (ties, first.detail)
        assert not second.ok and "credits are not the record's split" in second.detail, (ties, second.detail)


def test_a_coordinator_paying_itself_fails_the_settlement(tmp_path):
    world = _world(tmp_path)
    per_version = world.chain.params.reward_per_version
    world.publish(1, accepted=ACCEPTED)
    world.chain.settle(1, [(COORDINATOR, per_version)])
    (report,) = audit_versions(world.source(), [1])
    row = _row(report, "settlement")
    assert not row.ok
    assert f"{COORDINATOR} was paid {per_version}, the record owes it nothing" in row.detail
    assert f"{A} was paid 0, the record owes it {dict(_split(per_version))[A]}" in row.detail


def test_a_settlement_short_of_the_rule_fails_but_a_funding_race_does_not(tmp_path):
    world = World(tmp_path)
    per_version = world.chain.params.reward_per_version
    world.chain.fund(per_version // 4)  # less than a version's reward: the rule pays the pool
    world.publish(1, accepted=ACCEPTED)
    short = world.chain.fork()
    short.settle(1, _split(per_version // 8))
    world.chain.fund(per_version, block=101)  # lands after the coordinator read the pool, before its settle
    world.chain.settle(1, _split(per_version // 4), block=102)
    (report,) = audit_versions(world.source(), [1])
    assert _row(report, "settlement").ok, _row(report, "settlement").detail
    world.chain = short
    (report,) = audit_versions(world.source(), [1])
    row = _row(report, "settlement")
    assert not row.ok and f"total {per_version // 8} is not min(reward per version, pool)" in row.detail
    assert f"that gives {per_version // 4}" in row.detail


def test_an_unsettled_version_fails_once_overdue(tmp_path):
    world = _world(tmp_path)
    for version in (1, 2):
        world.publish(version, accepted=ACCEPTED)
    (first, second) = audit_versions(world.source(), [1, 2])
    for report in (first, second):  # recent: the coordinator may not have settled it yet
        row = _row(report, "settlement")
        assert row.ok and "not settled yet" in row.detail, row.detail

    later = world.chain.fork()
    world.publish(3, accepted=ACCEPTED)  # two publications later
    first, second = audit_versions(world.source(), [1, 2])
    row = _row(first, "settlement")
    assert not row.ok and "not settled, though version 3 was published" in row.detail, row.detail
    assert "the record's 2 workers are owed" in row.detail
    assert _row(second, "settlement").ok

    world.chain = later
    later.settle(2, _split(later.params.reward_per_version))  # a later version settled: 1 was skipped
    (first,) = audit_versions(world.source(), [1])
    row = _row(first, "settlement")
    assert not row.ok and "not settled, though version 2 was settled" in row.detail, row.detail


def test_an_unsettled_version_with_nothing_owed_passes(tmp_path):
    world = World(tmp_path)  # the pool is never funded: the rule's amount is 0
    for version in (1, 2, 3):
        world.publish(version, accepted=ACCEPTED)
    row = _row(audit_versions(world.source(), [1])[0], "settlement")
    assert row.ok and "nothing was owed" in row.detail, row.detail
    world = _world(tmp_path / "empty")
    for version in (1, 2, 3):
        world.publish(version)  # no contribution accepted
    row = _row(audit_versions(world.source(), [1])[0], "settlement")
    assert row.ok and "no positive weight" in row.detail, row.detail


def test_a_commit_at_quorum_left_unslashed_fails_the_version_it_is_due_at(tmp_path):
    world = World(tmp_path)
    chain = world.chain
    chain.params = dataclasses.replace(chain.params, challenge_window_blocks=5, attestation_quorum=2)
    world.publish(1, block=110)
    cheat = chain.commit(A, 1, 0, b"\1" * 32, block=111)  # verdicts count up to block 116
    honest = chain.commit(B, 1, 0, b"\2" * 32, block=111)
    for verifier in ("0x" + "e1" * 20, "0x" + "e2" * 20):
        chain.attest(cheat, False, verifier)
    chain.attest(honest, False)  # one failing verdict: below the quorum
    chain.attest(honest, True, "0x" + "e2" * 20)
    for version, block in ((2, 115), (3, 130), (4, 140), (5, 150)):
        world.publish(version, block=block)
    reports = audit_versions(world.source(), [1, 2, 3, 4, 5])
    rows = {r.version: _row(r, "slashing") for r in reports}
    assert [v for v, row in rows.items() if not row.ok] == [4], rows  # v3's parent (v2, block 115) came too soon
    assert f"1 of 1 commit that reached the quorum of 2 failing verdicts is not slashed: commits {cheat} " in rows[4].detail
    assert f"the audit's replay does not justify declining {cheat}: commit {cheat}: cannot replay it: not available" in rows[4].detail

    chain.slash(cheat)
    row = _row(audit_versions(world.source(), [4])[0], "slashing")
    assert row.ok and "1 commit reached the quorum of 2 failing verdicts" in row.detail and "all slashed" in row.detail


def test_a_declined_slash_the_replay_justifies_passes_and_is_named(tmp_path, monkeypatch):
    """The row's logic over `judge_refusal` (itself replayed for real in
    tests/integration/coordinator/test_slash.py): a declined commit whose replay passes every check is
    justified, one whose replay fails is not."""
    from krill.audit import ledger
    from krill.audit.refusals import Judgement

    world = World(tmp_path)
    chain = world.chain
    chain.params = dataclasses.replace(chain.params, challenge_window_blocks=5, attestation_quorum=1)
    world.publish(1, block=110)
    lied_about, cheat = chain.commit(A, 1, 0, b"\1" * 32, block=111), chain.commit(B, 1, 0, b"\2" * 32, block=111)
    for commit in (lied_about, cheat):
        chain.attest(commit, False)
    for version, block in ((2, 130), (3, 140)):
        world.publish(version, block=block)
    judgements = {lied_about: Judgement(True, "the replay passes every check (the failing verdicts were false)"),
                  cheat: Judgement(False, "the replay fails it at rewards: 128 of 128 rewards differ")}
    monkeypatch.setattr(ledger, "judge_refusal", lambda source, commit_id: judgements[commit_id])

    row = _row(audit_versions(world.source(), [3])[0], "slashing")
    assert not row.ok
    assert f"does not justify declining {cheat}: commit {cheat}: the replay fails it at rewards" in row.detail
    assert f"1 commit declined, which the audit's replay passes (the failing verdicts were false): {lied_about}" in row.detail

    chain.slash(cheat)
    row = _row(audit_versions(world.source(), [3])[0], "slashing")
    assert row.ok, row.detail
    assert "2 commits reached the quorum of 1 failing verdicts" in row.detail and ": 1 slashed; 1 commit declined" in row.detail


def test_a_slash_after_the_stake_could_leave_or_without_grounds_fails(tmp_path, monkeypatch):
    """A coordinator shielding its worker waits until the stake behind the commit can leave, then slashes
    (nothing); one framing a worker slashes honest work on its own verifier's word. Both used to pass."""
    from krill.audit import ledger
    from krill.audit.refusals import Judgement

    world = World(tmp_path)
    chain = world.chain
    chain.params = dataclasses.replace(chain.params, challenge_window_blocks=5, attestation_quorum=1)
    world.publish(1, block=110)
    late, framed, fair = (chain.commit(w, 1, 0, bytes([i]) * 32, block=111) for i, w in enumerate((A, B, C), 1))
    for commit in (late, framed, fair):
        chain.attest(commit, False)
    for version, block in ((2, 130), (3, 140)):
        world.publish(version, block=block)
    judgements = {late: Judgement(False, "the replay fails it at rewards"), fair: Judgement(False, "fails"),
                  framed: Judgement(True, "the replay passes every check (the failing verdicts were false)")}
    monkeypatch.setattr(ledger, "judge_refusal", lambda source, commit_id: judgements[commit_id])
    leave = 111 + 5 + chain.unbonding_blocks()
    chain.slash(late, block=leave)
    chain.slash(framed)
    chain.slash(fair, block=leave - 1)  # the last block before the stake could leave: in time
    row = _row(audit_versions(world.source(), [3])[0], "slashing")
    assert not row.ok and "2 commits due here" in row.detail and "were slashed wrongly" in row.detail, row.detail
    assert f"commit {late} was slashed at block {leave}, when the stake behind it could already have left" in row.detail
    assert (f"commit {framed} was slashed, but the audit's replay passes every check and no failing verdict said "
            "its content was unavailable") in row.detail
    assert f"commit {fair} " not in row.detail


def test_a_slash_is_timed_by_the_unbonding_periods_in_force_since_the_commit_not_todays(tmp_path, monkeypatch):
    """The contract fixes a release block with the period in force when it computes it: raised after the
    commit (today's 50), the stake could still leave 20 blocks after the window's close. The audit used
    today's period and passed a slash 24 blocks late. Where the events from the configured deployment
    block do not tell the period at the commit, the audit says it cannot tell."""
    from krill.audit import ledger
    from krill.audit.refusals import Judgement
    from krill.audit.source import AuditSource
    from krill.chain.events import UnbondingBlocksSet

    world = World(tmp_path)
    chain = world.chain
    chain.params = dataclasses.replace(chain.params, challenge_window_blocks=5, attestation_quorum=1)
    chain._emit(UnbondingBlocksSet, 1, blocks=20)  # the deployment's
    world.publish(1, block=110)
    late, fair = (chain.commit(w, 1, 0, bytes([i]) * 32, block=111) for i, w in enumerate((A, B), 1))
    for commit in (late, fair):
        chain.attest(commit, False)
    chain._emit(UnbondingBlocksSet, 113, blocks=chain.unbonding_blocks())  # raised to today's 50
    for version, block in ((2, 130), (3, 140)):
        world.publish(version, block=block)
    monkeypatch.setattr(ledger, "judge_refusal", lambda source, commit_id: Judgement(False, "fails"))
    chain.slash(late, block=111 + 5 + 20)
    chain.slash(fair, block=111 + 5 + 20 - 1)
    row = _row(audit_versions(world.source(), [3])[0], "slashing")
    assert not row.ok and "1 commit due here" in row.detail, row.detail
    assert f"commit {late} was slashed at block 136, when the stake behind it could already have left (from block " \
           "136)" in row.detail and f"commit {fair} " not in row.detail

    row = _row(audit_versions(AuditSource(chain, world.store, world.spec, from_block=5), [3])[0], "slashing")
    assert not row.ok and f"commit {fair} was slashed at block 135, and the audit cannot tell whether in time: no " \
                          "UnbondingBlocksSet event from block 5" in row.detail, row.detail


def test_a_record_folding_more_of_one_workers_contributions_than_the_cap_fails_the_entries_row(tmp_path):
    world = _world(tmp_path)
    assert world.spec.version.max_per_worker == 2  # a new run's default
    world.publish(1, accepted=[entry(1, worker=A), entry(2, worker=B), entry(3, worker=A), entry(4, worker=A)])
    (report,) = audit_versions(world.source(), [1])
    assert f"{A} has 3 accepted contributions, over the run's cap of 2 per worker" in _row(report, "entries").detail
    world.publish(2, accepted=ACCEPTED)  # A twice: within the cap
    (report,) = audit_versions(world.source(), [2])
    assert "over the run's cap" not in _row(report, "entries").detail
