"""`krill coordinator create-run` through the command line: spec file, model directory, funding, saved run id."""

from __future__ import annotations

import json


def test_create_run_command_creates_funds_and_saves_the_run(coordinator_env, tiny_model_dir, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from krill.cli import cli
    from krill.coordinator.cli import coordinator
    from krill.coordinator.create_run import saved_run_id
    from krill.protocol.state import load_run

    env = coordinator_env()
    monkeypatch.setenv("KRILL_HOME", str(env.root))
    spec_file = tmp_path / "spec.toml"
    spec_file.write_text('[version]\ncontributions = 5\n[chain]\nattestation_quorum = 2\nreward_per_version = 7\n')
    monkeypatch.setattr(cli, "commands", dict(cli.commands))  # restored after the test
    cli.add_command(coordinator, "coordinator")
    result = CliRunner().invoke(cli, ["--config", str(env.config_path), "coordinator", "create-run", "--name", "cli-run",
                                      "--model", str(tiny_model_dir), "--spec", str(spec_file), "--fund", "0.5",
                                      "--json"])
    assert result.exit_code == 0, result.output
    created = json.loads(result.output)
    run_id = bytes.fromhex(created["run_id"])
    assert saved_run_id() == created["run_id"]
    spec = load_run(env.chain, env.store, run_id)  # spec hashes to the id and matches the contract
    assert (spec.name, spec.version.contributions, spec.chain.attestation_quorum) == ("cli-run", 5, 2)
    run = env.chain.run_of(run_id)
    assert run.params.coordinator == env.chain.sender and run.reward_pool == 5 * 10**17
    assert run.params.reward_per_version == 7

    again = CliRunner().invoke(cli, ["--config", str(env.config_path), "coordinator", "create-run", "--name", "cli-run",
                                     "--model", str(tiny_model_dir), "--spec", str(spec_file)])
    assert again.exit_code == 1 and "RunAlreadyExists" in again.output
