"""`krill worker run` and signals: SIGTERM stops it as Ctrl-C does, and a second signal while it stops (here:
during an interpreter exit hook, as `timeout -k` or a service manager may send it) ends the process without a
traceback."""

from __future__ import annotations

import signal

import pytest

from krill.testing.signalled_role import run_signalled_role

WORKER = """
import krill.worker.runner as runner

def run_worker(*args, **kwargs):
    os.kill(os.getpid(), SIG)
    time.sleep(30)

runner.run_worker = run_worker
from krill.worker.cli import main
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_second_signal_ends_the_worker_without_a_traceback(tmp_path, sig):
    result = run_signalled_role(WORKER, sig, tmp_path / "home")
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
