"""The version watcher's thread logic, against a run source whose chain answers are scripted."""

import threading
import time
from types import SimpleNamespace

import pytest

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
        return FakeState(self, v)


class FakeState:
    """A fetched version whose `masks()` records when it ran."""

    def __init__(self, source, version):
        self.source, self.version = source, version
        self.masks()  # `RunSource.version` derives them as part of the fetch

    def masks(self):
        self.source.masks_of = getattr(self.source, "masks_of", []) + [self.version]


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


def test_a_stale_reading_is_not_used(monkeypatch):
    from krill.worker import watcher as module

    now = [100.0]  # the watcher's clock, moved by the test alone (a paused test thread does not age the reading)
    monkeypatch.setattr(module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    source = ScriptedSource([7])
    watcher = VersionWatcher(source, interval_s=0.01, max_age_s=0.05)
    watcher.poll()
    now[0] += 0.05
    assert watcher.latest() == 7
    now[0] += 0.001
    assert watcher.latest() is None  # never started: nothing refreshed it


def test_a_reading_stays_fresh_while_the_step_that_refreshes_it_runs_on_a_slow_link(monkeypatch):
    """300 ms from the node a read takes 0.6 s, more than the reading's `max_age_s`: the reading went stale
    during every read, fetch and stake check, and the worker, polling for the next version, read the chain
    itself. It stays fresh while a step that began while it was fresh runs, for up to `STEP_GRACE_S`."""
    from krill.worker import watcher as module

    now = [100.0]  # the watcher's clock, moved by the test alone
    monkeypatch.setattr(module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    seen_during: list = []  # what a worker asking meanwhile gets, at the end of each read

    class SlowLink(ScriptedSource):
        def __init__(self, answers, read_s):
            super().__init__(answers)
            self.read_s = read_s

        def latest(self):
            now[0] += self.read_s
            seen_during.append(watcher.latest())
            return super().latest()

    source = SlowLink([7, 7, 8, 8], read_s=0.6)
    checked: list = []

    def stake_check(version):  # two more reads
        now[0] += 1.2
        checked.append((version, watcher.latest()))

    watcher = VersionWatcher(source, interval_s=0.025, max_age_s=0.05)
    watcher.poll()
    watcher.on_new_version = stake_check
    assert watcher.latest() == 7
    now[0] += 0.04
    watcher.poll()  # began while the reading was fresh
    assert seen_during[1] == 7
    now[0] += 0.04
    watcher.poll()  # a new version: its read, then its fetch and stake check
    assert seen_during[2] == 7
    assert checked == [(8, 8)]
    assert watcher.latest() is None  # the step is over: the reading it left is 1.2 s old
    source.read_s = module.STEP_GRACE_S + 0.01  # a read stuck longer (an outage): the worker reads itself
    watcher._seen = (8, now[0])
    watcher.poll()
    assert seen_during[3] is None
    now[0] += 1.0
    source.read_s = 0.6
    watcher.poll()  # began with the reading already stale: it does not vouch for it
    assert seen_during[4] is None


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

    class Sleeps(threading.Event):
        """The thread's sleep, recording each length it sleeps for."""

        def __init__(self):
            super().__init__()
            self.lengths: list[float] = []

        def wait(self, timeout=None):
            self.lengths.append(timeout)
            return super().wait(timeout)

    source = SwitchableSource(5)
    watcher = VersionWatcher(source, interval_s=10.0)  # the plain interval alone would take 10 s
    watcher._wake = sleeps = Sleeps()
    watcher.start()
    try:
        assert _wait_for(lambda: watcher.latest() == 5)
        published: list[float] = []
        threading.Timer(0.2, lambda: (published.append(time.monotonic()), source.answers.__setitem__(0, 6))).start()
        assert watcher.wait_newer(5, timeout_s=5.0) == 6  # at the plain interval: None after 5 s
        waited = time.monotonic() - published[0]
        assert waited < 40 * HURRY_INTERVAL_S, waited  # a fifth of the plain interval: a loaded machine's margin
        reads = source.reads
        assert watcher.wait_newer(6, timeout_s=1.5) is None  # nothing newer: back after the timeout
        assert source.reads - reads >= 3  # it read at the hurried pace meanwhile (none at the plain one)
        slept = len(sleeps.lengths)
        assert _wait_for(lambda: any(length > 5.0 for length in sleeps.lengths[slept:]))
        idle = source.reads
        time.sleep(0.3)
        assert source.reads == idle  # and back at the plain interval once nobody waits
        stopping = time.monotonic()
    finally:
        watcher.stop()
    assert time.monotonic() - stopping < 5.0  # stop() cut the 10 s sleep short


class SlowFetchSource(ScriptedSource):
    """`version()` blocks until the test releases it, so the test can look at the watcher mid-fetch."""

    def __init__(self, answers, fail_on=None):
        super().__init__(answers)
        self.release = threading.Event()
        self.fetching = threading.Event()  # set once the held fetch began
        self.fail_on = fail_on

    def version(self, v):
        if self.fetched:  # the first version is fetched at once
            self.fetching.set()
            self.release.wait(10.0)
        self.fetched.append(v)
        if v == self.fail_on:
            raise ConnectionError("store down")
        return FakeState(self, v)


def test_a_new_version_is_reported_only_once_its_shards_are_fetched():
    source = SlowFetchSource([3, 4])
    watcher = VersionWatcher(source, interval_s=0.01, max_age_s=5.0).start()
    try:
        assert _wait_for(lambda: source.fetched == [3])
        assert source.fetching.wait(5.0)  # version 4 is read and being fetched
        assert watcher.latest() == 3  # the worker keeps working at the version it holds, and the reading is fresh
        source.release.set()
        assert _wait_for(lambda: watcher.latest() == 4)
    finally:
        watcher.stop()


def test_a_failed_fetch_is_not_announced_and_the_worker_keeps_the_version_it_holds():
    source = SlowFetchSource([3, 4], fail_on=4)
    source.release.set()
    watcher = VersionWatcher(source, interval_s=0.01, max_age_s=5.0)
    watcher.poll()
    with pytest.raises(ConnectionError, match="store down"):
        watcher.poll()
    assert watcher.latest() == 3  # not 4: the worker would go and fetch it at once, into the same failure
    source.fail_on = None
    watcher.poll()  # fetched again at the next read, and announced once it is here
    assert watcher.latest() == 4 and source.fetched == [3, 4, 4]


def test_a_version_held_more_than_s_max_behind_the_newest_is_not_vouched_for():
    """A worker resumed from a suspension finds the run S_max + 1 versions on: what it made at the version it
    holds could only be refused as stale, so while the newest is fetched (or fails to be) there is no
    reading, and the worker reads the chain and fetches the newest itself."""
    source = SlowFetchSource([1, 4], fail_on=4)
    watcher = VersionWatcher(source, interval_s=0.01, max_age_s=5.0, max_staleness=2).start()
    try:
        assert _wait_for(lambda: source.fetched == [1])
        assert source.fetching.wait(5.0)  # version 4 is read and being fetched
        assert watcher.latest() is None
        source.release.set()
        assert _wait_for(lambda: source.fetched.count(4) >= 2)  # fetched again after the failure
        assert watcher.latest() is None
    finally:
        watcher.stop()
    near = SlowFetchSource([2, 4])  # S_max behind: still committable, so kept while the newest is fetched
    watcher = VersionWatcher(near, interval_s=0.01, max_age_s=5.0, max_staleness=2).start()
    try:
        assert near.fetching.wait(5.0)
        assert watcher.latest() == 2
        near.release.set()
        assert _wait_for(lambda: watcher.latest() == 4)
    finally:
        watcher.stop()


def test_a_version_that_does_not_decode_is_never_announced():
    from krill.worker.errors import BrokenVersionError

    class BrokenSource(ScriptedSource):
        def version(self, v):
            if v == 5:
                raise BrokenVersionError("version 5 is broken (ModelError: shard 1: not a valid safetensors file)")
            return super().version(v)

    source = BrokenSource([4, 5, 5, 6])
    watcher = VersionWatcher(source, interval_s=0.01, max_age_s=5.0)
    watcher.poll()
    for _ in range(2):
        with pytest.raises(BrokenVersionError):
            watcher.poll()
        assert watcher.latest() == 4  # the worker keeps working at the last version that loaded
    watcher.poll()
    assert watcher.latest() == 6 and source.fetched == [4, 6]


def test_run_source_serves_cached_versions_while_another_is_fetched(monkeypatch):
    """A look-up of a held version does not wait for a fetch in flight; a second caller of the version being
    fetched waits for that fetch instead of fetching it again; a failed fetch is retried by the next caller."""
    import krill.protocol.state as state_module
    from worker.source import RunSource

    gate, calls = threading.Event(), []

    class Loaded:
        def __init__(self, v):
            self.v = v

        def all_tensors(self):
            return {}

        def masks(self):
            return {}

    def load(chain, store, spec, v):
        calls.append(v)
        if v == 2 and calls.count(2) == 1:
            raise ConnectionError("store down")
        if v == 1:
            gate.wait(5.0)
        return Loaded(v)

    monkeypatch.setattr(state_module, "load_chain_version", load)
    source = RunSource(chain=None, store=None, spec=None)
    assert source.version(0).v == 0
    results = []
    fetchers = [threading.Thread(target=lambda: results.append(source.version(1).v)) for _ in range(2)]
    for t in fetchers:
        t.start()
    assert _wait_for(lambda: calls == [0, 1])
    started = time.monotonic()
    assert source.version(0).v == 0 and time.monotonic() - started < 2.5  # not behind the fetch of 1 (gated)
    gate.set()
    for t in fetchers:
        t.join(5.0)
    assert results == [1, 1] and calls == [0, 1]  # fetched once for both callers
    with pytest.raises(ConnectionError, match="store down"):
        source.version(2)
    assert source.version(2).v == 2 and calls == [0, 1, 2, 2]


def test_a_new_version_is_announced_with_its_masks_then_the_stake_is_checked():
    from krill.worker.errors import JailedError

    source = ScriptedSource([5])
    seen_at_check: list = []

    def check(version):
        seen_at_check.append((version, watcher.latest(), list(source.masks_of)))
        raise JailedError("worker 0xabc is jailed")

    watcher = VersionWatcher(source, interval_s=0.01, max_age_s=60.0, on_new_version=check)
    announced: list = []
    original = watcher._notify
    watcher._notify = lambda: (announced.append((watcher.latest(), list(getattr(source, "masks_of", [])))),
                               original())
    watcher.poll()
    assert announced == [(5, [5])]  # waiters woke with version 5 and its masks
    assert source.masks_of == [5] and seen_at_check == [(5, 5, [5])]
    assert isinstance(watcher.problem, JailedError) and "stake_check" in watcher.phases
    watcher.poll()  # the same version: no second fetch, masks or check
    assert source.fetched == [5] and len(seen_at_check) == 1


def test_an_unreachable_chain_during_the_stake_check_is_only_an_error():
    source = ScriptedSource([2])

    def check(version):
        raise ConnectionError("chain down")

    watcher = VersionWatcher(source, interval_s=0.01, max_age_s=60.0, on_new_version=check).start()
    try:
        assert _wait_for(lambda: watcher.errors >= 1)
        assert watcher.problem is None and watcher.latest() == 2
    finally:
        watcher.stop()


class ScriptedPublications:
    """A `HeadWaiter` subscribed to publications: `announce()` wakes the waiting thread, `drop()`
    ends the connection and opens another (as a reconnect after a drop would)."""

    def __init__(self):
        self.logs = {"topics": ["VersionPublished"]}
        self.connections = 1
        self._news = threading.Event()

    def subscribed(self):
        return True

    def wait(self, timeout_s, stop=None):
        woke = self._news.wait(timeout_s)
        self._news.clear()
        return woke

    def announce(self):
        self._news.set()

    def drop(self):
        self.connections += 1

    def close(self):
        pass


def test_subscribed_to_publications_the_watcher_reads_only_when_one_is_announced(monkeypatch):
    """No read while the connection announces no publication (the reading stays fresh all the
    same), one read per announcement, and one after a reconnection or `QUIET_READ_S`."""
    from krill.worker import watcher as module

    monkeypatch.setattr(module, "QUIET_READ_S", 600.0)  # none until the test turns it down (a paused test is no gap)
    source, heads = SwitchableSource(5), ScriptedPublications()
    watcher = VersionWatcher(source, interval_s=0.01, heads=heads).start()
    try:
        assert _wait_for(lambda: watcher.latest() == 5)
        reads = source.reads
        time.sleep(0.2)  # twenty intervals, no publication
        assert _wait_for(lambda: watcher.latest() == 5)  # fresh (max age 0.02 s) ...
        assert source.reads == reads  # ... without a read
        source.answers[0] = 6
        heads.announce()
        assert _wait_for(lambda: watcher.latest() == 6) and source.fetched == [5, 6]
        assert source.reads == reads + 1
        heads.drop()
        assert _wait_for(lambda: source.reads == reads + 2)  # a new connection: read again
        time.sleep(0.2)
        assert source.reads == reads + 2  # once
        monkeypatch.setattr(module, "QUIET_READ_S", 0.5)
        assert _wait_for(lambda: source.reads >= reads + 3)  # and after QUIET_READ_S anyway
    finally:
        watcher.stop()
