"""`krill verifier run` and signals: SIGTERM stops it as Ctrl-C does (it ended the process where it stood, without
the summary or closing the state), and a second signal while it stops ends the process without a traceback."""

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
VERIFIER = """
import krill.verifier.cli as cli

def _run(config, bar, max_attestations):
    try:
        os.kill(os.getpid(), SIG)
        time.sleep(30)
    except KeyboardInterrupt:
        bar.line("interrupted")  # as the real loop's caller does, before its summary line

cli._run = _run
from krill.verifier.__main__ import main
"""


def run_role(patch: str, sig: str, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "KRILL_HOME": str(tmp_path / "home")}
    env.pop("KRILL_CONFIG", None)
    return subprocess.run([sys.executable, "-c", SCRIPT.format(sig=sig, patch=patch)], capture_output=True, text=True,
                          env=env, timeout=120)



@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_sigterm_stops_the_verifier_and_a_second_signal_ends_it_without_a_traceback(tmp_path, sig):
    result = run_role(VERIFIER, sig, tmp_path)
    assert "interrupted" in result.stdout, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr, result.stderr
    assert result.returncode == -getattr(signal, sig), result.stdout + result.stderr
