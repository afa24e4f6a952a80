"""The coordinator's fetch threads: one job per worker lane at a time, a bounded number of threads,
results and errors handed to the taker, and no threads left behind when idle."""

from __future__ import annotations

import threading
import time

import pytest

from krill.store import fetcher as fetcher_module
from krill.store.fetcher import Fetcher


def _until(condition, timeout_s=10.0) -> bool:
    """Whether `condition()` became true within `timeout_s` (a fetch thread may start its job late)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _blocking(release: threading.Event, started: list, name: str):
    def job():
        started.append(name)
        if not release.wait(10):
            raise TimeoutError(f"{name} was never released")
        return name
    return job


def test_a_lane_runs_one_job_at_a_time_while_other_lanes_proceed():
    fetcher, release, started = Fetcher(threads=4), threading.Event(), []
    fetcher.submit("junk", 1, _blocking(release, started, "junk-1"))
    fetcher.submit("junk", 2, _blocking(release, started, "junk-2"))
    fetcher.submit("honest", 3, lambda: "honest")
    fetcher.wait([3], 5)
    assert fetcher.take(3).result() == "honest"
    assert _until(lambda: started)  # the lane's first job runs (its thread may start it late)
    time.sleep(0.2)
    assert started == ["junk-1"]  # the second job of the lane waits for the first
    assert fetcher.take(1) is None and fetcher.in_flight() == 2
    release.set()
    fetcher.wait([1, 2], 5)
    assert (fetcher.take(1).result(), fetcher.take(2).result()) == ("junk-1", "junk-2")
    assert fetcher.in_flight() == 0


def test_no_more_threads_run_than_configured():
    fetcher, release, started = Fetcher(threads=2), threading.Event(), []
    for lane in range(3):
        fetcher.submit(f"w{lane}", lane, _blocking(release, started, f"w{lane}"))
    assert _until(lambda: len(started) >= 2)
    fetcher.wait([0, 1, 2], 0.3)
    assert sorted(started) == ["w0", "w1"]  # the third lane waits for a free thread
    release.set()
    fetcher.wait([0, 1, 2], 5)
    assert sorted(fetcher.take(k).result() for k in range(3)) == ["w0", "w1", "w2"]


def test_wait_gives_up_after_its_budget_and_the_job_is_taken_later():
    fetcher, release, started = Fetcher(threads=1), threading.Event(), []
    fetcher.submit("w", 7, _blocking(release, started, "slow"))
    began = time.monotonic()
    fetcher.wait([7], 0.2)
    assert time.monotonic() - began < 5 and fetcher.take(7) is None
    release.set()
    fetcher.wait([7], 5)
    assert fetcher.take(7).result() == "slow"


def test_a_key_is_not_queued_twice_until_it_is_taken():
    fetcher, calls = Fetcher(threads=2), []
    fetcher.submit("w", 1, lambda: calls.append("first") or "first")
    fetcher.wait([1], 5)
    fetcher.submit("w", 1, lambda: calls.append("second") or "second")  # done, not taken: ignored
    assert fetcher.take(1).result() == "first" and calls == ["first"]
    fetcher.submit("w", 1, lambda: calls.append("again") or "again")
    fetcher.wait([1], 5)
    assert fetcher.take(1).result() == "again"


def test_the_jobs_exception_is_raised_to_the_taker():
    from krill.errors import ContentNotFoundError

    def missing():
        raise ContentNotFoundError("nobody has bafy…")

    fetcher = Fetcher(threads=1)
    fetcher.submit("w", 1, missing)
    fetcher.wait([1], 5)
    with pytest.raises(ContentNotFoundError, match="nobody has"):
        fetcher.take(1).result()


def test_lanes_take_turns_for_free_threads():
    fetcher, release, order = Fetcher(threads=1), threading.Event(), []
    fetcher.submit("first", 0, lambda: release.wait(10))
    for key, lane in enumerate(["a", "a", "a", "b", "b", "c"], start=1):
        fetcher.submit(lane, key, lambda lane=lane: order.append(lane))
    release.set()
    fetcher.wait(range(7), 5)
    assert order == ["a", "b", "c", "a", "b", "a"]


def test_idle_threads_end(monkeypatch):
    monkeypatch.setattr(fetcher_module, "IDLE_S", 0.05)
    fetcher = Fetcher(threads=3)
    for lane in range(3):
        fetcher.submit(f"w{lane}", lane, lambda: None)
    fetcher.wait(range(3), 5)
    deadline = time.monotonic() + 5
    while any(fetcher._alive.values()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fetcher._alive == {False: 0, True: 0}
    fetcher.submit("w", 9, lambda: "after")  # a new job starts a thread again
    fetcher.wait([9], 5)
    assert fetcher.take(9).result() == "after"


def test_threads_must_be_positive():
    with pytest.raises(ValueError, match="threads must be at least 1, got 0"):
        Fetcher(threads=0)
    with pytest.raises(ValueError, match="priority_threads must be at least 1, got 0"):
        Fetcher(priority_threads=0)


def test_forget_drops_a_queued_job_and_discards_a_running_ones_result():
    fetcher, release, started = Fetcher(threads=2), threading.Event(), []
    fetcher.submit("lane", 1, _blocking(release, started, "running"))
    fetcher.submit("lane", 2, _blocking(release, started, "queued"))
    fetcher.submit("other", 3, lambda: "done")
    fetcher.wait([3], 5)
    deadline = time.monotonic() + 5
    while not started and time.monotonic() < deadline:
        time.sleep(0.01)
    fetcher.forget_where(lambda key: key in (1, 2, 3))
    assert 2 not in fetcher and 3 not in fetcher and fetcher.take(3) is None
    assert 1 in fetcher  # still running: not queued again meanwhile
    release.set()
    deadline = time.monotonic() + 5
    while 1 in fetcher and time.monotonic() < deadline:
        time.sleep(0.01)
    assert 1 not in fetcher and fetcher.take(1) is None and fetcher.in_flight() == 0
    assert started == ["running"]  # the forgotten queued job never ran
    assert fetcher._done == {} and fetcher._abandoned == set()


def test_a_result_nobody_takes_is_dropped_after_keep_s(monkeypatch):
    fetcher = Fetcher(threads=1)
    fetcher.submit("lane", "old", lambda: b"x" * 1000)
    fetcher.wait(["old"], 5)
    monkeypatch.setattr(fetcher_module, "KEEP_S", 0.0)
    fetcher.submit("lane", "new", lambda: "new")
    fetcher.wait(["new"], 5)
    assert "old" not in fetcher and fetcher.take("old") is None


def test_a_confirmation_fetch_starts_at_once_while_every_ordinary_thread_is_held():
    """A cheater with as many staked accounts as the pool has threads, each with a fetch the store holds until its
    timeout, held every thread, and the confirmation fetch that would slash it waited up to that timeout again
    for a thread: past the one timeout `krill.coordinator.margin` counts. Confirmation lanes have threads of their
    own."""
    fetcher, release, started = Fetcher(), threading.Event(), []  # the coordinator's pool
    try:
        for account in range(fetcher.threads):
            fetcher.submit(f"0xcheat{account}", account, _blocking(release, started, f"junk-{account}"))
        fetcher.submit("confirm:0xcheat0", "confirm", lambda: "confirmed")  # the coordinator's lane
        fetcher.wait(["confirm"], 5)
        done = fetcher.take("confirm")
        assert done is not None and done.result() == "confirmed"
        assert fetcher.in_flight() == fetcher.threads  # the junk is still held
    finally:
        release.set()


def test_priority_lanes_have_their_own_bounded_threads_and_never_take_the_others():
    from krill.store.fetcher import PRIORITY_PREFIX

    fetcher, release, started = Fetcher(threads=1, priority_threads=2), threading.Event(), []
    try:
        for n in range(3):
            fetcher.submit(f"{PRIORITY_PREFIX}w{n}", ("confirm", n), _blocking(release, started, f"confirm-{n}"))
        fetcher.submit("w0", "ingest", lambda: "ingested")
        fetcher.wait(["ingest"], 5)
        assert fetcher.take("ingest").result() == "ingested"  # the ordinary thread is not taken by a confirmation
        assert _until(lambda: len(started) >= 2)
        fetcher.wait([("confirm", 2)], 0.3)
        assert sorted(started) == ["confirm-0", "confirm-1"]  # the third waits for a priority thread
        assert fetcher._alive == {False: 1, True: 2}
    finally:
        release.set()
    fetcher.wait([("confirm", n) for n in range(3)], 5)
    assert [fetcher.take(("confirm", n)).result() for n in range(3)] == ["confirm-0", "confirm-1", "confirm-2"]
