"""Content fetches off a role's main thread: a few fetch threads, one lane per worker.

Design decisions:
- On a networked store a fetch of content nobody has waits out the store's timeout (60 s on
  Kubo), and committing the digest of such content costs a worker only gas. Fetched one after
  another on the role's thread (the coordinator's ingest, any role's indexer), N such commits
  held a pass for N minutes while honest contributions waited behind them and the version
  closed late; the indexer retried each on every pass, up to 20 times.
- So fetches run on at most `threads` daemon threads. A pass submits what is due, waits at most
  `PASS_WAIT_S` for what it queued (a local store answers in milliseconds, so the pass still
  decides what it fetched), and leaves what is still running to a later pass, which takes it
  without waiting for it again: a fetch the store holds costs one pass at most `PASS_WAIT_S`.
  Daemon threads: a stopping coordinator does not wait for a fetch the store is holding. A
  thread idle for `IDLE_S` ends, so an idle coordinator (or a test's context) keeps no threads.
- One lane per worker: a worker has at most one fetch running and its other commits queue behind
  it; a free thread takes the next job of the lane served least recently (round robin). A worker
  whose content never arrives therefore holds one thread, and each further thread it wants to
  hold costs it another staked account.
- Lanes named with `PRIORITY_PREFIX` (the coordinator's confirmation fetches, `confirm:<worker>`,
  whose result decides a slash) have threads of their own, `priority_threads` of them, that the
  other lanes never use, and they use none of the others'. Sharing the pool, a cheater with
  `threads` staked accounts, each with a commit of content nobody has, held every thread for a
  store timeout, and the confirmation fetch that would slash one of them waited for a thread up to
  that long again, past the one timeout the unbonding margin counts (`krill.coordinator.margin`).
  A confirmation fetch is queued only for a commit a quorum of verifiers failed, and holds its
  priority thread for a store timeout only when the content is missing, which slashes that worker
  once the commit's window closed: holding every priority thread costs a cheater
  `priority_threads` slashed accounts, where holding the ordinary threads cost it only gas.
- A job's result or exception is kept until taken; a key is not queued again while it waits, runs
  or waits to be taken. Exceptions travel to the taker, so a store outage still stops the pass as
  it did when the pass fetched itself.
- A consumer that decides a commit without its fetch (rejected as stale or jailed meanwhile, missed,
  attested unavailable) calls `forget`: a queued job is dropped, a running one's result discarded
  when it ends. Results nobody took within `KEEP_S` are dropped too. Before, each such result (a
  whole payload, or an exception holding the files read so far) stayed for the life of the role.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

IDLE_S = 30.0  # a fetch thread idle this long ends
PASS_WAIT_S = 2.0  # the longest a pass waits for the fetches it queued
KEEP_S = 600.0  # a result nobody took this long is dropped
PRIORITY_PREFIX = "confirm:"  # lanes so named run on the priority threads only


@dataclass(frozen=True)
class Finished:
    """A finished job: its value, or the exception it raised."""

    value: Any = None
    error: BaseException | None = None

    def result(self) -> Any:
        """The value; re-raises the job's exception."""
        if self.error is not None:
            raise self.error
        return self.value


