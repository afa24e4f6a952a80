"""Corroboration against in-process fakes of chain and store: another verifier's failing verdict on a
commit of the run makes this verifier replay it whatever its draw and attest its own verdict, while the
window is open and it has not decided the commit; a passing verdict, a closed window or a decided commit
change nothing; the mark travels with the event cursor, so neither a restart nor a failed poll loses it."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from types import SimpleNamespace

import pytest

import krill.verifier.loop as loop_module
from krill.chain.events import Attested, Committed
from krill.errors import ChainUnavailableError
from krill.protocol.evidence import Evidence, check_record, load_evidence, publish_evidence
from krill.store.cid import digest_to_cid
from krill.verifier.attest import Who
from krill.verifier.loop import LoopSettings, VerifierLoop
from krill.verifier.replay import ReplayResult
from krill.verifier.state import ATTESTED, CORROBORATING, SELECTED, SKIPPED, FailingVerdict, VerifierState

RUN = b"\x01" * 32
CONTRACT = "0x" + "cc" * 20
ME = "0x" + "dd" * 20
OTHER = "0x" + "ee" * 20
WORKER = "0x" + "ab" * 20
WINDOW = 40
COMMIT_BLOCK = 100
HEADER = b"\x05" * 32
RANDOMNESS = b"\x09" * 32


def _where(block: int) -> dict:
    return {"block_number": block, "transaction_hash": "0x" + "00" * 32, "log_index": 0, "address": CONTRACT}


def committed(commit_id: int = 7, block: int = COMMIT_BLOCK, run: bytes = RUN) -> Committed:
    return Committed(**_where(block), commit_id=commit_id, run_id=run, worker=WORKER, version=3, nonce=0,
                     header_digest=HEADER)


def attested(ok: bool, commit_id: int = 7, block: int = COMMIT_BLOCK + 3, verifier: str = OTHER,
             digest: bytes = b"\x44" * 32) -> Attested:
    return Attested(**_where(block), commit_id=commit_id, verifier=verifier, ok=ok, evidence_digest=digest,
                    pass_count=int(ok), fail_count=int(not ok))


class FakeStream:
    """The contract's events up to the chain's head, from a cursor; `fail` makes the next poll fail whole."""

    def __init__(self, chain, from_block):
        self.chain, self.next_block, self.fail = chain, from_block, False

    def poll(self, kinds):
        if self.fail:
            self.fail = False
            raise ChainUnavailableError("eth_getLogs: connection refused")
        last = self.chain.head
        out = [e for e in self.chain.events if self.next_block <= e.block_number <= last and isinstance(e, kinds)]
        self.next_block = max(self.next_block, last + 1)
        return out


class FakeChain:
    """A chain whose commits are sealed; `selected` says whether they select this verifier."""

    address = CONTRACT

    def __init__(self):
        self.head = COMMIT_BLOCK + 5
        self.selected = False
        self.events: list = [committed()]
        self.attestations: dict[int, SimpleNamespace] = {}
        self.sent = 0
        self.streams: list[FakeStream] = []

    def block_number(self):
        return self.head

    def block_hash(self, number):
        return RANDOMNESS

    def randomness_of(self, commit_id):
        return RANDOMNESS

    def is_check_selected(self, commit_id, key):
        return self.selected

    def attestation_of(self, commit_id, verifier):
        return self.attestations.get(commit_id, SimpleNamespace(exists=False, ok=False))

    def attest(self, commit_id, ok, digest):
        self.sent += 1
        self.attestations[commit_id] = SimpleNamespace(exists=True, ok=ok)
        return SimpleNamespace(transaction_hash="0x" + "ee" * 32)

    def run_of(self, run_id):
        return SimpleNamespace(created_block=0)

    def event_stream(self, from_block, confirmations):
        self.streams.append(FakeStream(self, from_block))
        return self.streams[-1]

    def emit(self, *events) -> None:
        """Events mined in a new block."""
        self.head += 1
        self.events += [dataclasses.replace(e, block_number=self.head) for e in events]


class FakeStore:
    def __init__(self):
        self.blocks: dict[str, bytes] = {}

    def put_block(self, data, pin=False):
        cid = digest_to_cid(hashlib.sha256(data).digest())
        self.blocks[cid] = data
        return cid

    def get(self, cid, max_bytes=None):
        return self.blocks[cid]


class FakeReplayer:
    """Replays with the verdict the test sets; remembers the shard each replay was asked to recompute."""

    shards: list = []
    ok = True

    def __init__(self, *args):
        pass

    def forget_fetches(self, commit_id):
        pass

    def replay(self, job, randomness, shard=None, wait_s=None):
        FakeReplayer.shards.append(shard)
        if FakeReplayer.ok:
            return ReplayResult(True, "passed", [check_record("gradient", True, "ok", {}, 0.001)], gradient_shard=shard)
        return ReplayResult(False, "gradient", [check_record("gradient", False, "cosine 0.2", {}, 0.001)],
                            gradient_shard=shard)


def failing_evidence(store: FakeStore, shard: int = 1) -> bytes:
    """Publish the other verifier's failing evidence of commit 7; returns the digest it attested."""
    evidence = Evidence(chain_id=31337, contract=CONTRACT, run_id=RUN.hex(), commit_id=7, header_digest=HEADER.hex(),
                        header_cid=digest_to_cid(HEADER), worker=WORKER, model_version=3, behaviour_version=3, nonce=0,
                        verifier=OTHER, verifier_key=("06" * 32), randomness=RANDOMNESS.hex(), gradient_shard=shard,
                        ok=False, reason="gradient", checks=[check_record("gradient", False, "cosine 0.2", {}, 0.01)],
                        engine="hf", krill_version="test")
    return publish_evidence(store, evidence)[1]


