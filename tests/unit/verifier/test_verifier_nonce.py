"""A worker chooses its commit's nonce (any uint64 the contract accepts): the verifier's state keeps every
one exactly, including those beyond SQLite's signed 64-bit INTEGER, and a file written when the nonce
column was INTEGER is migrated with its commits; an event the state cannot record is recorded as an
error and logged while the rest of its batch is saved (one such event used to stop every verifier)."""

from __future__ import annotations

import hashlib
import sqlite3
from types import SimpleNamespace

import pytest

import krill.verifier.loop as loop_module
from krill.chain.events import Committed
from krill.protocol.evidence import check_record
from krill.store.cid import digest_to_cid
from krill.verifier.attest import Who
from krill.verifier.loop import LoopSettings, VerifierLoop
from krill.verifier.replay import ReplayResult
from krill.verifier.state import ATTESTED, ERROR, PENDING, Job, VerifierState

RUN = b"\x01" * 32
CONTRACT = "0x" + "cc" * 20
ME = "0x" + "dd" * 20
WORKER = "0x" + "ab" * 20
WINDOW = 40
COMMIT_BLOCK = 100
TOP = 2**64 - 1  # the largest nonce the contract accepts


def _job(commit_id: int, nonce: int, version: int = 3) -> Job:
    return Job(commit_id, WORKER, version, nonce, hashlib.sha256(bytes([commit_id % 256])).digest(), COMMIT_BLOCK)


def _committed(job: Job) -> Committed:
    return Committed(block_number=job.commit_block, transaction_hash="0x" + "00" * 32, log_index=0, address=CONTRACT,
                     commit_id=job.commit_id, run_id=RUN, worker=job.worker, version=job.version, nonce=job.nonce,
                     header_digest=job.header_digest)


class Stream:
    """Hands out one batch of events, then nothing."""

    def __init__(self, events, from_block):
        self.events, self.next_block = list(events), from_block

    def poll(self, kinds):
        events, self.events = self.events, []
        self.next_block = COMMIT_BLOCK + 1
        return events


class FakeChain:
    """Every commit is sealed and selects this verifier; attestations land."""

    address = CONTRACT

    def __init__(self, events=()):
        self.events = events
        self.attestations: dict[int, SimpleNamespace] = {}

    def block_number(self):
        return COMMIT_BLOCK + 5

    def block_hash(self, number):
        return b"\x09" * 32

    def randomness_of(self, commit_id):
        return b"\x09" * 32

    def is_check_selected(self, commit_id, key):
        return True

    def attestation_of(self, commit_id, verifier):
        return self.attestations.get(commit_id, SimpleNamespace(exists=False, ok=False))

    def attest(self, commit_id, ok, digest):
        self.attestations[commit_id] = SimpleNamespace(exists=True, ok=ok)
        return SimpleNamespace(transaction_hash="0x" + "ee" * 32)

    def run_of(self, run_id):
        return SimpleNamespace(created_block=0)

    def event_stream(self, from_block, confirmations):
        return Stream(self.events, from_block)


class FakeStore:
    def put_block(self, data, pin=False):
        return digest_to_cid(hashlib.sha256(data).digest())


class FakeReplayer:
    """Passes every commit, remembering the nonce each replay was given."""

    nonces: dict[int, int] = {}

    def __init__(self, *args):
        pass

    def forget_fetches(self, commit_id):
        pass

    def replay(self, job, randomness, shard=None, wait_s=None):
        FakeReplayer.nonces[job.commit_id] = job.nonce
        return ReplayResult(True, "passed", [check_record("signature", True, "ok", {}, 0.001)])


def _loop(tmp_path, monkeypatch, events) -> VerifierLoop:
    monkeypatch.setattr(loop_module, "Replayer", FakeReplayer)
    FakeReplayer.nonces = {}
    state = VerifierState(tmp_path / "v.sqlite", contract=CONTRACT, run_id=RUN, verifier=ME)
    spec = SimpleNamespace(run_id=RUN, chain=SimpleNamespace(challenge_window_blocks=WINDOW,
                                                             check_probability_ppm=1_000_000))
    lines: list[str] = []
    loop = VerifierLoop(FakeChain(events), FakeStore(), spec, state, Who(31337, CONTRACT, ME, b"\x07" * 32, "hf"),
                        LoopSettings(payload_retry_s=0.0, max_backoff_s=0.0), echo=lines.append)
    loop.lines = lines
    return loop


