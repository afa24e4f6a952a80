"""`krill verifier stake|run` as real commands: stake via the CLI, run as a process, kill -9, restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from nacl.signing import SigningKey
from verifier_env import CLI_VERIFIER, WORKER_A

from krill.chain.anvil import stop_pid
from krill.chain.types import Role
from krill.keystore import KdfCost, create_keystore
from krill.verifier.__main__ import main
from krill.verifier.state import ATTESTED, VerifierState

PASSWORD = "verifier-test-password"


@pytest.fixture(scope="module")
def config_file(run_env, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("verifier-cli")
    account = run_env.accounts[CLI_VERIFIER]
    info = create_keystore("cli-verifier", PASSWORD, directory=root / "keys", private_key=bytes(account.key),
                           ed25519_seed=b"\x42" * 32, cost=KdfCost.FAST)
    path = root / "krill.toml"
    path.write_text(f"""
[chain]
rpc_url = "{run_env.anvil.rpc_url}"
protocol_address = "{run_env.protocol}"
[store]
type = "local"
path = "{run_env.store_path}"
[keystore]
path = "{info.path}"
password = "{PASSWORD}"
[run]
id = "{run_env.spec.run_id.hex()}"
[verifier]
state_dir = "{root / 'state'}"
poll_interval_s = 0.1
""")
    return path


def _wait(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"verifier exited with {proc.returncode}: {log.read_text() if log else ''}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}: {log.read_text() if log else ''}")


def _start(config: Path, log: Path, home: Path) -> subprocess.Popen:
    env = dict(os.environ, KRILL_HOME=str(home), PYTHONUNBUFFERED="1")
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "krill.verifier", "--config", str(config), "run"],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)


def test_run_refuses_an_unstaked_account_then_stake_registers_the_key(run_env, config_file):
    runner = CliRunner()
    result = runner.invoke(main, ["--config", str(config_file), "run"])
    assert result.exit_code != 0 and "krill verifier stake" in str(result.exception)
    result = runner.invoke(main, ["--config", str(config_file), "stake", "--amount", "150"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    info = run_env.at(CLI_VERIFIER).stake_of(run_env.address(CLI_VERIFIER))
    assert info.role == Role.VERIFIER and info.staked == 150 * 10**18
    assert info.ed25519_public_key != b"\x00" * 32


def _staked(env):
    """The CLI verifier's chain client, its account staked as a verifier (when run without the stake test)."""
    chain = env.at(CLI_VERIFIER)
    if chain.stake_of(env.address(CLI_VERIFIER)).role != Role.VERIFIER:
        chain.approve_stake(150 * 10**18)
        chain.stake(Role.VERIFIER, 150 * 10**18, bytes(SigningKey(b"\x42" * 32).verify_key))
    return chain


def test_killed_verifier_resumes_without_attesting_twice(run_env, config_file, tmp_path):
    env, me = run_env, run_env.address(CLI_VERIFIER)
    chain = _staked(env)
    first, _ = env.produce(WORKER_A)
    env.mine(1)
    log = tmp_path / "verifier.log"
    proc = _start(config_file, log, tmp_path)
    try:
        _wait(lambda: chain.attestation_of(first, me).exists, 90, f"attestation of commit {first}", proc, log)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        first_run = log.read_text()
        second, _ = env.produce(WORKER_A)
        env.mine(1)
        proc = _start(config_file, log, tmp_path)
        _wait(lambda: chain.attestation_of(second, me).exists, 90, f"attestation of commit {second}", proc, log)
        # On chain before the verifier has its receipt, records the decision and says it: stopped before
        # that, the line is never written.
        _wait(lambda: any(line.startswith(f"commit {second} ") and "PASS" in line
                          for line in log.read_text()[len(first_run):].splitlines()),
              60, f"the decision on commit {second} to be recorded", proc, log)
    finally:
        stop_pid(proc.pid, 5.0, proc)
    second_run = log.read_text()[len(first_run):]
    assert f"commit {second} " in second_run and "PASS" in second_run, second_run
    assert "ERROR" not in second_run and "AttestationDuplicate" not in second_run, second_run
    replayed_first_again = [line for line in second_run.splitlines()
                            if line.startswith(f"commit {first} ") and "already attested" not in line]
    assert not replayed_first_again, second_run
    attested = [e for e in chain.events(0) if type(e).__name__ == "Attested" and e.verifier == me]
    assert sorted(e.commit_id for e in attested) == [first, second]
    state_file = next((config_file.parent / "state").glob("verifier-*.sqlite"))
    state = VerifierState(state_file, contract=env.protocol, run_id=env.spec.run_id, verifier=me)
    assert state.decision(first).status == ATTESTED and state.decision(second).status == ATTESTED
    state.close()


def test_a_suspended_verifier_resumes_says_what_it_missed_and_attests_what_is_still_open(run_env, config_file,
                                                                                         tmp_path):
    """A verifier process frozen (SIGSTOP: a laptop's lid closed) while the window of a commit it was drawn for
    closes and another commit lands, then resumed (SIGCONT): it records the first as missed and says so (it
    said nothing), attests the second, and sends nothing into the closed window."""
    from verifier_env import WINDOW, WORKER_B

    env, me = run_env, run_env.address(CLI_VERIFIER)
    chain = _staked(env)
    first, _ = env.produce(WORKER_A)
    env.mine(1)
    log = tmp_path / "verifier.log"
    proc = _start(config_file, log, tmp_path)
    try:
        _wait(lambda: chain.attestation_of(first, me).exists, 90, f"attestation of commit {first}", proc, log)
        os.kill(proc.pid, signal.SIGSTOP)
        closed, _ = env.produce(WORKER_A)
        env.mine(WINDOW + 2)  # its window closes while the verifier sleeps
        still_open, _ = env.produce(WORKER_B)
        env.mine(1)
        os.kill(proc.pid, signal.SIGCONT)
        _wait(lambda: any(line.startswith(f"commit {still_open} ") and "PASS" in line
                          for line in log.read_text().splitlines()), 60, f"the verdict on commit {still_open}",
              proc, log)
    finally:
        os.kill(proc.pid, signal.SIGCONT)  # a test that failed while it was frozen: stoppable by SIGTERM
        stop_pid(proc.pid, 5.0, proc)
    out = log.read_text()
    missed = [line for line in out.splitlines() if line.startswith(f"commit {closed} ")]
    assert len(missed) == 1 and "MISSED" in missed[0] and "challenge window closed" in missed[0], out
    assert chain.attestation_of(still_open, me).exists and not chain.attestation_of(closed, me).exists
    assert "Traceback" not in out and "ERROR" not in out, out