def make_loop(path, chain, store) -> VerifierLoop:
    state = VerifierState(path, contract=CONTRACT, run_id=RUN, verifier=ME)
    spec = SimpleNamespace(run_id=RUN, chain=SimpleNamespace(challenge_window_blocks=WINDOW,
                                                             check_probability_ppm=1_000_000 if chain.selected else 0))
    lines: list[str] = []
    loop = VerifierLoop(chain, store, spec, state, Who(31337, CONTRACT, ME, b"\x07" * 32, "hf"),
                        LoopSettings(payload_retry_s=0.0, max_backoff_s=0.0), echo=lines.append)
    loop.lines = lines
    return loop


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    monkeypatch.setattr(loop_module, "Replayer", FakeReplayer)
    FakeReplayer.shards, FakeReplayer.ok = [], True
    return SimpleNamespace(path=tmp_path / "v.sqlite", chain=FakeChain(), store=FakeStore())


@pytest.fixture
def verifier(fakes):
    """A verifier not drawn on commit 7, which it has already skipped."""
    loop = make_loop(fakes.path, fakes.chain, fakes.store)
    loop.step()
    assert loop.state.decision(7).status == SKIPPED and FakeReplayer.shards == []
    return loop


def _step_until_attested(verifier, commit_id: int = 7, timeout: float = 30.0) -> int:
    """Step until `commit_id` is attested; the attestations the steps sent. The failing evidence is fetched on a
    thread, and a step waits for it no longer than the block deadline allows: nothing here, where the fake head
    moves a block between two reads a moment apart (a pace of 0 s a block), so on a loaded machine the step that
    asked for it leaves it to the next one."""
    sent, deadline = 0, time.monotonic() + timeout
    while verifier.state.decision(commit_id).status != ATTESTED and time.monotonic() < deadline:
        sent += verifier.step()
    return sent


@pytest.mark.parametrize("honest_verdict", [True, False], ids=["refutes", "confirms"])
def test_a_commit_another_verifier_failed_is_replayed_and_attested_though_not_selected(verifier, honest_verdict):
    chain, store = verifier.chain, verifier.store
    FakeReplayer.ok = honest_verdict
    digest = failing_evidence(store, shard=1)
    chain.emit(attested(False, digest=digest))
    assert _step_until_attested(verifier) == 1
    decision = verifier.state.decision(7)
    assert (decision.status, decision.ok) == (ATTESTED, honest_verdict)  # its own verdict, not the other's
    assert (decision.origin, decision.corroborates) == (CORROBORATING, OTHER)
    assert chain.attestations[7].ok is honest_verdict and chain.sent == 1
    assert FakeReplayer.shards == [1]  # the shard the failing evidence names
    mine = load_evidence(store, decision.evidence_cid)
    assert (mine.verifier, mine.ok, mine.gradient_shard, mine.randomness) == (ME, honest_verdict, 1, RANDOMNESS.hex())
    assert any("attested FAIL: replaying it to corroborate" in line for line in verifier.lines)
    counts = verifier.state.counts()
    assert (counts["corroborated"], counts["corroborated_failed"], counts[SKIPPED]) == (1, int(not honest_verdict), 0)


