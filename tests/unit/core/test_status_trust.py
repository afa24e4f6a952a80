"""The trust `krill worker status` shows is the coordinator's weighing from published records, not the
index's tally of every verdict (`krill.account_status`), read from a bounded number of records."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from krill.account_status import NOT_WEIGHED, RECORDS_READ, Index, account_status, render, weighed_trust
from krill.db.session import open_database
from krill.protocol.record import AcceptedEntry, publish_record
from krill.store.local import LocalStore
from krill.testing.index_world import _record, fill_index_world

PROTOCOL = "0x" + "44" * 20


class _Chain:
    """The contract views status reads; `records`: version -> record digest (published versions 1..latest)."""

    address = PROTOCOL

    def __init__(self, records: dict[int, bytes]):
        self.records = records
        self.asked: list[int] = []

    def stake_of(self, address):
        return SimpleNamespace(role=1, staked=500, unbonding=0, release_block=0, jailed=False)

    def block_number(self):
        return 600

    def minimum_stake(self, role):
        return 100

    def run_of(self, run_id):
        return SimpleNamespace(exists=True, latest_version=max(self.records, default=0), reward_pool=0)

    def version_of(self, run_id, version):
        self.asked.append(version)
        return SimpleNamespace(record_digest=self.records[version])

    def is_eligible(self, address, role):
        return True

    def claimable_of(self, address):
        return 0

    def events(self, from_block=0, confirmations=0, kinds=None):
        return [e for e in self.later if e.block_number >= from_block]

    later: list = []  # events on the chain past the index's cursor


def _config(store_path):
    return SimpleNamespace(chain=SimpleNamespace(deploy_block=0),
                           store=SimpleNamespace(type="local", path=store_path, max_get_bytes=1 << 30))


@pytest.fixture
def world(tmp_path):
    """The hand-filled index (the honest worker's commit 1 weighed at 0.25 in version 1's record), plus
    five verifiers staked after that commit that attest it as passing: the index's tally rises to 0.7,
    the coordinator counts none of them (`krill.coordinator.standing`)."""
    from krill.chain import events as ev
    from krill.db.ingest import DEFAULT_TRUST_PRIOR, apply_event, known_events

    found = fill_index_world(f"sqlite:///{tmp_path / 'index.db'}", tmp_path)
    events = []
    for i in range(5):
        sybil, tx = "0x" + f"{0xa0 + i:02x}" * 20, "0x" + f"{0xf00 + i:064x}"
        events.append(ev.Staked(500, tx, 0, PROTOCOL, sybil, 2, 10, 10, bytes([i + 1]) * 32))
        events.append(ev.Attested(501, tx, 1, PROTOCOL, 1, sybil, True, b"\x01" * 32, 2 + i, 0))
    with open_database(found.url) as db, db.write() as s:
        known = known_events(s, events)
        for event in events:
            apply_event(s, event, 0, DEFAULT_TRUST_PRIOR, known)
    found.path = tmp_path
    return found


def _status(world, role="worker"):
    chain = _Chain({1: _record("bafkreimanifest1").digest})
    db = open_database(world.url, create=False)
    try:
        return account_status(_config(world.path / "store"), role, chain, world.honest, Index(db, "index", 100),
                              bytes.fromhex(world.run))
    finally:
        db.close()


def test_worker_trust_is_the_coordinators_weighing_not_the_raisable_tally(world):
    """Before: status showed the index's tally, 0.7 after the sybils' passes, labelled 'index', while the
    coordinator weighed the worker at 0.25 (the published record of version 1 says so)."""
    status = _status(world)
    assert status.trust == 0.25
    assert status.trust_weighed == {"run_id": world.run, "version": 1, "commit_id": 1}
    assert status.trust_note == "weighed by the coordinator in version 1 (commit #1)"
    assert status.verdicts == {"passed": 6, "failed": 0}  # the tally's counts, kept and labelled
    rows = dict(render(status))
    assert rows["trust"] == "0.250 (weighed by the coordinator in version 1 (commit #1))"
    assert "every verifier's" in rows["verdicts on its commits"] and "6 passed / 0 failed" in rows[
        "verdicts on its commits"]
    assert "0.7" not in str(status.to_json()["trust"])


def test_a_verifier_is_not_shown_a_trust(world):
    status = _status(world, role="verifier")
    assert (status.trust, status.trust_note, status.trust_weighed) == (None, NOT_WEIGHED, None)
    assert "trust" not in dict(render(status))


def _published(store, version: int, accepted: list[AcceptedEntry]) -> bytes:
    record = _record(f"bafkreimanifest{version}").model_copy(update={"version": version, "accepted": accepted})
    publish_record(store, record)
    return record.digest


def _entry(commit_id: int, worker: str, trust: str) -> AcceptedEntry:
    return AcceptedEntry(commit_id=commit_id, worker=worker, header_digest=f"{commit_id:064x}", model_version=0,
                         behaviour_version=0, staleness=0, trust=trust, weight=trust, shards=[0], mean_reward="0.5",
                         tokens=1)


def test_the_newest_weighing_is_found_within_a_bounded_walk(tmp_path):
    store = LocalStore(tmp_path / "store")
    me, other = "0x" + "ab" * 20, "0x" + "22" * 20
    records = {1: _published(store, 1, [_entry(1, me, "0.25")]),
               2: _published(store, 2, [_entry(2, me, "0.5"), _entry(5, me, "0.625"), _entry(3, other, "0.9")])}
    for v in range(3, 3 + RECORDS_READ - 1):
        records[v] = _published(store, v, [_entry(10 + v, other, "0.9")])
    chain, run = _Chain(records), b"\xab" * 32
    latest = max(records)  # version 2 is the oldest of the last RECORDS_READ
    assert weighed_trust(chain, store, run, "0x" + "AB" * 20, latest) == (  # the address in any case
        0.625, "weighed by the coordinator in version 2 (commit #5)", {"run_id": run.hex(), "version": 2,
                                                                       "commit_id": 5})
    records[latest + 1] = _published(store, latest + 1, [_entry(99, other, "0.9")])
    chain.asked.clear()
    trust, note, where = weighed_trust(chain, store, run, me, latest + 1)
    assert (trust, where) == (None, None) and note == f"none in the last {RECORDS_READ} published versions " \
                                                      f"(versions 3..{latest + 1})"
    assert len(chain.asked) == RECORDS_READ
    assert weighed_trust(_Chain({}), store, run, me, 0)[1] == "none yet (the run has published no version)"


@pytest.mark.parametrize("trust", ["nan", "inf", "abc"])
def test_a_record_whose_trust_is_no_number_says_so_instead_of_crashing(tmp_path, trust):
    store = LocalStore(tmp_path / "store")
    me = "0x" + "11" * 20
    chain = _Chain({1: _published(store, 1, [_entry(1, me, trust)])})
    got, note, where = weighed_trust(chain, store, b"\xab" * 32, me, 1)
    assert got is None and where is None and "not a number" in note


def test_an_unreadable_newer_record_is_not_skipped_for_an_older_weighing(tmp_path):
    store = LocalStore(tmp_path / "store")
    me = "0x" + "11" * 20
    chain = _Chain({1: _published(store, 1, [_entry(1, me, "0.25")]), 2: b"\x77" * 32})
    got, note, where = weighed_trust(chain, store, b"\xab" * 32, me, 2)
    assert got is None and where is None and note.startswith("unknown (the record of version 2 is unavailable: ") \
        and note.endswith("; the record of version 1 was not read)")


def test_the_coordinators_accepted_count_is_what_published_versions_folded(tmp_path):
    """The coordinator's rows say accepted from validation on: a contribution waiting for a version (which may
    still reject it as late) and one journalled for a version not published yet were counted as accepted, so
    status said "3 accepted" where the published records, the explorer and `krill demo` count 1."""
    from krill.account_status import contributions_from_index
    from krill.db.models import Contribution, ContributionStatus

    world = fill_index_world(f"sqlite:///{tmp_path / 'index.db'}", tmp_path)  # commit 1 accepted in version 1
    with open_database(world.url) as db, db.write() as s:
        for commit_id, folded in ((40, None), (41, 3)):  # waiting; journalled for version 3 (the chain has 2)
            s.add(Contribution(commit_id=commit_id, run_id=world.run, worker=world.honest, version=2,
                               status=ContributionStatus.ACCEPTED, weight=0.25, staleness=0, trust=0.25,
                               aggregated_version=folded))
    with open_database(world.url, create=False) as db:
        index = Index(db, "index", 100)
        got = contributions_from_index(index, bytes.fromhex(world.run), world.honest, 2)
        assert (got["accepted"], got["accepted_unpublished"], got["rejected"], got["pending"]) == (1, 2, 0, 0)
        later = contributions_from_index(index, bytes.fromhex(world.run), world.honest, 3)  # version 3 published
        assert (later["accepted"], later["accepted_unpublished"]) == (2, 1)


def test_earnings_with_an_index_add_what_the_chain_credited_past_its_cursor(world):
    """Before: an index synced to block 99 (10 KRILL credited) was the whole figure: status said 10 KRILL earned
    beside 30 claimable after a reward of 20 at block 150; and what was claimed after the cursor was left out."""
    from krill.chain.events import Claimed, RewardCredited
    from krill.testing.index_world import TOKEN

    chain = _Chain({1: _record("bafkreimanifest1").digest})
    chain.later = [RewardCredited(99, "0x" + "aa" * 32, 0, PROTOCOL, bytes.fromhex(world.run), 1, world.honest,
                                  10 * TOKEN),  # before the cursor: in the index's tally already
                   RewardCredited(150, "0x" + "bb" * 32, 0, PROTOCOL, bytes.fromhex(world.run), 2, world.honest,
                                  20 * TOKEN),
                   RewardCredited(151, "0x" + "cc" * 32, 0, PROTOCOL, bytes.fromhex(world.run), 2, "0x" + "99" * 20,
                                  7 * TOKEN),  # another account's
                   Claimed(160, "0x" + "dd" * 32, 0, PROTOCOL, world.honest.upper().replace("0X", "0x"), 4 * TOKEN)]
    with open_database(world.url, create=False) as db:
        status = account_status(_config(world.path / "store"), "worker", chain, world.honest,
                                Index(db, "index", 100), bytes.fromhex(world.run))
    assert (status.earned, status.claimed) == (30 * TOKEN, 4 * TOKEN)
    assert dict(render(status))["earned"] == "30 KRILL (4 claimed)"


def test_commits_with_no_coordinator_decision_in_the_index_are_counted_not_hidden(tmp_path):
    """Before: an index synced from the chain holds the worker's commits but none of the coordinator's rows, and
    status said "0 accepted, 0 rejected, 0 pending" of a worker with 31 commits on the run; commits the coordinator
    has no row for were left out of the figures in its own database too."""
    from sqlalchemy import delete

    from krill.account_status import contributions_from_index
    from krill.db.models import Contribution
    from krill.testing.index_world import EXTRA_COMMITS
    from worker.status import _undecided

    world = fill_index_world(f"sqlite:///{tmp_path / 'index.db'}", tmp_path)  # commit 1 decided, the rest not
    run = bytes.fromhex(world.run)
    with open_database(world.url, create=False) as db:
        got = contributions_from_index(Index(db, "index", 100), run, world.honest, 2)
    assert (got["accepted"], got["undecided"], got["decisions_indexed"]) == (1, EXTRA_COMMITS, True)
    assert _undecided(got) == f"; {EXTRA_COMMITS} committed with no decision in the index"
    with open_database(world.url) as db, db.write() as s:
        s.execute(delete(Contribution))  # as `krill index sync` leaves it: no coordinator rows
    with open_database(world.url, create=False) as db:
        got = contributions_from_index(Index(db, "index", 100), run, world.honest, 2)
        other = contributions_from_index(Index(db, "index", 100), b"\xcd" * 32, world.honest, 2)
    assert (got["accepted"], got["pending"], got["undecided"], got["decisions_indexed"]) == (
        0, 0, 1 + EXTRA_COMMITS, False)
    assert _undecided(got) == (f"; {1 + EXTRA_COMMITS} committed with no decision in the index (this index holds "
                               "none of the coordinator's decisions on the run: an index synced from the chain has "
                               "none)")
    assert (other["undecided"], _undecided(other)) == (0, "")  # another run's: none of these commits


def test_the_table_says_which_block_the_index_figures_are_from(world):
    """Before: nothing in the table said the index was read to block 99 with the head at 600, so its verdict counts
    read as current (a verifier's "0 passing" beside five attestations of its own)."""
    rows = dict(render(_status(world)))
    assert rows["index"] == ("read to block 99 (501 behind the head): the figures marked index are as of that block: "
                             "`krill index sync` brings them up to date")
    status = _status(world, role="verifier")
    status.head_block = 120
    assert dict(render(status))["index"] == "read to block 99 (21 behind the head): the figures marked index are as " \
                                            "of that block"
    status.index, status.index_block = "unknown (no index)", None
    assert "index" not in dict(render(status))


def test_earnings_are_not_counted_twice_when_the_index_moves_on_while_status_runs(world):
    """Before: the cursor was the one read when the index was opened (block 100), the tally the one read after
    the chain's figures; the coordinator's indexer applied the reward of 20 at block 150 in between (it syncs
    every pass), so the tally held it and the chain's credits from block 100 added it again: 50 KRILL earned of
    30. The tally and its cursor are now read together."""
    from sqlalchemy import select

    from krill.chain.events import RewardCredited
    from krill.db.models import IndexMeta, Participant
    from krill.testing.index_world import TOKEN

    class _Syncing(_Chain):
        def stake_of(self, address):  # the coordinator's pass lands while status reads the chain
            with open_database(world.url) as db, db.write() as s:
                s.scalars(select(Participant).where(Participant.address == world.honest)).one().rewards_credited \
                    += 20 * TOKEN
                s.scalars(select(IndexMeta)).one().next_block = 151
            return super().stake_of(address)

    chain = _Syncing({1: _record("bafkreimanifest1").digest})
    chain.later = [RewardCredited(150, "0x" + "bb" * 32, 0, PROTOCOL, bytes.fromhex(world.run), 2, world.honest,
                                  20 * TOKEN)]
    with open_database(world.url, create=False) as db:
        status = account_status(_config(world.path / "store"), "worker", chain, world.honest,
                                Index(db, "index", 100), bytes.fromhex(world.run))
    assert status.earned == 30 * TOKEN
    assert status.index_block == 151  # the figures' block, not the one read at opening
