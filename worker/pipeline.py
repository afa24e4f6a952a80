"""Submitting one contribution in the background while the worker makes the next.

Design decisions:
- At most one submission is in flight: `WorkerState` names one pending contribution at a time,
  and the next one is handed over only after the previous submission finished (`wait`). A
  submission is the packaging (compression, serialisation, hashing, signing), the durable save,
  the upload, the commit transaction and its receipt wait of contribution n, overlapped with the
  sampling and learning of contribution n + 1, the RL work;
  the main thread waits only if a submission takes longer than making the next contribution
  (recorded as the phase `wait_submit`).
- Crash safety is unchanged: the submission saves the contribution as pending before it uploads
  or commits anything, so a process killed mid-submission resumes it on restart exactly as
  before, and one killed before the save loses only work that never left the machine (its nonce
  was not persisted either, and is safe to hand out again). The thread is a daemon: a worker
  stopped by an exception or Ctrl-C does not hang on a submission stuck in back-off; what it
  abandoned is the pending contribution the next start resumes.
- One long-lived thread runs the submissions, handed over through a queue: starting a thread per
  contribution cost the main loop about 1% of its time (`Thread.start` waits until the new
  thread runs, which on a loaded machine means waiting for the GIL and a core). The thread is
  named after the nonce it is submitting.
- A submission's exception (jailed, a foreign digest, ...) is raised in the main thread by `wait`,
  where the sequential loop would have raised it. A contribution that does not encode is not an
  exception: `package` logs and drops it, and `wait` returns that Outcome.
- Phases go on in the contribution's own recording (`krill.phases` is per thread, so the
  background thread opens it again with the same dict); `seconds["foreground"]` is the part of the
  contribution's time on the critical path (making it and waiting for the previous submission).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from krill.phases import phase, recording
from krill.worker.contribute import Outcome


class SubmitPipeline:
    """One background submission at a time for a `Contributor`."""

    def __init__(self, contributor):
        self.contributor = contributor
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._finished = threading.Event()  # set when the job in flight has finished
        self._busy = False
        self._result = None
        self._error: BaseException | None = None
        self.model_version: int | None = None  # the in-flight commit's version, for the per-version cap

    @property
    def in_flight(self) -> bool:
        return self._busy

    def start(self, made, phases: dict[str, float], before: Callable[[], None] | None = None) -> None:
        """Package, save and submit a `Made` contribution (`Contributor.make`) in the background; `before`
        (the stake check) runs first in the same thread, recorded as the phase `stake_check`."""
        if self._busy:
            raise RuntimeError("a submission is already in flight")
        made.seconds = dict(made.seconds) | {"foreground": time.perf_counter() - made.started}
        self._result, self._error = None, None
        self.model_version = made.model_version

        def run() -> None:
            threading.current_thread().name = f"submit-nonce-{made.nonce}"
            try:
                with recording(phases):
                    if before is not None:
                        with phase("stake_check"):
                            before()
                    packaged = self.contributor.package(made)
                    if isinstance(packaged, Outcome):  # it does not encode: logged and dropped
                        self._result = packaged
                        return
                    self.contributor.save(packaged)
                    pending, header, files, seconds, started = packaged
                    self._result = self.contributor.submit(pending, header, files, seconds, started, resumed=False)
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread by `wait`
                self._error = exc

        self._busy = True
        self._finished.clear()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="submit", daemon=True)
            self._thread.start()
        self._jobs.put(run)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job()
            self._finished.set()

    def done(self) -> bool:
        return self._busy and self._finished.is_set()

    def failed(self) -> bool:
        """Whether the submission in flight has finished with an exception (`wait` raises it)."""
        return self.done() and self._error is not None

    def wait(self):
        """The in-flight submission's Outcome (None if none is in flight); re-raises its exception."""
        if not self._busy:
            return None
        self._finished.wait()
        self._busy, self.model_version = False, None
        result, error, self._result, self._error = self._result, self._error, None, None
        if error is not None:
            raise error
        return result

    def close(self) -> None:
        """Stop the background thread once the submission in flight (if any) finished."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None
