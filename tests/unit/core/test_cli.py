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


def test_every_sub_commands_help_imports_no_heavy_library():
    """`krill X --help` for every command and sub-command, in one process: none loads torch, transformers,
    web3 or SQLAlchemy (the root's --help alone was checked)."""
    code = ("import sys, click\nfrom krill.cli import cli\n"
            "def walk(cmd, path, ctx):\n"
            "    yield path\n"
            "    if isinstance(cmd, click.Group):\n"
            "        for name in cmd.list_commands(ctx):\n"
            "            yield from walk(cmd.get_command(ctx, name), path + [name], ctx)\n"
            "paths = list(walk(cli, [], click.Context(cli)))\n"
            "for path in paths:\n"
            "    try:\n        cli([*path, '--help'], prog_name='krill')\n    except SystemExit as exc:\n"
            "        assert exc.code == 0, path\n"
            "heavy = [m for m in ('torch', 'transformers', 'web3', 'sqlalchemy') if m in sys.modules]\n"
            "print('PATHS', len(paths), 'HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    last = out.strip().splitlines()[-1]
    assert last.endswith("HEAVY []"), last
    assert int(last.split()[1]) > 40  # every leaf was reached (the roles' too)


def test_role_init_takes_the_password_from_the_configuration(tmp_path, monkeypatch):
    """Before: `krill worker init` read only the KRILL_KEYSTORE__PASSWORD variable, so `--set keystore.password=...`
    and a config file's password (which `krill keys show --unlock` and every other command use) were ignored:
    without a terminal it failed with "no keystore password"."""
    import krill.role_init

    seen = {}

    def fake_init_role(role, *, password, **_):
        seen["password"] = password
        raise krill.role_init.ConfigError("stop here")

    monkeypatch.setattr(krill.role_init, "init_role", fake_init_role)
    env = {"KRILL_HOME": str(tmp_path / "home"), "KRILL_CONFIG": None, "KRILL_KEYSTORE__PASSWORD": None}
    result = CliRunner().invoke(cli, ["--set", "keystore.password=s3cret 1", "worker", "init", "--devnet"], env=env)
    assert "stop here" in result.output and seen["password"] == "s3cret 1", result.output
    config = tmp_path / "k.toml"
    config.write_text('[keystore]\npassword = "from-file"\n')
    result = CliRunner().invoke(cli, ["--config", str(config), "verifier", "init", "--devnet"], env=env)
    assert "stop here" in result.output and seen["password"] == "from-file", result.output
    result = CliRunner().invoke(cli, ["worker", "init", "--devnet"], env=env)
    assert result.exit_code == 1 and "no keystore password" in result.output



def test_role_init_refuses_a_store_url_of_another_scheme_and_names_bad_flags_plainly(tmp_path, monkeypatch):
    """Before: `--store ipfs://...` was taken as a local folder `ipfs:` under the current one (made, and written
    into the config, exit 0); a bad --rpc-url was reported with pydantic's "Value error, " decoration."""
    env = {"KRILL_HOME": str(tmp_path / "home"), "KRILL_CONFIG": None, "KRILL_KEYSTORE__PASSWORD": "pw"}
    common = ["worker", "init", "--keystore", str(tmp_path / "k.json"), "--out", str(tmp_path / "w.toml")]
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    result = CliRunner().invoke(cli, [*common, "--rpc-url", "http://127.0.0.1:1", "--protocol", "0x" + "11" * 20,
                                      "--store", "ipfs://host/x"], env=env)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert result.output == ("error: --store ipfs://host/x: expected a local directory or a Kubo RPC URL "
                             "(http:// or https://)\n")
    assert list(here.iterdir()) == [] and not (tmp_path / "w.toml").exists() and not (tmp_path / "k.json").exists()
    result = CliRunner().invoke(cli, [*common, "--rpc-url", "notaurl", "--protocol", "0x" + "11" * 20], env=env)
    assert result.exit_code == 1 and result.output == (
        "error: invalid settings: chain.rpc_url: expected an http:// or https:// URL with a host, e.g. "
        "http://127.0.0.1:8545, got 'notaurl'\n"), result.output
