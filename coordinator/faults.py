"""Fault injection for crash tests: `KRILL_COORDINATOR_HALT=<point>` kills the process with SIGKILL there.

Design decisions:
- A crash test must hit the narrow windows that matter (after the decision is journalled, after
  the content is stored but before `publishVersion`, after the transaction but before the journal
  notes it, after settling but before the figures are reported) every time, not by luck of timing; so the process kills itself with the same signal
  `kill -9` sends, at a named point. Unset (always, outside tests), it does nothing.
"""

from __future__ import annotations

import os
import signal

POINTS = ("ingested", "decided", "stored", "published", "settled")
ENV = "KRILL_COORDINATOR_HALT"


def halt_point(point: str) -> None:
    """SIGKILL this process if the environment asks for a halt at `point`."""
    if os.environ.get(ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)
