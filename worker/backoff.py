"""Retrying what the network may refuse: exponential back-off, capped, never giving up.

Design decisions:
- Only unreachability is retried (`ChainUnavailableError`, `StoreUnavailableError`, a receipt that
  never came). Answers are not: a revert or a malformed payload is a decision, and the caller
  handles it. The chain client already retries single RPCs briefly; this is the outer, patient
  loop that lets a worker sit out an outage of minutes.
- The delay starts at the role's poll interval and doubles up to `max_backoff_s`; it resets after
  every success, so one outage does not slow the next one's first retry.
- Each wait is announced on one line (what failed, the error, the delay), so an operator sees
  why the worker is idle.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from krill.errors import ChainUnavailableError, StoreUnavailableError

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

    def call(self, fn: Callable[[], T], what: str) -> T:
        delay = self.initial_s
        while True:
            try:
                return fn()
            except self._transient as exc:
                self.waits += 1
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                self.echo(f"{what}: unreachable ({reason}); retrying in {delay:.1f}s")
                self.sleep(delay)
                delay = min(delay * 2, self.max_s)
