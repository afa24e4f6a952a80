"""The verifier's timing against block deadlines, on a fake clock: the chain's head follows the clock at a
fixed block time, and the loop's `run` sleeps on the same clock, so every schedule is exact and a test
of minutes of chain time takes milliseconds. Commit 7 (block 100) is selected; its payload is withheld
(every replay raises `PayloadUnavailable`), or its fetch never ends (`PayloadStillFetching`). The
attestation is refused, as the contract refuses it, once it would be mined past the window."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest

import krill.store.fetcher as fetcher_module
import krill.verifier.loop as loop_module
from krill.chain import errors as E
from krill.errors import ChainUnavailableError
from krill.store.cid import digest_to_cid
from krill.verifier import select
from krill.verifier.attest import Who
from krill.verifier.loop import HeadPace, LoopSettings, VerifierLoop
from krill.verifier.replay import PayloadStillFetching, PayloadUnavailable
from krill.verifier.state import ATTESTED, MISSED, PENDING, Job, VerifierState

RUN = b"\x01" * 32
CONTRACT = "0x" + "cc" * 20
ME = "0x" + "dd" * 20
WORKER = "0x" + "ab" * 20
COMMIT_BLOCK = 100


class Clock:
    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += max(0.0, seconds)


class TimedChain:
    """Block COMMIT_BLOCK + 1 at time 0, then one block every `block_s` seconds (or, with `block_s` None,
    blocks only as the test mines them), none during `stall` (start, end) in seconds; unreachable during
    `outage` (start, end)."""

    address = CONTRACT
    stall = (0.0, 0.0)

    def __init__(self, clock: Clock, window: int, block_s: float | None, outage=None):
        self.clock, self.window, self.block_s, self.outage = clock, window, block_s, outage
        self.mined = 0
        self.attested: list[int] = []  # the blocks the attestations were mined in

    def block_number(self) -> int:
        if self.outage is not None and self.outage[0] <= self.clock.now < self.outage[1]:
            raise ChainUnavailableError("cannot reach the node at http://127.0.0.1:8545 (connection refused)")
        start, end = self.stall
        ticking = min(self.clock.now, start) + max(0.0, self.clock.now - end) if end > start else self.clock.now
        ticks = 0 if self.block_s is None else int(ticking / self.block_s)
        return COMMIT_BLOCK + 1 + ticks + self.mined

    def block_hash(self, number):
        return b"\x09" * 32

    def randomness_of(self, commit_id):
        return b"\x09" * 32

    def is_check_selected(self, commit_id, key):
        return True

    def attestation_of(self, commit_id, verifier):
        return SimpleNamespace(exists=bool(self.attested), ok=False)

    def attest(self, commit_id, ok, digest):
        block = self.block_number() + 1  # the transaction is mined in the next block
        if block > select.last_block(COMMIT_BLOCK, self.window):
            raise E.AttestationWindowClosed(f"AttestationWindowClosed({commit_id})", (commit_id, block, block))
        self.mined += 1
        self.attested.append(block)
        return SimpleNamespace(transaction_hash="0x" + "ee" * 32)

    def run_of(self, run_id):
        return SimpleNamespace(created_block=0)

    def event_stream(self, from_block, confirmations):
        return SimpleNamespace(poll=lambda kinds: [], next_block=from_block)


class Store:
    def __init__(self):
        self.on_upload = lambda: None

    def put_block(self, data, pin=False):
        self.on_upload()
        return digest_to_cid(hashlib.sha256(data).digest())


class WithheldReplayer:
    fault: type[PayloadUnavailable] = PayloadUnavailable
    replays: list[float] = []  # when (on the fake clock)
    waits = False  # a fetch that never ends holds the replay for the wait it is allowed (`PASS_WAIT_S` by default)
    takes_s = 0.0  # the first replay's own time (loading the model)

    def __init__(self, *args):
        pass

    def forget_fetches(self, commit_id):
        pass

    def replay(self, job, randomness, shard=None, wait_s=None):
        WithheldReplayer.replays.append(loop_module.time.monotonic())
        loop_module.time.sleep(self.takes_s if len(WithheldReplayer.replays) == 1 else 0.0)
        if self.waits:
            loop_module.time.sleep(fetcher_module.PASS_WAIT_S if wait_s is None else wait_s)
        raise self.fault(f"header {digest_to_cid(job.header_digest)} not found")


def _verifier(tmp_path, monkeypatch, window: int, block_s: float | None, outage=None,
              fault: type[PayloadUnavailable] = PayloadUnavailable, settings: LoopSettings | None = None):
    """(loop, chain, clock) with the default settings of `krill verifier run` (retries from 0.5 s, doubling up
    to 30 s)."""
    clock = Clock()
    monkeypatch.setattr(loop_module, "time", SimpleNamespace(monotonic=clock.monotonic, perf_counter=clock.monotonic,
                                                             sleep=clock.sleep))
    monkeypatch.setattr(loop_module, "Replayer", WithheldReplayer)
    monkeypatch.setattr(WithheldReplayer, "fault", fault)
    monkeypatch.setattr(WithheldReplayer, "replays", [])
    monkeypatch.setattr(WithheldReplayer, "waits", False)
    monkeypatch.setattr(WithheldReplayer, "takes_s", 0.0)
    state = VerifierState(tmp_path / "v.sqlite", contract=CONTRACT, run_id=RUN, verifier=ME)
    state.add_jobs([Job(7, WORKER, 3, 0, b"\x05" * 32, COMMIT_BLOCK)], next_block=COMMIT_BLOCK + 1)
    spec = SimpleNamespace(run_id=RUN, chain=SimpleNamespace(challenge_window_blocks=window,
                                                             check_probability_ppm=1_000_000))
    chain = TimedChain(clock, window, block_s, outage)
    loop = VerifierLoop(chain, Store(), spec, state, Who(31337, CONTRACT, ME, b"\x07" * 32, "hf"),
                        settings or LoopSettings(), echo=lambda line: None)
    return loop, chain, clock


def _run_until_decided(loop, clock, limit_s: float) -> None:
    loop.run(should_stop=lambda: loop.state.decision(7).status != PENDING or clock.now > limit_s)


@pytest.mark.parametrize(("block_s", "window"), [(1.0, 30), (2.0, 8), (2.0, 24), (0.25, 60), (0.5, 120)])
def test_a_withheld_payload_on_a_fast_chain_is_attested_unavailable_not_slept_past(tmp_path, monkeypatch,
                                                                                   block_s, window):
    """The payload retries doubled up to 30 s whatever the block time: at 1 s a block and a window of 30, the
    retries at 17.5 s and 33.5 s straddled the whole span where the payload is attested unavailable
    (blocks 123 to 129), and the withheld payload ended `missed`; each wait is now capped by the head's
    measured pace."""
    loop, chain, clock = _verifier(tmp_path, monkeypatch, window, block_s)
    _run_until_decided(loop, clock, limit_s=3 * window * block_s)
    decision = loop.state.decision(7)
    assert (decision.status, decision.ok, decision.reason) == (ATTESTED, False, "unavailable"), decision
    (block,) = chain.attested
    assert select.unavailable_after(COMMIT_BLOCK, window) < block <= select.last_block(COMMIT_BLOCK, window)


def test_the_back_off_after_an_outage_wakes_before_the_window_closes(tmp_path, monkeypatch):
    """The chain unreachable from 3 s to 20 s (1 s blocks, a window of 30): the pass-level back-off doubled
    0.5, 1, 2, 4, 8, 16 s and tried next at 34.5 s, after the window; it is now capped by the nearest
    pending window and the verifier attests the withheld payload once the chain is back."""
    loop, chain, clock = _verifier(tmp_path, monkeypatch, 30, 1.0, outage=(3.0, 20.0))
    _run_until_decided(loop, clock, limit_s=90.0)
    decision = loop.state.decision(7)
    assert (decision.status, decision.reason) == (ATTESTED, "unavailable"), decision
    assert chain.attested[0] <= select.last_block(COMMIT_BLOCK, 30)


def test_an_outage_after_a_head_that_jumped_is_still_capped_by_the_window(tmp_path, monkeypatch):
    """The first replay takes 3 s (loading the model): the head read after it is 3 blocks on, one move whose
    fast estimate is 0 s a block. Twice that (the slow estimate) put every window behind, so the back-off
    after the outage (3.5 s to 20 s) went uncapped, slept 0.5 to 16 s, tried next at 35 s (block 136) and the
    withheld payload ended `missed`; the slow estimate is now at least what the reads allow (1.5 s here)."""
    loop, chain, clock = _verifier(tmp_path, monkeypatch, 30, 1.0, outage=(3.5, 20.0))
    WithheldReplayer.takes_s = 3.0
    _run_until_decided(loop, clock, limit_s=90.0)
    decision = loop.state.decision(7)
    assert (decision.status, decision.reason) == (ATTESTED, "unavailable"), decision
    assert max(clock.sleeps) <= 3.0  # 16 s before


@pytest.mark.parametrize(("window", "stall_s"), [(40, 120.0), (40, 300.0)])
def test_a_stall_of_the_chain_does_not_make_the_verifier_sleep_past_the_window(tmp_path, monkeypatch, window,
                                                                               stall_s):
    """1 s blocks stop for minutes after block 110 (a sequencer outage), then go on. The stall weighed the
    32-move mean the pace was: after 120 s the estimate read 6.7 s a block, the 30 s back-off went uncapped,
    the verifier read the head next at block 146, past the window of 40, and the withheld payload ended
    `missed`; the estimate is now at most the median of the moves' own block times."""
    monkeypatch.setattr(TimedChain, "stall", (10.0, 10.0 + stall_s))
    loop, chain, clock = _verifier(tmp_path, monkeypatch, window, 1.0)
    _run_until_decided(loop, clock, limit_s=stall_s + 3 * window)
    decision = loop.state.decision(7)
    assert (decision.status, decision.ok, decision.reason) == (ATTESTED, False, "unavailable"), decision
    assert select.unavailable_after(COMMIT_BLOCK, window) < chain.attested[0] <= select.last_block(COMMIT_BLOCK,
                                                                                                   window)


