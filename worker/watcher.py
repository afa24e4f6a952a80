"""A background thread that keeps the run's newest version at hand and fetches its shards ahead.

Design decisions:
- A worker needs the newest published version twice per contribution: before sampling (its
  behaviour version) and after (its learner version). Read from the chain on the critical path,
  those reads were 12% of the worker's busy time, and fetching a new version's shards when the
  learner first needed them another 8%. The watcher reads `latestVersion` every `interval_s` in
  its own thread and, when the version is new, fetches and verifies its shards into the
  `RunSource` cache (which also derives the version's masks), so the learner finds them there.
- A value is used only while it is fresh (`max_age_s`, twice the interval by default): a worker
  whose watcher stalls (chain unreachable, thread stopped) reads the chain itself, through its
  `Backoff`, which reports the outage; the watcher only counts its errors and retries.
- A version is announced only once its fetch succeeded. A failed fetch leaves the last fetched
  version the reading (fresh as of the read that found the new one), so the worker keeps working
  at it: a version that does not decode is never announced (`RunSource` remembers it and refuses
  it at once), one the store cannot deliver yet is fetched again at the next read. Announcing the
  new version anyway sent the worker to fetch it itself at once, into the same failure.
- Except where the version read is more than S_max (`max_staleness`) past the one held: nothing
  made at the held one can be committed any more, so there is no reading (`latest()` is None) and
  the worker reads the chain and fetches the new version itself, through its `Backoff`. A worker
  suspended for a while (a laptop's lid closed) resumed to a chain S_max versions on; vouched for
  until the fetch of the newest ended, the held version had it sample and learn there, and while
  the store did not deliver the newest yet every contribution was uploaded and refused by the
  contract as too stale, about 30 a second.
- Freshness costs staleness: a contribution may start from, or learn at, a version up to
  `max_age_s` old, so now and then one version behind the newest; the coordinator's staleness
  weights already price that, as they price a worker's network latency.
- With `heads` (a `krill.chain.heads.HeadWaiter` subscribed to the node's new blocks) the thread
  reads when a block is announced, and at the latest every `interval_s`: a version is published
  in a block, so it is seen as soon as it exists, and no read is spent on an unchanged chain.
- With `heads` subscribed to the run's publications (`krill.chain.heads.publications_of`, what
  the worker uses) the thread reads only when a publication is announced: on a connection that
  announced none since the last read, the chain cannot have a newer version, so the reading stays
  fresh without a read. It still reads every `QUIET_READ_S`, and after any reconnection (a dropped
  connection may have missed an announcement). On the demo this took the watchers' reads from
  about ten per version (one per block) to one.
- Without one (a node with no WebSocket): a worker that has its share of the newest version waits
  for the next one (`wait_newer`); while it waits, the thread reads every `HURRY_INTERVAL_S`
  (50 ms) instead of every `interval_s`, and wakes the worker as soon as it sees a newer version:
  the idle worker's CPU pays for the faster reads, and a new version is noticed about 0.1 s sooner
  on average than by the plain interval.
- The stake is checked here (`on_new_version`, once per new version, after the fetch): off the
  critical path of every contribution, where it took 21 ms (three chain reads) of each version's
  first commit. What it finds (jailed, stake below the minimum) is kept in `problem`, which the
  worker's loop raises before it submits anything more; an unreachable chain only counts as an
  error (the contract refuses the commit of a worker that is no longer eligible anyway).
- A reading also stays fresh while the thread is busy with a step (a read, a new version's fetch
  and stake check) that began while it was fresh, for up to `STEP_GRACE_S`: the step is what
  refreshes it. 300 ms from the node a read takes 0.6 s and a new version's step four reads, more
  than `max_age_s` (0.5 s on the demo); the reading went stale during every step, and the worker,
  polling for the next version, read the run itself meanwhile: `krill bench latency --link 300`
  counted 5.9 `runOf` reads per commit, 3.0 with this (the worker's time was idle waiting, so
  versions/min did not change). A step stuck longer (an outage) still lets the worker read the
  chain itself, through its `Backoff`.
- Daemon thread, stopped by `stop()`; `interval_s` = 0 in the configuration turns it off.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from krill.phases import phase, recording
from krill.worker.errors import WorkerError

HURRY_INTERVAL_S = 0.05
QUIET_READ_S = 2.0  # subscribed to publications, the thread still reads this often
STEP_GRACE_S = 5.0  # how long a step of the thread (read, fetch, stake check) keeps the reading it began with fresh


class VersionWatcher:
    """The newest version of `source`'s run, refreshed in the background."""

    def __init__(self, source, interval_s: float, max_age_s: float | None = None,
                 on_new_version: Callable[[int], None] | None = None, heads=None, max_staleness: int | None = None):
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.source = source
        self.interval_s = float(interval_s)
        self.max_age_s = 2.0 * self.interval_s if max_age_s is None else float(max_age_s)
        self.max_staleness = max_staleness  # S_max: how far behind the newest the version held still serves
        self._seen: tuple[int, float] | None = None  # (newest version, monotonic time of the read)
        self._step_since: float | None = None  # monotonic start of the thread's step in progress, if any
        self._fetched: int | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()  # cuts the thread's sleep short (a waiter arrived, or stop)
        self._news = threading.Condition()  # notified after every reading
        self._waiting = 0  # workers in `wait_newer`
        self._thread: threading.Thread | None = None
        self.phases: dict[str, float] = {}  # the watcher's own time: `read_ahead`, `stake_check`
        self.errors = 0
        self.on_new_version = on_new_version
        self.heads = heads  # a `krill.chain.heads.HeadWaiter`: read when a block is announced
        self.problem: WorkerError | None = None  # what `on_new_version` found wrong (the worker stops on it)

    def start(self) -> VersionWatcher:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="krill-version-watcher", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.interval_s + 1.0)
            self._thread = None
        if self.heads is not None:
            self.heads.close()

    def latest(self) -> int | None:
        """The newest version read under `max_age_s` ago (or before a step of the thread in progress that
        began while it was, for up to `STEP_GRACE_S`; see the module docstring), or None."""
        seen, step, now = self._seen, self._step_since, time.monotonic()
        if seen is None:
            return None
        if now - seen[1] <= self.max_age_s:
            return seen[0]
        if step is not None and step - seen[1] <= self.max_age_s and now - step <= STEP_GRACE_S:
            return seen[0]
        return None

    def wait_newer(self, than: int, timeout_s: float) -> int | None:
        """Wait up to `timeout_s` for a fresh reading newer than `than` (reading every
        `HURRY_INTERVAL_S` meanwhile); return it, or None."""
        deadline = time.monotonic() + timeout_s
        with self._news:
            self._waiting += 1
            self._wake.set()
            try:
                while True:
                    latest = self.latest()
                    if latest is not None and latest > than:
                        return latest
                    left = deadline - time.monotonic()
                    if left <= 0 or self._stop.is_set():
                        return None
                    self._news.wait(left)
            finally:
                self._waiting -= 1

    def poll(self) -> None:
        """One read of the newest version, and a fetch of its shards when it is new (the thread's step).

        A new version is reported only once its shards are here: until then `latest()` keeps the
        previous one (fresh: it is still the newest at hand), so the worker goes on working instead of
        waiting for the fetch. A failed fetch raises and reports nothing new: the previous version
        stays the reading (see the module docstring). The fetch derives the version's gradient masks
        too (`RunSource.version`). Once a new version is reported (waiters woken), `on_new_version`
        runs. The reading stays fresh while this runs (`latest`, for up to `STEP_GRACE_S`)."""
        self._step_since = time.monotonic()
        try:
            self._step()
        finally:
            self._step_since = None

    def _step(self) -> None:
        new = False
        with recording(self.phases), phase("read_ahead"):
            version = int(self.source.latest())
            read_at = time.monotonic()
            if version != self._fetched:
                if self._fetched is not None:  # the version held, until the new one is here (if it still serves)
                    serves = self.max_staleness is None or version - self._fetched <= self.max_staleness
                    self._seen = (self._fetched, read_at) if serves else None
                self.source.version(version)
                self._fetched, new = version, True
            self._seen = (version, read_at)
        if not new:
            return
        self._notify()
        if self.on_new_version is not None:
            with recording(self.phases), phase("stake_check"):
                try:
                    self.on_new_version(version)
                except WorkerError as exc:
                    self.problem = exc

    def _notify(self) -> None:
        with self._news:
            self._news.notify_all()

    def _vouched(self, now: float, since: tuple[int, float] | None) -> bool:
        """Whether the subscription vouches that the last reading is still the newest version: it
        waits for publications, announced none on the connection open since the reading `since`
        (connection number, time), which is under `QUIET_READ_S` old and already fetched. If so,
        the reading is refreshed without a read."""
        heads, seen = self.heads, self._seen
        if (heads is None or heads.logs is None or since is None or seen is None or not heads.subscribed()
                or heads.connections != since[0] or now - since[1] > QUIET_READ_S or seen[0] != self._fetched):
            return False
        self._seen = (seen[0], now)
        return True

    def _run(self) -> None:
        announced, since = True, None  # since: (connection, time) of the last read on a subscription
        while not self._stop.is_set():
            started = time.monotonic()
            if announced or not self._vouched(started, since):
                if self.heads is not None and self.heads.subscribed():
                    since = (self.heads.connections, started)
                try:
                    self.poll()
                except Exception:  # chain or store unreachable: the value goes stale and the worker reads itself
                    self.errors += 1
                    since = None
            self._notify()
            if self.heads is not None and self.heads.subscribed():
                # A new version comes with a block (or, subscribed to them, a publication): read at each
                # one; at the latest every interval (or, subscribed to publications, `QUIET_READ_S`).
                announced = self.heads.wait(max(0.0, self.interval_s - (time.monotonic() - started)), self._stop)
                continue
            announced = True
            interval = HURRY_INTERVAL_S if self._waiting else self.interval_s
            self._wake.wait(max(0.0, min(interval, self.interval_s) - (time.monotonic() - started)))
            self._wake.clear()
