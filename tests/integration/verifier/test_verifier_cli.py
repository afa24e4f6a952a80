"""`krill verifier init|stake|status|run|claim|unstake|withdraw` as a person runs them, on this module's
Anvil devnet: a verifier's life from init (given chain, contract and store; the run found on-chain)
to a bounty claimed and stake withdrawn, then each failure message with its next step."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from verifier_env import CLI_VERIFIER, WORKER_A, WORKER_B

from krill.cli import cli
from krill.config import krill_home
from krill.keystore import KdfCost, create_keystore

PASSWORD = "verifier-cli-password"
SPARE = 5  # funded, never staked by the fixture


def krill(*args: str, password: str = PASSWORD):
    result = CliRunner().invoke(cli, list(args), env={"KRILL_KEYSTORE__PASSWORD": password})
    assert "Traceback" not in result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def failed(result, *needles: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.output.count("error: ") == 1, result.output
    for needle in needles:
        assert needle in result.output, result.output


def _keystore(env, index: int, seed: bytes):
    return create_keystore(f"acct{index}", PASSWORD, directory=krill_home() / "keys",
                           private_key=bytes(env.accounts[index].key), ed25519_seed=seed, cost=KdfCost.FAST).path


def _init(env, index: int, seed: bytes, *extra: str) -> str:
    out = krill_home() / f"verifier-{index}.toml"
    result = krill("verifier", "init", "--rpc-url", env.anvil.rpc_url, "--protocol", env.protocol,
                   "--store", str(env.store_path), "--keystore", str(_keystore(env, index, seed)), "--out", str(out),
                   "--json", *extra)
    assert result.exit_code == 0, result.output
    made = json.loads(result.output)
    assert made["created_keystore"] is False and made["funded"] == [] and made["address"] == env.address(index)
    assert made["run_id"] == env.spec.run_id.hex() and "krill verifier stake" in " ".join(made["next_steps"])
    return str(out)


def _status(config: str) -> dict:
    result = krill("--config", config, "verifier", "status", "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_a_verifier_from_init_to_bounty_and_withdrawal(run_env):
    env = run_env
    config = _init(env, CLI_VERIFIER, b"\x51" * 32)
    fresh = _status(config)
    assert fresh["run"]["id"] == env.spec.run_id.hex()  # the chain's only run, found by init
    assert fresh["staked_as"] == "nothing" and any("krill verifier stake" in h for h in fresh["hints"])
    assert fresh["attestations"]["attested"] == 0 and fresh["trust"] is None
    assert fresh["trust_note"] == "none (the coordinator weighs workers' contributions, not verifiers)"

    staked = krill("--config", config, "verifier", "stake", "--amount", "150")
    assert staked.exit_code == 0 and "staked 150 KRILL as verifier" in staked.output, staked.output
    honest, _ = env.produce(WORKER_A)
    forged, _ = env.produce(WORKER_B, tamper="rewards")
    ran = krill("--config", config, "verifier", "run", "--max-attestations", "2")
    assert ran.exit_code == 0, ran.output
    assert "verifier stopped: 2 attested (1 passed, 1 failed)" in ran.output, ran.output

    status = _status(config)
    assert (status["attestations"]["passed"], status["attestations"]["failed"]) == (1, 1)
    table = krill("--config", config, "verifier", "status")
    assert "2 attested: 1 passed, 1 failed" in table.output and "150 KRILL (minimum 100)" in table.output

    env.at(0).slash(forged)  # quorum 1: this verifier's failing verdict is enough; it earns the bounty
    bounty = _status(config)
    assert bounty["claimable"] == bounty["earned"] != "0"
    assert any("krill verifier claim" in h for h in bounty["hints"])
    claimed = krill("--config", config, "verifier", "claim")
    assert claimed.exit_code == 0 and f"claimed {bounty['claimable']} KRILL" in claimed.output, claimed.output
    failed(krill("--config", config, "verifier", "claim"), "nothing to claim", "slashed")

    assert krill("--config", config, "verifier", "unstake", "--amount", "50").exit_code == 0
    early = krill("--config", config, "verifier", "withdraw")
    failed(early, "still unbonding", "more blocks must pass")
    env.mine(_status(config)["blocks_to_release"])
    paid = krill("--config", config, "verifier", "withdraw")
    assert paid.exit_code == 0 and "withdrew 50 KRILL" in paid.output, paid.output
    assert _status(config)["staked"] == "100" and honest != forged


@pytest.mark.parametrize("case", ["unstaked", "worker-account"])
def test_each_failure_names_the_next_step(run_env, case):
    env = run_env
    if case == "worker-account":
        # Staked by the fixture as a worker with this seed: verifier commands point at the worker's.
        config = _init(env, WORKER_A, bytes([WORKER_A + 1]) * 32)
        failed(krill("--config", config, "verifier", "stake", "--amount", "150"), "already staked as worker")
        failed(krill("--config", config, "verifier", "unstake"), "staked as a worker", "krill worker")
        failed(krill("--config", config, "verifier", "run"), "staked as a worker", "krill verifier init")
        return
    config = _init(env, SPARE, b"\x52" * 32)
    failed(krill("--config", config, "verifier", "run"), "not staked as a verifier", "krill verifier stake")
    failed(krill("--config", config, "verifier", "withdraw"), "nothing staked", "krill verifier stake")
    failed(krill("--config", config, "verifier", "stake", "--amount", "10"),
           "below the verifier minimum of 100 KRILL", "--amount 100")
    failed(krill("--config", config, "verifier", "stake", password="wrong"), "wrong password for keystore")
    failed(krill("--config", config, "--set", "run.id=" + "ef" * 32, "verifier", "status"),
           "does not exist on the chain", "check run.id")
    failed(krill("--config", config, "--set", "chain.rpc_url=http://127.0.0.1:9", "verifier", "status"),
           "unreachable", "krill devnet status")
    failed(krill("verifier", "init", "--rpc-url", env.anvil.rpc_url, "--protocol", env.protocol, "--run-id", "01" * 32,
                 "--keystore", str(krill_home() / "keys" / f"acct{SPARE}.json"), "--out", config, "--force"),
           "does not exist on the chain", "check run.id")
