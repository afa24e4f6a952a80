"""Named wall-time phases, recorded across module boundaries for the protocol benchmarks.

Design decisions:
- A phase is a `with phase("name"):` block in the module that owns the work: the engine call in
  `protocol.work.sample`, the Ed25519 signature in `payload.contribution`, the receipt wait in
  `chain.tx`. It records only while a caller has opened `recording()` (the worker around one
  contribution, the coordinator around its passes); otherwise it costs one context-variable
  lookup and nothing is kept, so the code paths behave exactly as before.
- The recorder is a context variable, not a global: threads do not mix their phases.
- Times of the same name add up (a contribution uploads several files, a pass fetches several
  contributions). Phases may nest under different names; which ones are disjoint is for the
  reader to say (the benchmarks list the ones they add up).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_current: ContextVar[dict[str, float] | None] = ContextVar("krill_phases", default=None)


@contextmanager
def recording(into: dict[str, float] | None = None) -> Iterator[dict[str, float]]:
    """Record the phases run inside this block into `into` (a new dict by default), seconds by name."""
    phases = {} if into is None else into
    token = _current.set(phases)
    try:
        yield phases
    finally:
        _current.reset(token)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Add the wall time of this block to phase `name` of the active recording, if any."""
    phases = _current.get()
    if phases is None:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - started


def current() -> dict[str, float]:
    """A copy of the active recording's phases so far, rounded to 0.1 ms ({} when none is active)."""
    phases = _current.get()
    return {k: round(v, 4) for k, v in phases.items()} if phases else {}
