"""A role's `run` command in a subprocess that signals itself twice: once while it works, once more while it stops.

Design decisions:
- The role's work is replaced (`patch`, Python run before `main(["run"])`) by one that sends the signal to its
  own process; an exit hook sends the second and waits, as the hooks torch, huggingface_hub, filelock and
  multiprocessing register may take a moment (`timeout -k` or a service manager may send a second signal then).
  So the test sees the whole stop the way a user's terminal does: output, traceback or not, exit status.
- Test-only (no role imports it); `KRILL_HOME` is the test's, and no configuration file is read.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import atexit, os, signal, time
os.kill(os.getpid(), 0)  # (the process exists)
SIG = getattr(signal, {sig!r})

def second():
    os.kill(os.getpid(), SIG)
    time.sleep(5)
    print("exit hook ran to the end", flush=True)

atexit.register(second)
{patch}
main(["run"])
"""


def run_signalled_role(patch: str, sig: str, home: Path) -> subprocess.CompletedProcess:
    """Run `patch` + `main(["run"])` with `sig` (a `signal` name) sent during the work and again at exit."""
    env = {**os.environ, "KRILL_HOME": str(home)}
    env.pop("KRILL_CONFIG", None)
    return subprocess.run([sys.executable, "-c", SCRIPT.format(sig=sig, patch=patch)], capture_output=True, text=True,
                          env=env, timeout=120)
