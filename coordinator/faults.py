"""Fault injection for crash tests: `KRILL_COORDINATOR_HALT=<point>` kills the process with SIGKILL there.

Design decisions:
- A crash test must hit the narrow windows that matter (after the decision is journalled, after
  the content is stored but before `publishVersion`, after the transaction but before the journal
  notes it, after settling but before the figures are reported) every time, not by luck of timing; so the process kills itself with the same signal
  `kill -9` sends, at a named point. Unset (always, outside tests), it does nothing.
- `<point>:<SIGNAL>` (e.g. `decided:SIGTERM`) sends that signal instead, so a test can stop the
  process the way `krill demo` and service managers do (SIGTERM, SIGINT) in the same windows, and
  see that the stop is graceful there; it is sent once per process (the first time the point is
  reached), as an operator stops a process once.
"""

from __future__ import annotations

import os
import signal

POINTS = ("ingested", "decided", "stored", "published", "settled")
ENV = "KRILL_COORDINATOR_HALT"
_signalled: set[str] = set()  # points whose (non-kill) signal this process has sent itself


def halt_point(point: str) -> None:
    """SIGKILL this process (or send it the signal the environment names) if the environment asks for
    a halt at `point`."""
    wanted, _, name = os.environ.get(ENV, "").partition(":")
    if wanted != point or point in _signalled:
        return
    if name:
        _signalled.add(point)
    os.kill(os.getpid(), signal.Signals[name] if name else signal.SIGKILL)