def test_unreadable_failing_evidence_falls_back_to_the_drawn_shard(verifier):
    verifier.store.get = lambda cid, max_bytes=None: b"not canonical json"
    verifier.chain.emit(attested(False, digest=b"\x66" * 32))
    assert _step_until_attested(verifier) == 1
    assert verifier.state.decision(7).status == ATTESTED and FakeReplayer.shards == [None]
    assert any("cannot be read" in line for line in verifier.lines)


@pytest.mark.parametrize("event", [
    pytest.param(attested(True), id="another-verifier-passed"),
    pytest.param(attested(False, verifier=ME), id="this-verifiers-own-fail"),
    pytest.param(attested(False, commit_id=8), id="a-commit-of-another-run"),
])
def test_no_failing_verdict_of_another_verifier_on_this_run_no_replay(verifier, event):
    verifier.chain.emit(committed(8, run=b"\x02" * 32), event)
    verifier.step()
    assert verifier.state.decision(7).status == SKIPPED and verifier.state.decision(8) is None
    assert FakeReplayer.shards == [] and verifier.chain.sent == 0


def test_a_failing_verdict_read_after_the_window_closed_is_not_corroborated(verifier):
    chain = verifier.chain
    chain.events.append(attested(False, block=COMMIT_BLOCK + WINDOW))  # the last block in which it counts
    chain.head = COMMIT_BLOCK + WINDOW  # read only now: no transaction sent now can land in time
    verifier.step()
    decision = verifier.state.decision(7)
    assert decision.status == SKIPPED and decision.corroborates is None and "not selected" in decision.reason
    assert FakeReplayer.shards == [] and chain.sent == 0


def test_a_commit_already_attested_is_not_replayed_again(fakes):
    fakes.chain.selected = True
    loop = make_loop(fakes.path, fakes.chain, fakes.store)
    loop.step()
    assert loop.state.decision(7).status == ATTESTED and FakeReplayer.shards == [None]
    fakes.chain.emit(attested(False, digest=failing_evidence(fakes.store)))
    loop.step()
    decision = loop.state.decision(7)
    assert (decision.status, decision.origin, decision.corroborates) == (ATTESTED, SELECTED, None)
    assert FakeReplayer.shards == [None] and fakes.chain.sent == 1


def test_a_selected_commit_failed_by_others_in_the_same_poll_is_replayed_once_as_selected(fakes):
    fakes.chain.selected = True
    third = "0x" + "f1" * 20
    fakes.chain.events += [attested(False, digest=failing_evidence(fakes.store)),
                           attested(False, verifier=third, block=COMMIT_BLOCK + 4)]
    loop = make_loop(fakes.path, fakes.chain, fakes.store)
    assert loop.step() == 1
    decision = loop.state.decision(7)
    assert (decision.status, decision.origin, decision.corroborates) == (ATTESTED, SELECTED, OTHER)
    assert FakeReplayer.shards == [1] and fakes.chain.sent == 1
    assert sum("replaying it to corroborate" in line for line in loop.lines) == 1  # marked by the first only
    assert loop.state.counts()["corroborated"] == 0  # it was selected: no corroboration to count


def test_the_mark_is_saved_with_the_cursor_so_a_restart_still_corroborates(fakes):
    fakes.chain.events.append(attested(False, digest=failing_evidence(fakes.store)))
    loop = make_loop(fakes.path, fakes.chain, fakes.store)
    loop.poll_events()  # killed right after the poll that read both events
    cursor = loop.state.cursor()
    assert cursor == fakes.chain.head + 1 == loop._stream.next_block
    loop.state.close()
    fakes.chain.head += 2
    again = make_loop(fakes.path, fakes.chain, fakes.store)
    assert fakes.chain.streams[-1].next_block == cursor  # the events before the cursor are not read again
    assert again.step() == 1
    decision = again.state.decision(7)
    assert (decision.status, decision.origin, decision.corroborates) == (ATTESTED, CORROBORATING, OTHER)
    assert FakeReplayer.shards == [1]


