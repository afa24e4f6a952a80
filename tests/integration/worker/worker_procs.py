"""Helpers of the worker integration tests: start worker processes, wait on conditions, read commits."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def start_worker(config: Path, *args: str, log: Path) -> subprocess.Popen:
    """`python -m krill.worker --config CONFIG run ARGS`, output to `log`, stopped by PID by the caller."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    out = open(log, "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen([sys.executable, "-m", "krill.worker", "--config", str(config), "run", *args],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT, env=env)
    finally:
        out.close()


def wait_for(condition, timeout: float, what: str, proc: subprocess.Popen | None = None, log: Path | None = None):
    """Poll `condition()` until it is truthy (returned), failing after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"worker exited ({proc.returncode}) while waiting for {what}:\n"
                                 + (log.read_text() if log else ""))
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f":\n{log.read_text()}" if log else ""))


def commits_of(env, run, worker_index: int) -> list:
    """This worker's Committed events in `run`, oldest first."""
    from krill.chain.events import Committed

    address = env.accounts[worker_index].address.lower()
    return [e for e in env.admin.events(env.deployment.block_number, kinds=(Committed,))
            if e.run_id == run.run_id and e.worker.lower() == address]