def test_a_replay_waiting_on_a_fetch_is_capped_by_the_block_deadline(tmp_path, monkeypatch):
    """At 0.5 s a block a replay waited `PASS_WAIT_S` (2 s, four blocks) for a fetch that never ends: on a window
    of 8 the second replay began at block 106 and gave up at 110, past the window (`missed`). The wait is now
    capped like the others, by half the time to the block the commit waits for."""
    window = 8
    loop, chain, clock = _verifier(tmp_path, monkeypatch, window, 0.5, fault=PayloadStillFetching)
    WithheldReplayer.waits = True
    _run_until_decided(loop, clock, limit_s=3 * window * 0.5)
    decision = loop.state.decision(7)
    assert (decision.status, decision.ok, decision.reason) == (ATTESTED, False, "unavailable"), decision
    assert chain.attested[0] <= select.last_block(COMMIT_BLOCK, window)


def test_a_slow_chain_is_not_polled_faster_near_the_deadline(tmp_path, monkeypatch):
    """At 12 s a block (a window of 40: eight minutes), the capped waits keep to the back-off's order of
    retries: the payload is retried a couple of dozen times in the window, never many times a block."""
    loop, chain, clock = _verifier(tmp_path, monkeypatch, 40, 12.0)
    _run_until_decided(loop, clock, limit_s=3 * 40 * 12.0)
    assert loop.state.decision(7).status == ATTESTED
    times = WithheldReplayer.replays
    assert len(times) <= 30
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    assert min(gaps[-5:]) >= 12.0 / 4  # near the deadline: every quarter of a block at most, not every 0.5 s


