"""`krill worker run` and signals: SIGTERM stops it as Ctrl-C does, and a second signal while it stops (here:
during an interpreter exit hook, as `timeout -k` or a service manager may send it) ends the process without a
traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

# The role's work is replaced by one that signals itself; the exit hook sends the second signal and waits, as the
# hooks torch, huggingface_hub, filelock and multiprocessing register may take a moment.
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
WORKER = """
import krill.worker.runner as runner

def run_worker(*args, **kwargs):
    os.kill(os.getpid(), SIG)
    time.sleep(30)

runner.run_worker = run_worker
from krill.worker.cli import main
"""


def run_role(patch: str, sig: str, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "KRILL_HOME": str(tmp_path / "home")}
    env.pop("KRILL_CONFIG", None)
    return subprocess.run([sys.executable, "-c", SCRIPT.format(sig=sig, patch=patch)], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_second_signal_ends_the_worker_without_a_traceback(tmp_path, sig):
    result = run_role(WORKER, sig, tmp_path)
    assert "worker stopped (state saved" in result.stdout, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr, result.stderr
    assert result.returncode == -getattr(signal, sig), result.stdout + result.stderr  # ended by the second signal
    assert "exit hook ran to the end" not in result.stdout


def test_the_handlers_come_back_when_no_signal_came():
    from krill.runtime import stop_on_signals

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with stop_on_signals():
        assert signal.getsignal(signal.SIGTERM) is not before[0]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
