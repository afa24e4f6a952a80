"""`krill devnet` and `krill demo` against a real Anvil, started and stopped by the commands."""

import json

from click.testing import CliRunner

from krill.chain.anvil import free_port, pid_alive
from krill.cli import cli


def test_devnet_up_status_down_is_idempotent_and_configures_later_commands():
    runner = CliRunner()
    port = free_port()
    first = runner.invoke(cli, ["devnet", "up", "--port", str(port), "--json"])
    assert first.exit_code == 0, first.output
    state = json.loads(first.output)
    try:
        assert pid_alive(state["pid"])
        again = runner.invoke(cli, ["devnet", "up", "--port", str(port), "--json"])
        assert json.loads(again.output)["pid"] == state["pid"]
        status = json.loads(runner.invoke(cli, ["devnet", "status", "--json"]).output)
        assert status["running"] and status["block_number"] > state["deploy_block"]
        shown = json.loads(runner.invoke(cli, ["config", "show", "--json"]).output)
        assert shown["chain"]["protocol_address"] == state["protocol_address"]
        assert shown["chain"]["rpc_url"] == f"http://127.0.0.1:{port}"
    finally:
        down = runner.invoke(cli, ["devnet", "down"])
    assert "stopped" in down.output and not pid_alive(state["pid"])
    assert json.loads(runner.invoke(cli, ["devnet", "status", "--json"]).output) == {"running": False}


def test_demo_plays_a_round_and_the_chain_confirms_it(tmp_path):
    summary = tmp_path / "s.json"
    result = CliRunner().invoke(cli, ["demo", "--chain-round", "--summary", str(summary)])
    assert result.exit_code == 0, result.output
    data = json.loads(summary.read_text())
    assert data["commits"] == 2 and data["latest_version"] == 1
    assert data["cheater_jailed"] is True and data["cheater_stake"] == 250 and data["total_burned"] == 200
    assert data["sealed_randomness_events"] == 2