def test_a_chain_that_stands_still_is_not_polled_faster_than_the_back_off(tmp_path, monkeypatch):
    """A devnet makes blocks only with transactions: after a burst of blocks the head stands still and the
    pace stretches with it, so the waits grow as the back-off does instead of keeping to the floor."""
    loop, chain, clock = _verifier(tmp_path, monkeypatch, 40, None)
    for _ in range(5):  # a burst: five blocks 0.1 s apart, each seen by a step
        loop.step()
        chain.mined += 1
        clock.now += 0.1
        loop._retry_at.clear()
    _run_until_decided(loop, clock, limit_s=600.0)
    assert loop.state.decision(7).status == PENDING  # the head never reaches the window's end
    assert len(WithheldReplayer.replays) <= 5 + 30  # the burst, then about one retry per 30 s at most


def _still_fetching_with_one_block_of_delay(tmp_path, monkeypatch, window: int):
    """Step the verifier at every block of the window (the head moves only as the test mines it) while the
    payload's fetch never ends, the evidence upload of the attestation taking a block's time (another
    transaction is mined meanwhile)."""
    loop, chain, clock = _verifier(tmp_path, monkeypatch, window, None, fault=PayloadStillFetching,
                                   settings=LoopSettings(payload_retry_s=0.0, max_backoff_s=0.0))

    def a_block_passes():
        chain.mined += 1

    loop.store.on_upload = a_block_passes
    while loop.state.decision(7).status == PENDING and chain.block_number() <= select.last_block(COMMIT_BLOCK,
                                                                                                  window):
        loop.step()
        chain.mined += 1
    return loop.state.decision(7), chain


