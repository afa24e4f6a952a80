"""Whose fault, and what the verifier does about it, against in-process fakes of chain and store: passing
faults while attesting are retried within the commit's window (an attestation that landed after all is
found on-chain, also after an outage that outlasted the window); an attestation mined but failed for no
reason its replay names is settled by what the chain shows, never recorded as an error; run data that fails to parse is never charged to the worker; a header whose nonce is not
its commit's fails the worker."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest
from nacl.signing import SigningKey
from web3.exceptions import TimeExhausted

import krill.verifier.loop as loop_module
from krill.errors import ContentNotFoundError, ContractRevert, StoreError, StoreUnavailableError
from krill.payload.header import HeaderBody
from krill.payload.limits import PayloadLimits
from krill.protocol.evidence import check_record
from krill.store.cid import digest_to_cid, file_cid
from krill.store.fetcher import Fetcher
from krill.verifier.attest import Who
from krill.verifier.loop import LoopSettings, VerifierLoop
from krill.verifier.replay import Policies, Replayer, ReplayResult, RunDataUnavailable, _Run
from krill.verifier.state import ATTESTED, ERROR, MISSED, PENDING, SKIPPED, Job, VerifierState

RUN = b"\x01" * 32
CONTRACT = "0x" + "cc" * 20
ME = "0x" + "dd" * 20
WORKER = "0x" + "ab" * 20
WINDOW = 40
COMMIT_BLOCK = 100


class FakeChain:
    """A chain whose commit 7 is sealed and selects this verifier; `attest` raises what the test scripts, and
    `lands` says whether the transaction reached the chain all the same (a receipt that never came)."""

    address = CONTRACT

    def __init__(self):
        self.head = COMMIT_BLOCK + 5
        self.attest_raises: Exception | None = None
        self.lands = False
        self.attestations: dict[int, SimpleNamespace] = {}
        self.sent = 0

    def block_number(self):
        return self.head

    def block_hash(self, number):
        return b"\x09" * 32

    def randomness_of(self, commit_id):
        return b"\x09" * 32

    def is_check_selected(self, commit_id, key):
        return True

    def attestation_of(self, commit_id, verifier):
        return self.attestations.get(commit_id, SimpleNamespace(exists=False, ok=False))

    def attest(self, commit_id, ok, digest):
        self.sent += 1
        if self.lands or self.attest_raises is None:
            self.attestations[commit_id] = SimpleNamespace(exists=True, ok=ok)
        if self.attest_raises is not None:
            raise self.attest_raises
        return SimpleNamespace(transaction_hash="0x" + "ee" * 32)

    def run_of(self, run_id):
        return SimpleNamespace(created_block=0)

    def event_stream(self, from_block, confirmations):
        return SimpleNamespace(poll=lambda kinds: [], next_block=from_block)


class FakeStore:
    def __init__(self):
        self.failures: list[Exception] = []
        self.blocks: list[bytes] = []

    def put_block(self, data, pin=False):
        if self.failures:
            raise self.failures.pop(0)
        self.blocks.append(data)
        return digest_to_cid(hashlib.sha256(data).digest())


class FakeReplayer:
    replays = 0

    def __init__(self, *args):
        pass

    def forget_fetches(self, commit_id):
        pass

    def replay(self, job, randomness, shard=None, wait_s=None):
        FakeReplayer.replays += 1
        return ReplayResult(True, "passed", [check_record("signature", True, "ok", {}, 0.001 * FakeReplayer.replays)])


@pytest.fixture
def verifier(tmp_path, monkeypatch):
    monkeypatch.setattr(loop_module, "Replayer", FakeReplayer)
    FakeReplayer.replays = 0
    state = VerifierState(tmp_path / "v.sqlite", contract=CONTRACT, run_id=RUN, verifier=ME)
    state.add_jobs([Job(7, WORKER, 3, 0, b"\x05" * 32, COMMIT_BLOCK)], next_block=COMMIT_BLOCK + 1)
    spec = SimpleNamespace(run_id=RUN, chain=SimpleNamespace(challenge_window_blocks=WINDOW,
                                                             check_probability_ppm=1_000_000))
    lines: list[str] = []
    loop = VerifierLoop(FakeChain(), FakeStore(), spec, state, Who(31337, CONTRACT, ME, b"\x07" * 32, "hf"),
                        LoopSettings(payload_retry_s=0.0, max_backoff_s=0.0), echo=lines.append)
    loop.lines = lines
    return loop


PASSING = [
    pytest.param("chain", TimeExhausted("attest: transaction 0x12 is not in the chain after 120 seconds"),
                 id="receipt-never-came"),
    pytest.param("store", ContentNotFoundError("Kubo at http://127.0.0.1:5001 did not answer block/put within 60.0s"),
                 id="kubo-timeout"),
    pytest.param("store", StoreError("Kubo block/put failed with HTTP 502: bad gateway"), id="kubo-5xx"),
]


@pytest.mark.parametrize(("where", "fault"), PASSING)
def test_a_passing_fault_while_attesting_is_retried_with_the_same_verdict(verifier, where, fault):
    chain, store = verifier.chain, verifier.store
    if where == "chain":
        chain.attest_raises = fault
    else:
        store.failures = [fault]
    verifier.step()
    assert verifier.state.decision(7).status == PENDING  # not a final 'error'
    assert any(type(fault).__name__ in line and "retrying" in line for line in verifier.lines)
    chain.attest_raises = None
    verifier.step()
    decision = verifier.state.decision(7)
    assert (decision.status, decision.ok, decision.tx_hash) == (ATTESTED, True, "0x" + "ee" * 32)
    assert FakeReplayer.replays == 1  # the verdict was kept, not replayed
    assert len(set(store.blocks)) == 1 and decision.evidence_cid == digest_to_cid(hashlib.sha256(store.blocks[0]).digest())
    assert verifier.attested == 1


def test_an_attestation_whose_receipt_never_came_but_landed_is_found_on_chain_not_sent_twice(verifier):
    chain = verifier.chain
    chain.attest_raises, chain.lands = TimeExhausted("attest: not in the chain after 120 seconds"), True
    verifier.step()
    assert verifier.state.decision(7).status == PENDING
    chain.attest_raises = None
    verifier.step()
    decision = verifier.state.decision(7)
    assert (decision.status, decision.ok) == (ATTESTED, True) and "passing fault" in decision.reason
    assert chain.sent == 1


@pytest.mark.parametrize("landed", [False, True])
def test_a_window_that_closes_during_the_retries_is_missed_naming_the_fault_unless_the_attestation_landed(
        verifier, landed):
    chain = verifier.chain
    chain.attest_raises, chain.lands = TimeExhausted("attest: not in the chain after 120 seconds"), landed
    verifier.step()
    chain.head = COMMIT_BLOCK + WINDOW  # no transaction sent now can land in time
    verifier.step()
    decision = verifier.state.decision(7)
    if landed:
        assert (decision.status, decision.ok) == (ATTESTED, True)
    else:
        assert decision.status == MISSED and "TimeExhausted" in decision.reason
    assert chain.sent == 1


def test_a_full_cap_of_attestations_with_this_outcome_is_missed_not_an_error(verifier):
    from krill.chain import errors as E

    verifier.chain.attest_raises = E.AttestationLimitReached("AttestationLimitReached(7, True, 32)", (7, True, 32))
    verifier.step()
    decision = verifier.state.decision(7)
    assert decision.status == MISSED and "cap of attestations" in decision.reason
    assert decision.evidence_cid is not None and verifier.attested == 0


def test_a_bug_while_attesting_is_still_recorded_as_error(verifier):
    verifier.chain.attest_raises = RuntimeError("a bug")
    verifier.step()
    decision = verifier.state.decision(7)
    assert decision.status == ERROR and "a bug" in decision.reason


@pytest.mark.parametrize("fault", ["unparsable-manifest", "kubo-5xx"])
def test_run_data_that_cannot_be_loaded_is_never_the_workers_fault(fault):
    bad = b"this is not a manifest"
    digest = hashlib.sha256(bad).digest()

    def get(cid, max_bytes=None, sha256=None):
        if fault == "kubo-5xx":
            raise StoreError("Kubo cat failed with HTTP 500: internal error")
        return bad

    spec = SimpleNamespace(run_id=b"\x11" * 32, base_manifest_cid=digest_to_cid(digest))
    chain = SimpleNamespace(version_of=lambda run, v: SimpleNamespace(manifest_digest=digest,
                                                                       record_digest=b"\x22" * 32))
    policies = Policies(chain, SimpleNamespace(get=get), spec)
    policies._tokenizer = SimpleNamespace(eos_token_id=1, pad_token_id=0)
    with pytest.raises(RunDataUnavailable, match="version 0"):
        policies.state(0)
    run = _Run()
    with pytest.raises(RunDataUnavailable):  # the resample stage loads the behaviour version first
        run.stage("resample", lambda: policies.engine(0))
    assert run.checks == []  # no failed check, nothing to attest against the worker


KEY = SigningKey(bytes(range(32)))
LIMITS = PayloadLimits(vocab_size=64)


def _replayer(header_bytes: bytes) -> Replayer:
    """A Replayer whose chain, store and run data are fakes; past the `signature` stage it raises
    RunDataUnavailable (the run's data is what the next stage loads)."""
    replayer = Replayer.__new__(Replayer)
    replayer.spec = SimpleNamespace(run_id=RUN, limits=LIMITS, compression=SimpleNamespace(dtype="fp16", block_size=32),
                                    staleness=SimpleNamespace(max_staleness=2))
    replayer.chain = SimpleNamespace(stake_of=lambda worker: SimpleNamespace(ed25519_public_key=bytes(KEY.verify_key)))
    replayer.store = SimpleNamespace(get=lambda cid, max_bytes=None: header_bytes)
    replayer.chain_id, replayer.contract, replayer.verifier_key = 31337, CONTRACT, b"\x07" * 32
    replayer._fetcher = Fetcher()

    def grad_lengths(version):
        raise RunDataUnavailable("stop after the signature stage")

    replayer.policies = SimpleNamespace(state=lambda v: SimpleNamespace(manifest_cid=file_cid(b"manifest v3")),
                                        grad_lengths=grad_lengths)
    return replayer


@pytest.mark.parametrize("committed_nonce", [4, 5])
def test_a_header_naming_another_nonce_than_its_commit_fails_the_worker_at_the_signature(committed_nonce):
    body = HeaderBody(run_id=RUN.hex(), chain_id=31337, contract=CONTRACT, worker=WORKER,
                      ed25519_key=bytes(KEY.verify_key).hex(), model_version=3, behaviour_version=3,
                      manifest_cid=file_cid(b"manifest v3"), task="arith", prompt_seed=1, nonce=4,
                      sampling={"temperature_milli": 1000, "top_p_milli": 1000, "top_k": 0, "max_new_tokens": 5,
                                "seed": 42}, files={})
    header = body.sign(KEY).encode()
    job = Job(7, WORKER, 3, committed_nonce, hashlib.sha256(header).digest(), COMMIT_BLOCK)
    replayer = _replayer(header)
    if committed_nonce == 4:
        with pytest.raises(RunDataUnavailable, match="after the signature"):  # the honest header passes
            replayer.replay(job, b"\x09" * 32)
        return
    result = replayer.replay(job, b"\x09" * 32)
    assert (result.ok, result.reason, result.failed_field) == (False, "signature", "header.nonce")
    assert "expected 5" in result.checks[-1].detail


def _honest_header() -> bytes:
    body = HeaderBody(run_id=RUN.hex(), chain_id=31337, contract=CONTRACT, worker=WORKER,
                      ed25519_key=bytes(KEY.verify_key).hex(), model_version=3, behaviour_version=3,
                      manifest_cid=file_cid(b"manifest v3"), task="arith", prompt_seed=1, nonce=0,
                      sampling={"temperature_milli": 1000, "top_p_milli": 1000, "top_k": 0, "max_new_tokens": 5,
                                "seed": 42}, files={})
    return body.sign(KEY).encode()


class FlakyStore:
    """This verifier's own store: `fault` is raised by every read and write while set; the worker's
    header is there all along."""

    def __init__(self, header: bytes):
        self.header, self.fault, self.gets, self.blocks = header, None, 0, {}

    def get(self, cid, max_bytes=None):
        self.gets += 1
        if self.fault is not None:
            raise self.fault
        return self.header

    def put_block(self, data, pin=False):
        if self.fault is not None:
            raise self.fault
        cid = digest_to_cid(hashlib.sha256(data).digest())
        self.blocks[cid] = data
        return cid


def _late_in_the_window(tmp_path, monkeypatch):
    """(loop, its store, chain, state): commit 7 of an honest header, the real Replayer over a `FlakyStore`
    (stopped after the signature by the fake run data), the head past `unavailable_after` (a missing
    payload would now be attested)."""
    header = _honest_header()
    store = FlakyStore(header)
    replayer = _replayer(header)
    replayer.store = store
    monkeypatch.setattr(loop_module, "Replayer", lambda *args: replayer)
    state = VerifierState(tmp_path / "v.sqlite", contract=CONTRACT, run_id=RUN, verifier=ME)
    state.add_jobs([Job(7, WORKER, 3, 0, hashlib.sha256(header).digest(), COMMIT_BLOCK)], next_block=COMMIT_BLOCK + 1)
    spec = SimpleNamespace(run_id=RUN, chain=SimpleNamespace(challenge_window_blocks=WINDOW,
                                                             check_probability_ppm=1_000_000))
    chain = FakeChain()
    chain.head = COMMIT_BLOCK + WINDOW - 5
    loop = VerifierLoop(chain, store, spec, state, Who(31337, CONTRACT, ME, b"\x07" * 32, "hf"),
                        LoopSettings(payload_retry_s=0.0, max_backoff_s=0.0), echo=lambda line: None)
    return loop, store, chain, state


@pytest.mark.parametrize("fault", [
    pytest.param(StoreUnavailableError("cannot reach Kubo at http://127.0.0.1:5001 (connection refused)"),
                 id="store-unreachable"),
    pytest.param(StoreError("Kubo block/get failed with HTTP 500: internal error"), id="kubo-5xx"),
])
def test_the_verifiers_own_store_failing_late_in_the_window_is_never_the_workers_fault(tmp_path, monkeypatch, fault):
    """Its own store down in the last quarter of the window used to become an 'unavailable' FAIL of the
    honest worker, kept across the evidence upload's failure and attested once the store came back."""
    loop, store, chain, state = _late_in_the_window(tmp_path, monkeypatch)
    store.fault = fault
    for _ in range(3):
        try:
            loop.step()
        except StoreUnavailableError:
            pass  # `run` backs off and steps again
    assert chain.sent == 0 and state.decision(7).status == PENDING
    store.fault = None
    loop.step()  # the worker's header is fetched now; the fake run data stops the replay after the signature
    assert chain.sent == 0 and state.decision(7).status == PENDING and store.gets >= 4


def test_an_unavailable_verdict_is_not_kept_across_a_fault_while_attesting(tmp_path, monkeypatch):
    """The payload was missing late in the window, then the evidence upload failed: the retry fetches again
    instead of attesting the kept 'unavailable' verdict against a payload that is there by then."""
    loop, store, chain, state = _late_in_the_window(tmp_path, monkeypatch)
    missing = ContentNotFoundError("Kubo at http://127.0.0.1:5001 did not answer block/get within 60.0s")
    store.get = lambda cid, max_bytes=None: (_ for _ in ()).throw(missing)
    store.fault = StoreError("Kubo block/put failed with HTTP 502: bad gateway")  # the evidence upload
    loop.step()
    assert chain.sent == 0 and state.decision(7).status == PENDING
    del store.get  # the payload is there now, and the store answers again
    store.fault = None
    loop.step()
    assert chain.sent == 0 and state.decision(7).status == PENDING  # replayed, not the kept FAIL attested


def test_a_slow_fetch_late_in_the_window_is_waited_for_not_attested_unavailable(tmp_path, monkeypatch):
    """A verifier that first asks for an honest payload in the last quarter of the window (restarted after
    an outage, or corroborating a late failing verdict) attested it unavailable when one fetch took longer
    than a pass waits; a fetch still running now gets until `still_fetching_until`, and only then fails."""
    import threading
    import time

    import krill.store.fetcher as fetcher_module
    from krill.verifier import select

    monkeypatch.setattr(fetcher_module, "PASS_WAIT_S", 0.05)
    loop, store, chain, state = _late_in_the_window(tmp_path, monkeypatch)
    chain.head = select.unavailable_after(COMMIT_BLOCK, WINDOW) + 1  # a missing payload would be attested now
    assert chain.head < select.still_fetching_until(COMMIT_BLOCK, WINDOW)
    release, get = threading.Event(), store.get

    def slow_get(cid, max_bytes=None):
        release.wait(60)  # the content is there; the store takes its time (until the test sets it)
        return get(cid, max_bytes=max_bytes)

    store.get = slow_get
    try:
        loop.step()
        assert chain.sent == 0 and state.decision(7).status == PENDING  # waited for, not attested unavailable
        release.set()
        fetcher, deadline = loop.replayer._fetcher, time.monotonic() + 30
        while fetcher.in_flight():  # the fetch ends, its result waits to be taken
            assert time.monotonic() < deadline, "the released fetch did not end in 30 s"
            time.sleep(0.01)
        loop._retry_at.clear()
        loop.step()  # the fetch has ended: the honest header passes (the fake run data stops the replay after it)
        assert chain.sent == 0 and state.decision(7).status == PENDING and store.gets >= 1

        release.clear()
        chain.head = select.still_fetching_until(COMMIT_BLOCK, WINDOW)  # a fetch that never ends is given up on
        loop._retry_at.clear()
        loop.step()
    finally:
        release.set()
    decision = state.decision(7)
    assert (chain.sent, decision.status, decision.ok, decision.reason) == (1, ATTESTED, False, "unavailable")
    assert select.can_still_attest(chain.head, COMMIT_BLOCK, WINDOW)


def test_an_attestation_sent_before_a_chain_outage_that_outlasts_the_window_is_found_on_chain(verifier):
    from krill.errors import ChainUnavailableError

    chain = verifier.chain
    chain.attest_raises = ChainUnavailableError("http://127.0.0.1:8545: connection refused after 5 tries")
    chain.lands = True  # sent, then the node went away before the receipt was read
    with pytest.raises(ChainUnavailableError):
        verifier.step()  # the loop's `run` backs off; the outage lasts past the window
    chain.attest_raises = None
    chain.head = COMMIT_BLOCK + WINDOW
    verifier.step()
    decision = verifier.state.decision(7)
    assert (decision.status, decision.ok) == (ATTESTED, True) and chain.sent == 1


def test_a_retry_refused_as_too_late_after_an_earlier_try_landed_records_that_attestation(verifier):
    """The try whose receipt never came is mined in the window's last block; the retry's estimate, a block
    later, reverts `AttestationWindowClosed` (the contract checks the window before the duplicate). The
    commit was recorded as missed though this verifier's verdict stands on-chain."""
    from krill.chain import errors as E

    chain = verifier.chain
    chain.attest_raises = TimeExhausted("attest: transaction 0x12 is not in the chain after 120 seconds")
    verifier.step()
    assert verifier.state.decision(7).status == PENDING
    chain.head = COMMIT_BLOCK + WINDOW - 1  # the retry still sees the window open

    def attest_too_late(commit_id, ok, digest):
        chain.sent += 1
        chain.attestations[commit_id] = SimpleNamespace(exists=True, ok=True)  # the first try, mined meanwhile
        chain.head = COMMIT_BLOCK + WINDOW + 1
        raise E.AttestationWindowClosed(f"AttestationWindowClosed({commit_id})", (commit_id, 140, 141))

    chain.attest = attest_too_late
    verifier._retry_at.clear()
    verifier.step()
    decision = verifier.state.decision(7)
    assert (decision.status, decision.ok) == (ATTESTED, True), decision
    assert verifier.attested == 0  # nothing new was attested by this try


@pytest.mark.parametrize(("probability_ppm", "status"), [(0, SKIPPED), (1_000_000, MISSED)])
def test_a_commit_whose_window_closed_before_the_verifier_looked_is_missed_only_if_drawn(tmp_path, monkeypatch,
                                                                                         probability_ppm, status):
    """A verifier down for a while (or starting on a run under way) recorded every commit of the gap as missed,
    those its draw passes over too: status reported as missed work it never had to do."""
    monkeypatch.setattr(loop_module, "Replayer", FakeReplayer)
    state = VerifierState(tmp_path / "v.sqlite", contract=CONTRACT, run_id=RUN, verifier=ME)
    state.add_jobs([Job(7, WORKER, 3, 0, b"\x05" * 32, COMMIT_BLOCK)], next_block=COMMIT_BLOCK + 1)
    spec = SimpleNamespace(run_id=RUN, chain=SimpleNamespace(challenge_window_blocks=WINDOW,
                                                             check_probability_ppm=probability_ppm))
    chain = FakeChain()
    chain.head = COMMIT_BLOCK + 10 * WINDOW
    loop = VerifierLoop(chain, FakeStore(), spec, state, Who(31337, CONTRACT, ME, b"\x07" * 32, "hf"),
                        LoopSettings(payload_retry_s=0.0, max_backoff_s=0.0), echo=lambda line: None)
    loop.step()
    assert state.decision(7).status == status and chain.sent == 0
    assert state.counts()[MISSED] == (status == MISSED)


def test_an_attestation_an_earlier_run_sent_is_found_when_the_verifier_comes_back_after_the_window(tmp_path,
                                                                                                     monkeypatch):
    """A verifier stopped while its attestation was on its way (Ctrl-C during the receipt wait, a crash right
    after it was mined) and restarted once the window had closed recorded the commit as missed: the chain was
    asked only after a fault this process had seen. Its attestation is the verdict."""
    monkeypatch.setattr(loop_module, "Replayer", FakeReplayer)
    FakeReplayer.replays = 0
    state = VerifierState(tmp_path / "v.sqlite", contract=CONTRACT, run_id=RUN, verifier=ME)
    state.add_jobs([Job(7, WORKER, 3, 0, b"\x05" * 32, COMMIT_BLOCK)], next_block=COMMIT_BLOCK + 1)
    spec = SimpleNamespace(run_id=RUN, chain=SimpleNamespace(challenge_window_blocks=WINDOW,
                                                             check_probability_ppm=1_000_000))
    chain = FakeChain()
    chain.attestations[7] = SimpleNamespace(exists=True, ok=False)  # mined in the window, before the stop
    chain.head = COMMIT_BLOCK + 10 * WINDOW
    loop = VerifierLoop(chain, FakeStore(), spec, state, Who(31337, CONTRACT, ME, b"\x07" * 32, "hf"),
                        LoopSettings(payload_retry_s=0.0, max_backoff_s=0.0), echo=lambda line: None)
    loop.step()
    decision = state.decision(7)
    assert (decision.status, decision.ok, decision.reason) == (ATTESTED, False, "found on chain (earlier run)")
    assert chain.sent == 0 and state.counts()[MISSED] == 0 and FakeReplayer.replays == 0


class TransactionFailed(ContractRevert):
    """As `krill.chain.tx` may name a mined failure no replay explains: a ContractRevert naming no error."""


def _mined_but_failed(kind=ContractRevert):
    return kind("attest: transaction 0x12 failed on chain (status 0) and its replay did not revert; "
                "the state it depended on changed in between")


@pytest.mark.parametrize("landed", [False, True])
def test_an_attestation_that_fails_once_mined_with_the_window_still_open_is_retried_not_an_error(verifier, landed):
    chain = verifier.chain
    chain.attest_raises = _mined_but_failed()
    verifier.step()
    assert verifier.state.decision(7).status == PENDING
    assert any("AttestationUnsettled" in line and "failed on chain" in line for line in verifier.lines)
    chain.attest_raises, chain.lands = None, landed  # landed: an earlier try of ours was mined meanwhile
    if landed:
        chain.attestations[7] = SimpleNamespace(exists=True, ok=True)
    verifier.step()
    decision = verifier.state.decision(7)
    assert (decision.status, decision.ok) == (ATTESTED, True)
    assert chain.sent == (1 if landed else 2)


@pytest.mark.parametrize("kind", [ContractRevert, TransactionFailed])
def test_an_attestation_that_fails_once_mined_after_the_window_closed_is_missed_not_an_error(verifier, kind):
    chain = verifier.chain
    chain.attest_raises = _mined_but_failed(kind)
    original = chain.attest

    def attest_mined_late(*args):
        chain.head = COMMIT_BLOCK + WINDOW + 1  # mined in the block after the window's last
        return original(*args)

    chain.attest = attest_mined_late
    verifier.step()
    decision = verifier.state.decision(7)
    assert decision.status == MISSED and "window closed" in decision.reason and decision.evidence_cid is not None
    assert chain.sent == 1 and verifier.attested == 0


def _fill_to_a_page_cap(state: VerifierState) -> None:
    """SQLite's own full disk: the file may grow no more (`max_page_count`), and the commits table's page is
    filled with rows of other commits until nothing fits, so the next row that grows finds no room."""
    import sqlite3

    db = state._db
    db.execute(f"PRAGMA max_page_count = {db.execute('PRAGMA page_count').fetchone()[0]}")
    commit_id = 1000
    for size in (400, 100, 25, 5, 1):
        while True:
            try:
                db.execute("INSERT INTO commits (commit_id, worker, version, nonce, header_digest, commit_block, "
                           "status, reason, updated) VALUES (?, ?, 0, '0', '00', 0, ?, ?, 0)",
                           (commit_id, WORKER, SKIPPED, "x" * size))
            except sqlite3.OperationalError as exc:
                assert exc.sqlite_errorname == "SQLITE_FULL"
                break
            commit_id += 1


def test_a_full_disk_under_the_state_file_stops_the_verifier_naming_it_and_loses_nothing(verifier):
    """The attestation is sent and its record finds no room: one error naming the state file (it
    was sqlite3's bare "database or disk is full" naming none), the commit is not recorded as an `error`,
    and the restart, with room again, finds the attestation on-chain and records it without a second one."""
    from krill.errors import KrillError  # what the CLI reports as one line

    state, chain = verifier.state, verifier.chain
    _fill_to_a_page_cap(state)
    with pytest.raises(KrillError, match=r"cannot write the verifier state .*v\.sqlite: database or disk is full"):
        verifier.step()
    assert chain.sent == 1 and state.decision(7).status == PENDING
    state._db.execute("PRAGMA max_page_count = 1000000")  # room again
    restarted = VerifierLoop(chain, FakeStore(), verifier.spec, state, verifier.who,
                             LoopSettings(payload_retry_s=0.0, max_backoff_s=0.0), echo=lambda line: None)
    restarted.step()
    decision = state.decision(7)
    assert (decision.status, decision.ok, decision.reason) == (ATTESTED, True, "found on chain (earlier run)")
    assert chain.sent == 1