def test_every_uint64_nonce_round_trips_through_the_state(tmp_path):
    path = tmp_path / "v.sqlite"
    state = VerifierState(path, contract=CONTRACT, run_id=RUN, verifier=ME)
    jobs = [_job(1, 0), _job(2, 2**63 - 1), _job(3, 2**63), _job(4, TOP)]
    assert state.add_events(jobs, [], next_block=COMMIT_BLOCK + 1) == (4, [], [])
    state.close()
    again = VerifierState(path, contract=CONTRACT, run_id=RUN, verifier=ME)
    assert again.pending() == jobs
    assert again.cursor() == COMMIT_BLOCK + 1
    again.close()


def test_a_commit_with_the_largest_nonce_is_drawn_replayed_and_attested(tmp_path, monkeypatch):
    loop = _loop(tmp_path, monkeypatch, [_committed(_job(7, TOP))])
    assert loop.step() == 1
    assert FakeReplayer.nonces == {7: TOP}
    decision = loop.state.decision(7)
    assert (decision.status, decision.ok) == (ATTESTED, True)
    assert loop.chain.attestations[7].exists


def test_a_state_file_whose_nonce_column_is_integer_is_migrated_with_its_commits(tmp_path):
    path = tmp_path / "v.sqlite"
    VerifierState(path, contract=CONTRACT, run_id=RUN, verifier=ME).close()  # meta as the current release writes
    db = sqlite3.connect(path)
    db.executescript(f"""
        DROP TABLE commits;
        CREATE TABLE commits (commit_id INTEGER PRIMARY KEY, worker TEXT NOT NULL, version INTEGER NOT NULL,
            nonce INTEGER NOT NULL, header_digest TEXT NOT NULL, commit_block INTEGER NOT NULL, status TEXT NOT NULL,
            ok INTEGER, reason TEXT, evidence_cid TEXT, tx_hash TEXT, updated REAL NOT NULL, corroborates TEXT,
            failing_evidence TEXT, origin TEXT);
        CREATE INDEX commits_status ON commits (status, commit_id);
        INSERT INTO commits VALUES (1, '{WORKER}', 3, {2**63 - 1}, '{_job(1, 0).header_digest.hex()}', {COMMIT_BLOCK},
            'pending', NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL);
        INSERT INTO commits VALUES (2, '{WORKER}', 3, 5, '02', {COMMIT_BLOCK}, 'attested', 1, 'passed', 'bafy',
            '0x01', 0, NULL, NULL, 'selected');
        INSERT INTO meta VALUES ('cursor', '{COMMIT_BLOCK + 1}');
    """)
    db.close()
    state = VerifierState(path, contract=CONTRACT, run_id=RUN, verifier=ME)
    assert state.pending() == [_job(1, 2**63 - 1)]
    decision = state.decision(2)
    assert (decision.status, decision.ok, decision.reason, decision.evidence_cid, decision.origin) == (
        ATTESTED, True, "passed", "bafy", "selected")
    assert state.cursor() == COMMIT_BLOCK + 1
    assert state.add_events([_job(3, TOP)], [], next_block=COMMIT_BLOCK + 2)[0] == 1
    assert state.pending() == [_job(1, 2**63 - 1), _job(3, TOP)]
    state.close()
    columns = {row[1]: row[2] for row in sqlite3.connect(path).execute("PRAGMA table_info(commits)")}
    assert columns["nonce"] == "TEXT"
    VerifierState(path, contract=CONTRACT, run_id=RUN, verifier=ME).close()  # reopening changes nothing more


@pytest.mark.parametrize("odd", [
    pytest.param(_job(2, 2**63), id="nonce-beyond-int64"),
    pytest.param(_job(2, 5, version=2**63), id="unrecordable-version"),
    pytest.param(_job(2**63, 5), id="unrecordable-commit-id"),
])
def test_one_odd_event_does_not_stop_the_loop_or_lose_its_batch(tmp_path, monkeypatch, odd):
    events = [_committed(_job(1, 0)), _committed(odd), _committed(_job(3, 1))]
    loop = _loop(tmp_path, monkeypatch, events)
    loop.poll_events()
    state = loop.state
    assert state.cursor() == COMMIT_BLOCK + 1  # the batch was saved and the cursor moved past it
    assert state.decision(1).status == PENDING and state.decision(3).status == PENDING
    if odd.nonce == 2**63:
        assert state.decision(2).status == PENDING
        assert [j.nonce for j in state.pending() if j.commit_id == 2] == [2**63]
        return
    logged = [line for line in loop.lines if f"commit {odd.commit_id} " in line]
    assert len(logged) == 1 and "ERROR (event not recorded" in logged[0]
    if odd.commit_id == 2:  # a commit id a row can hold: recorded as an error with the reason
        decision = state.decision(2)
        assert decision.status == ERROR and "version" in decision.reason and str(2**63) in decision.reason
    assert state.counts()[ERROR] == (1 if odd.commit_id == 2 else 0)