@pytest.mark.parametrize("window", [4, 8, 12, 15])
def test_a_payload_still_fetching_is_attested_unavailable_with_a_block_to_spare(tmp_path, monkeypatch, window):
    """On a window under 16 blocks `still_fetching_until` was the window's last block but one, so the
    attestation had to be sent in the very block before the close: one block of delay (here the evidence
    upload) put it past the window and a payload nobody serves went unattested; it is now decided two
    blocks before the close."""
    decision, chain = _still_fetching_with_one_block_of_delay(tmp_path, monkeypatch, window)
    assert decision.status != MISSED, decision
    assert (decision.status, decision.ok, decision.reason) == (ATTESTED, False, "unavailable")
    assert chain.attested == [select.last_block(COMMIT_BLOCK, window)]
    assert select.last_block(COMMIT_BLOCK, window) - select.still_fetching_until(COMMIT_BLOCK, window) >= 2


@pytest.mark.parametrize("window", [16, 40, 2000])
def test_larger_windows_keep_half_of_the_last_quarter_for_a_slow_fetch(window):
    margin = max(2, window // 4)
    assert select.still_fetching_until(COMMIT_BLOCK, window) == select.last_block(COMMIT_BLOCK, window) - margin // 2


def test_the_pace_errs_fast_and_stretches_while_the_head_stands_still():
    pace = HeadPace()
    assert pace.seconds_until(110, 0.0) is None  # not seen to move yet
    pace.observe(100, 0.0)
    pace.observe(100, 0.5)
    pace.observe(101, 1.5)  # block 101 appeared between 0.5 and 1.5 s: taken as 0.5 s after block 100
    assert pace.block_seconds() == pytest.approx(0.5)
    assert pace.seconds_until(111, 1.5) == pytest.approx(0.5 + 10 * 0.5 - 1.5)
    pace.observe(101, 9.5)  # standing still for 8 s
    assert pace.block_seconds() == pytest.approx(8.0)


def test_one_long_move_does_not_set_the_pace_once_three_moves_are_seen():
    pace = HeadPace()
    for second in range(6):  # a block a second, read every second
        pace.observe(101 + second, float(second))
    pace.observe(106, 120.0)  # no block for two minutes
    pace.observe(107, 121.0)
    assert pace.block_seconds() == pytest.approx(1.0)  # was the span's mean: 120 s / 6 blocks = 20 s


def test_the_slow_estimate_is_what_the_reads_allow_when_the_fast_one_is_0():
    pace = HeadPace()
    pace.observe(101, 0.0)
    pace.observe(104, 3.0)  # three blocks between two reads: 102 and 103 appeared after 0 s and by 3 s
    assert pace.block_seconds() == 0.0
    assert pace.seconds_until(129, 3.0, slow=True) == pytest.approx(25 * 1.5)  # was 0: "already passed"
    single = HeadPace()
    single.observe(101, 0.0)
    single.observe(102, 1.0)  # one block, no read between: no bound either way
    assert single.seconds_until(129, 1.0, slow=True) is None
