"""Retrying what the network may refuse: exponential back-off, capped, never giving up.

Design decisions:
- Unreachability is always retried (`ChainUnavailableError`, `StoreUnavailableError`, a receipt that
  never came). Answers are not: a revert or a malformed payload is a decision, and the caller
  handles it. The chain client already retries single RPCs briefly; this is the outer, patient
  loop that lets a worker sit out an outage of minutes.
- Some answers only mean "not yet" where the caller knows better, and a call names those
  (`retry=`, minus `final=`). `fetch`: reading what the run published, whose content the
  coordinator stored, any store error is retried (Kubo reports a search that timed out as
  `ContentNotFoundError`, an HTTP 5xx as a plain `StoreError`, a stream broken off as content that
  does not hash to its CID) except content over its cap, which stays so. `upload`: any store error
  but `IntegrityError` (a daemon that names the bytes otherwise than they hash will do so again;
  that stops the worker with its message).
- The delay starts at the role's poll interval and doubles up to `max_backoff_s`; it resets after
  every success, so one outage does not slow the next one's first retry.
- Each wait is announced on one line (what failed, the error, the delay), so an operator sees
  why the worker is idle.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from krill.errors import ChainUnavailableError, IntegrityError, StoreError, StoreUnavailableError
from krill.store.unixfs import ObjectTooLargeError

T = TypeVar("T")


def _transient_types() -> tuple[type[BaseException], ...]:
    from web3.exceptions import TimeExhausted

    return (ChainUnavailableError, StoreUnavailableError, TimeExhausted)


class Backoff:
    """Call functions until they stop failing for lack of a network."""

    def __init__(self, initial_s: float, max_s: float, echo: Callable[[str], None] = print,
                 sleep: Callable[[float], None] = time.sleep):
        self.initial_s = float(initial_s)
        self.max_s = max(float(max_s), float(initial_s))
        self.echo = echo
        self.sleep = sleep
        self.waits = 0  # total retries so far (for status and tests)
        self._transient = _transient_types()

    def call(self, fn: Callable[[], T], what: str, retry: tuple[type[BaseException], ...] = (),
             final: tuple[type[BaseException], ...] = ()) -> T:
        """`fn()`, retried while it fails for lack of a network, or with one of `retry` that is none of `final`."""
        delay = self.initial_s
        while True:
            try:
                return fn()
            except self._transient + retry as exc:
                unreachable = isinstance(exc, self._transient)
                if not unreachable and isinstance(exc, final):
                    raise
                self.waits += 1
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                if unreachable:
                    self.echo(f"{what}: unreachable ({reason}); retrying in {delay:.1f}s")
                else:
                    self.echo(f"{what}: not available yet ({type(exc).__name__}: {reason}); retrying in {delay:.1f}s")
                self.sleep(delay)
                delay = min(delay * 2, self.max_s)

    def fetch(self, fn: Callable[[], T], what: str) -> T:
        """`call`, also retrying a store that does not deliver published content yet."""
        return self.call(fn, what, retry=(StoreError,), final=(ObjectTooLargeError,))

    def upload(self, fn: Callable[[], T], what: str) -> T:
        """`call`, also retrying a store that fails an upload (a timeout, an HTTP 5xx)."""
        return self.call(fn, what, retry=(StoreError,), final=(IntegrityError,))
