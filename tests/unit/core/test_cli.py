import json
import subprocess
import sys

from click.testing import CliRunner

from krill import __version__
from krill.cli import cli


def test_help_lists_commands_without_heavy_imports():
    code = ("import sys; from krill.cli import cli\n"
            "try:\n    cli(['--help'], prog_name='krill')\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('torch', 'transformers', 'web3', 'sqlalchemy') if m in sys.modules]\n"
            "print('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out
    for name in ("config", "keys", "devnet"):
        assert name in out


def test_version():
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_config_show_masks_and_applies_overrides():
    result = CliRunner().invoke(cli, ["--set", "chain.rpc_url=https://u:topsecret@host/x", "--set", "chain.retries=3",
                                      "config", "show", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["chain"]["retries"] == 3 and "topsecret" not in result.output


def test_config_error_is_one_clear_line():
    result = CliRunner().invoke(cli, ["--set", "chain.retries=-5", "config", "show"])
    assert result.exit_code == 1
    assert "error: invalid configuration" in result.output and "chain.retries" in result.output


def test_keys_new_list_show(tmp_path):
    pw = tmp_path / "pw"
    pw.write_text("correct horse\n")
    runner = CliRunner()
    made = runner.invoke(cli, ["keys", "new", "--name", "w0", "--password-file", str(pw), "--json"])
    assert made.exit_code == 0, made.output
    info = json.loads(made.output)
    listed = json.loads(runner.invoke(cli, ["keys", "list", "--json"]).output)
    assert [k["address"] for k in listed] == [info["address"]]
    shown = runner.invoke(cli, ["keys", "show", "w0", "--unlock", "--password-file", str(pw), "--json"])
    assert json.loads(shown.output)["unlocked"] is True
    pw.write_text("wrong")
    bad = runner.invoke(cli, ["keys", "show", "w0", "--unlock", "--password-file", str(pw)])
    assert bad.exit_code == 1 and "wrong password" in bad.output