class Fetcher:
    """Runs submitted jobs on at most `threads` threads, one job per lane at a time; lanes named with
    `PRIORITY_PREFIX` run on at most `priority_threads` threads of their own."""

    def __init__(self, threads: int = 8, priority_threads: int = 8):
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        if priority_threads < 1:
            raise ValueError(f"priority_threads must be at least 1, got {priority_threads}")
        self.threads = threads
        self.priority_threads = priority_threads
        self._cond = threading.Condition()
        self._lanes: OrderedDict[str, deque[tuple[Hashable, Callable[[], Any]]]] = OrderedDict()
        self._busy: set[str] = set()         # lanes with a running job
        self._known: set[Hashable] = set()   # keys queued, running or done and not taken
        self._done: dict[Hashable, Finished] = {}
        self._done_at: dict[Hashable, float] = {}  # when each result came (monotonic), for `KEEP_S`
        self._abandoned: set[Hashable] = set()  # running keys whose result nobody will take
        self._alive = {False: 0, True: 0}  # threads alive, by priority
        self._idle = {False: 0, True: 0}  # threads waiting for a job, by priority

    def submit(self, lane: str, key: Hashable, job: Callable[[], Any]) -> bool:
        """Queue `job` under `key` in `lane`, unless `key` is already queued, running or not yet taken;
        True when it was queued now."""
        with self._cond:
            if key in self._known:
                return False
            self._known.add(key)
            self._lanes.setdefault(lane, deque()).append((key, job))
            priority = lane.startswith(PRIORITY_PREFIX)
            limit = self.priority_threads if priority else self.threads
            if self._alive[priority] < limit and self._runnable(priority) > self._idle[priority]:
                self._alive[priority] += 1
                threading.Thread(target=self._serve, args=(priority,), daemon=True,
                                 name="krill-fetch-priority" if priority else "krill-fetch").start()
            self._cond.notify_all()  # the condition is shared with `wait`: wake the idle threads among them
            return True

    def __contains__(self, key: Hashable) -> bool:
        """Whether `key` is queued, running, or done and not yet taken."""
        with self._cond:
            return key in self._known

    def keys(self) -> list[Hashable]:
        """The keys queued, running, or done and not yet taken."""
        with self._cond:
            return list(self._known)

    def wait(self, keys: Iterable[Hashable], timeout_s: float) -> None:
        """Block until every one of `keys` submitted here is done, or `timeout_s` has passed."""
        keys = list(keys)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while any(k in self._known and k not in self._done for k in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)

    def take(self, key: Hashable) -> Finished | None:
        """The finished job of `key`, forgotten once taken; None while it is queued or running (or unknown)."""
        with self._cond:
            done = self._done.pop(key, None)
            if done is not None:
                self._known.discard(key)
                self._done_at.pop(key, None)
            return done

    def forget(self, key: Hashable) -> None:
        """Nobody will take `key`: drop it queued or done, discard its result when it is running."""
        self.forget_where(lambda k: k == key)

    def forget_where(self, matches: Callable[[Hashable], bool]) -> None:
        """`forget` every key for which `matches` is true."""
        with self._cond:
            for key in [k for k in self._done if matches(k)]:
                del self._done[key]
                self._done_at.pop(key, None)
                self._known.discard(key)
            for lane in list(self._lanes):
                queue = self._lanes[lane]
                kept = deque(item for item in queue if not matches(item[0]))
                for key, _ in queue:
                    if matches(key):
                        self._known.discard(key)
                if kept:
                    self._lanes[lane] = kept
                else:
                    del self._lanes[lane]
            self._abandoned.update(k for k in self._known if k not in self._done and matches(k))

    def in_flight(self) -> int:
        """Jobs queued or running."""
        with self._cond:
            return len(self._known) - len(self._done)

    def _next(self, priority: bool) -> tuple[str, Hashable, Callable[[], Any]] | None:
        for lane, queue in self._lanes.items():
            if lane not in self._busy and lane.startswith(PRIORITY_PREFIX) == priority:
                key, job = queue.popleft()
                if queue:
                    self._lanes.move_to_end(lane)
                else:
                    del self._lanes[lane]
                self._busy.add(lane)
                return lane, key, job
        return None

    def _runnable(self, priority: bool) -> int:
        return sum(lane not in self._busy and lane.startswith(PRIORITY_PREFIX) == priority for lane in self._lanes)

    def _serve(self, priority: bool) -> None:
        while True:
            with self._cond:
                picked, idle_since = self._next(priority), time.monotonic()
                while picked is None:
                    left = IDLE_S - (time.monotonic() - idle_since)
                    if left <= 0:
                        self._alive[priority] -= 1
                        return
                    self._idle[priority] += 1
                    self._cond.wait(left)
                    self._idle[priority] -= 1
                    picked = self._next(priority)
            lane, key, job = picked
            try:
                done = Finished(value=job())
            except Exception as exc:  # handed to the taker, which decides what it means
                done = Finished(error=exc)
            with self._cond:
                self._busy.discard(lane)
                now = time.monotonic()
                if key in self._abandoned:
                    self._abandoned.discard(key)
                    self._known.discard(key)
                else:
                    self._done[key], self._done_at[key] = done, now
                for stale in [k for k, at in self._done_at.items() if now - at > KEEP_S]:
                    del self._done[stale], self._done_at[stale]
                    self._known.discard(stale)
                self._cond.notify_all()
