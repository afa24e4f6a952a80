"""The version watcher's thread logic, against a run source whose chain answers are scripted."""

import threading
import time

from krill.worker.watcher import VersionWatcher


class ScriptedSource:
    """`latest()` answers from a list (an exception instance is raised); `version()` records fetches."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.fetched: list[int] = []
        self.lock = threading.Lock()

    def latest(self):
        with self.lock:
            answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def version(self, v):
        self.fetched.append(v)


def _wait_for(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return False


def test_the_watcher_reports_the_newest_version_and_fetches_each_new_one_once():
    source = ScriptedSource([3, 3, 4, 4, 4])
    watcher = VersionWatcher(source, interval_s=0.01).start()
    try:
        assert _wait_for(lambda: watcher.latest() == 4)
        assert source.fetched == [3, 4]
        assert watcher.phases["read_ahead"] > 0
    finally:
        watcher.stop()


def test_a_stale_reading_is_not_used():
    source = ScriptedSource([7])
    watcher = VersionWatcher(source, interval_s=0.01, max_age_s=0.05)
    watcher.poll()
    assert watcher.latest() == 7
    time.sleep(0.08)
    assert watcher.latest() is None  # never started: nothing refreshed it


def test_errors_leave_the_reading_to_go_stale_and_the_thread_retries():
    source = ScriptedSource([ConnectionError("chain down")] * 5 + [9])
    watcher = VersionWatcher(source, interval_s=0.01).start()
    try:
        assert _wait_for(lambda: watcher.latest() == 9)
        assert watcher.errors >= 5
    finally:
        watcher.stop()
    assert watcher._thread is None


class SwitchableSource(ScriptedSource):
    """`latest()` answers `value` (set by the test) and counts its reads."""

    def __init__(self, value):
        super().__init__([value])
        self.reads = 0

    def latest(self):
        self.reads += 1
        return self.answers[0]


def test_a_waiting_worker_is_woken_by_the_next_version_read_at_the_hurried_interval():
    from krill.worker.watcher import HURRY_INTERVAL_S

    source = SwitchableSource(5)
    watcher = VersionWatcher(source, interval_s=10.0).start()  # the plain interval alone would take 10 s
    try:
        assert _wait_for(lambda: watcher.latest() == 5)
        threading.Timer(0.2, lambda: source.answers.__setitem__(0, 6)).start()
        started = time.monotonic()
        assert watcher.wait_newer(5, timeout_s=5.0) == 6
        waited = time.monotonic() - started
        assert 0.2 <= waited < 0.2 + 10 * HURRY_INTERVAL_S, waited
        reads = source.reads
        assert watcher.wait_newer(6, timeout_s=0.3) is None  # nothing newer: back after the timeout
        assert source.reads - reads >= 3  # it read at the hurried pace meanwhile
        time.sleep(0.3)
        idle = source.reads
        time.sleep(0.3)
        assert source.reads == idle  # and back at the plain interval once nobody waits
        stopping = time.monotonic()
    finally:
        watcher.stop()
    assert time.monotonic() - stopping < 1.0  # stop() cut the 10 s sleep short
