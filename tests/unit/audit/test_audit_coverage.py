"""The `coverage` row: every commit of the run is named in some record once it is due.

The one-shard run of `audit_fakes.py` with records written by hand, on a fake chain of 12-second
blocks: a commit is due once its challenge window (40 blocks) has closed and the run's deadline
(60 s) plus the audit's slack (600 s), 55 blocks, have passed before the parent's publication.
These tests read only the coverage row.
"""

from __future__ import annotations

import dataclasses

import pytest
from audit_fakes import World, entry

from krill.audit import audit_versions
from krill.audit.coverage import DECISION_SLACK_S
from krill.protocol.record import MAX_REJECTED_PER_RECORD, RejectedEntry

A, B = "0x" + "0a" * 20, "0x" + "0b" * 20
DIGEST = b"\xcd" * 32


def _world(tmp_path):
    world = World(tmp_path)
    world.chain.seconds_per_block = 12
    world.chain.versions[0] = dataclasses.replace(world.chain.versions[0], published_block=1)
    return world


def _rejected(commit_id, worker, reason="malformed_payload"):
    return RejectedEntry(commit_id=commit_id, worker=worker, reason_code=reason, reason="x")


def _coverage(world, version):
    (report,) = audit_versions(world.source(), [version])
    return next(c for c in report.checks if c.name == "coverage")


def test_the_due_point_is_the_window_and_the_deadline_with_slack(tmp_path):
    assert (60 + DECISION_SLACK_S) // 12 == 55  # the blocks the tests below count on


def test_a_commit_named_in_no_record_fails_at_the_version_it_is_due_and_only_there(tmp_path):
    world = _world(tmp_path)
    world.chain.commit(A, 0, 0, DIGEST, block=10)  # commit 1: due once the parent is published after block 65
    honest = world.chain.commit(B, 0, 0, DIGEST, block=11)
    world.publish(1, block=20, accepted=[entry(honest, worker=B)])
    world.publish(2, block=30)
    world.publish(3, block=100)
    world.publish(4, block=110)
    world.publish(5, block=120)
    assert _coverage(world, 3).ok  # v3's parent (v2, block 30): neither window nor deadline has passed
    row = _coverage(world, 4)  # v4's parent (v3, block 100): both have
    assert not row.ok
    assert "1 of 2 commits due here are named in no record up to this version" in row.detail
    assert f"commits 1 by {A}" in row.detail
    assert _coverage(world, 5).ok  # judged once, at version 4


def test_a_commit_named_in_an_earlier_record_passes(tmp_path):
    world = _world(tmp_path)
    c = world.chain.commit(A, 0, 0, DIGEST, block=10)
    world.publish(1, block=20)
    world.publish(2, block=30, rejected=[_rejected(c, A)])
    world.publish(3, block=100)
    world.publish(4, block=110)
    row = _coverage(world, 4)
    assert row.ok and "1 commits due here, each named in a record" in row.detail


def test_a_commit_queued_behind_its_own_workers_missing_content_is_not_judged(tmp_path):
    world = _world(tmp_path)
    junk = world.chain.commit(A, 0, 0, DIGEST, block=5)
    world.chain.commit(A, 0, 1, DIGEST, block=10)  # committed 5 blocks after its worker's junk
    world.publish(1, block=20)
    world.publish(2, block=30, rejected=[_rejected(junk, A, "unavailable")])
    world.publish(3, block=100)
    world.publish(4, block=110)
    row = _coverage(world, 4)
    assert row.ok and "1 not judged: queued behind the same worker's content that never arrived" in row.detail


def test_commits_due_at_a_full_record_are_judged_at_the_next_one_with_room(tmp_path):
    world = _world(tmp_path)
    world.chain.commit(A, 0, 0, DIGEST, block=10)
    world.publish(1, block=20)
    world.publish(2, block=30)
    world.publish(3, block=100)
    full = [_rejected(1000 + i, B) for i in range(MAX_REJECTED_PER_RECORD)]
    world.publish(4, block=110, rejected=full)
    world.publish(5, block=120)
    row = _coverage(world, 4)
    assert row.ok and "the record is full" in row.detail
    row = _coverage(world, 5)
    assert not row.ok and "commits 1 by" in row.detail


@pytest.mark.parametrize("seconds_per_block", [1, 12])
def test_a_run_younger_than_the_slack_has_nothing_due(tmp_path, seconds_per_block):
    world = _world(tmp_path)
    world.chain.seconds_per_block = seconds_per_block
    world.chain.commit(A, 0, 0, DIGEST, block=10)
    world.publish(1, block=50 if seconds_per_block == 12 else 500)
    world.publish(2, block=60 if seconds_per_block == 12 else 600)
    assert _coverage(world, 2).ok


def test_only_a_named_unavailable_commit_excuses_and_not_through_a_chain_of_unnamed_ones(tmp_path):
    """One `unavailable` claim (which the audit cannot check) must not excuse every later commit of its
    worker that follows within a window of an unnamed one: that let a coordinator drop them in silence."""
    world = _world(tmp_path)
    junk = world.chain.commit(A, 0, 0, DIGEST, block=5)
    chained = [world.chain.commit(A, 0, n, DIGEST, block=5 + 35 * n) for n in (1, 2)]  # blocks 40, 75
    world.publish(1, block=20, rejected=[_rejected(junk, A, "unavailable")])
    world.publish(2, block=30)
    world.publish(3, block=100)
    world.publish(4, block=110)
    world.publish(5, block=140)
    world.publish(6, block=150)
    row = _coverage(world, 4)  # due: the junk (named) and commit 2 (35 blocks after the junk: excused)
    assert row.ok and "1 not judged" in row.detail, row.detail
    row = _coverage(world, 6)  # due: commit 3, 70 blocks after the junk; commit 2 before it is unnamed
    assert not row.ok and f"commits {chained[1]} by {A}" in row.detail, row.detail