def test_a_failed_poll_moves_no_cursor_and_loses_no_failing_verdict(verifier):
    chain = verifier.chain
    before = verifier.state.cursor()
    chain.emit(attested(False, digest=failing_evidence(verifier.store)))
    verifier._stream.fail = True
    with pytest.raises(ChainUnavailableError):
        verifier.step()  # `run` backs off and steps again
    assert verifier.state.cursor() == before and verifier.state.decision(7).status == SKIPPED
    assert verifier.step() == 1
    assert verifier.state.decision(7).status == ATTESTED and verifier.state.cursor() == chain.head + 1


def test_a_fault_after_the_poll_before_the_save_rewinds_the_stream_and_loses_no_event(verifier):
    """The poll moved the stream's cursor; the head read for the window (or the save) then failed: the
    next pass reads the same events again, so neither the failing verdict nor a new commit is lost."""
    chain = verifier.chain
    before = verifier.state.cursor()
    chain.emit(committed(8), attested(False, digest=failing_evidence(verifier.store)))
    head = chain.block_number

    def unreachable():
        raise ChainUnavailableError("eth_blockNumber: the chain RPC did not answer after 5 attempts")

    chain.block_number = unreachable
    with pytest.raises(ChainUnavailableError):
        verifier.poll_events()  # `run` backs off and steps again
    assert verifier._stream.next_block == before == verifier.state.cursor()
    chain.block_number = head
    chain.emit(committed(9))
    assert verifier.poll_events() == 2  # commits 8 and 9
    assert verifier.state.decision(7).corroborates == OTHER
    assert verifier.state.cursor() == chain.head + 1


def test_failing_evidence_slow_to_fetch_does_not_hold_the_loop(verifier):
    """A failing verdict whose evidence nobody serves cost the store's timeout (60 s on Kubo) on the loop's
    thread on every retry. Now a pass waits 2 s at most and retries the commit; once the document comes,
    its shard is recomputed."""
    import threading

    chain, store = verifier.chain, verifier.store
    digest = failing_evidence(store, shard=1)
    served, real_get = threading.Event(), store.get

    def slow_get(cid, max_bytes=None):
        served.wait(30)
        return real_get(cid, max_bytes)

    store.get = slow_get
    chain.emit(attested(False, digest=digest))
    started = time.monotonic()
    assert verifier.step() == 0
    assert time.monotonic() - started < 10
    assert verifier.state.decision(7).status != ATTESTED and FakeReplayer.shards == []
    assert any("still being fetched" in line for line in verifier.lines), verifier.lines
    served.set()
    deadline = time.monotonic() + 30  # a loaded machine: the loop retries until the fetch comes
    while verifier.state.decision(7).status != ATTESTED and time.monotonic() < deadline:
        verifier.step()
    assert verifier.state.decision(7).status == ATTESTED and FakeReplayer.shards == [1]


def test_an_older_state_file_gains_the_new_columns(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE commits (commit_id INTEGER PRIMARY KEY, worker TEXT NOT NULL, version INTEGER NOT NULL,
            nonce INTEGER NOT NULL, header_digest TEXT NOT NULL, commit_block INTEGER NOT NULL, status TEXT NOT NULL,
            ok INTEGER, reason TEXT, evidence_cid TEXT, tx_hash TEXT, updated REAL NOT NULL);
        INSERT INTO commits VALUES (7, 'w', 3, 0, '05', 100, 'skipped', NULL, 'not selected', NULL, NULL, 0);
    """)
    db.close()
    state = VerifierState(path, contract=CONTRACT, run_id=RUN, verifier=ME)
    assert state.add_events([], [FailingVerdict(7, OTHER, b"\x44" * 32)], next_block=120) == (0, [7], [])
    assert [(j.commit_id, j.corroborates, j.failing_evidence) for j in state.pending()] == [(7, OTHER, b"\x44" * 32)]
    state.close()
