"""`krill verifier run` and signals: SIGTERM stops it as Ctrl-C does (it ended the process where it stood, without
the summary or closing the state), and a second signal while it stops ends the process without a traceback.

The role's own `_run` runs (its connection, stake check and loop are fakes), so what is checked is its handling of
the interrupt: the "interrupted" and summary lines, and the state file closed (SQLite removes the write-ahead log
when the last connection closes; a process that ends with it open leaves the log behind)."""

from __future__ import annotations

import signal

import pytest

from krill.testing.signalled_role import run_signalled_role

VERIFIER = """
from types import SimpleNamespace

import krill.verifier.cli as cli
import krill.verifier.loop as loop_module

def _connect(config, echo, prompt=None):
    identity = SimpleNamespace(address="0x" + "dd" * 20, ed25519_public_key=b"\\x07" * 32)
    chain = SimpleNamespace(address="0x" + "cc" * 20, w3=SimpleNamespace(eth=SimpleNamespace(chain_id=31337)))
    spec = SimpleNamespace(run_id=b"\\x01" * 32, engine="hf-torch",
                           chain=SimpleNamespace(challenge_window_blocks=40, check_probability_ppm=100_000))
    return identity, chain, None, spec

class Loop:
    def __init__(self, *args, **kwargs):
        self.replayer = SimpleNamespace(warm_up=lambda: 0.0)

    def run(self, max_attestations=None):
        os.kill(os.getpid(), SIG)
        time.sleep(30)

cli._connect = _connect
cli._require_stake = lambda chain, identity: None
loop_module.VerifierLoop = Loop
from krill.verifier.__main__ import main
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_sigterm_stops_the_verifier_and_a_second_signal_ends_it_without_a_traceback(tmp_path, sig):
    home = tmp_path / "home"
    result = run_signalled_role(VERIFIER, sig, home)
    output = result.stdout + result.stderr
    assert "interrupted" in result.stdout and "verifier stopped: 0 attested" in result.stdout, output
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr, result.stderr
    assert result.returncode == -getattr(signal, sig), output
    assert list(home.rglob("verifier-*.sqlite")), output  # the run opened its state ...
    assert not list(home.rglob("*.sqlite-wal")), output  # ... and closed it before the second signal ended it
