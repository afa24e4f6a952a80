"""`krill verifier run` and signals: SIGTERM stops it as Ctrl-C does (it ended the process where it stood, without
the summary or closing the state), and a second signal while it stops ends the process without a traceback."""

from __future__ import annotations

import signal

import pytest

from krill.testing.signalled_role import run_signalled_role

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


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_sigterm_stops_the_verifier_and_a_second_signal_ends_it_without_a_traceback(tmp_path, sig):
    result = run_signalled_role(VERIFIER, sig, tmp_path / "home")
    assert "interrupted" in result.stdout, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr, result.stderr
    assert result.returncode == -getattr(signal, sig), result.stdout + result.stderr
