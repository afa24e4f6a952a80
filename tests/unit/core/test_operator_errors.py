"""What an operator meets when something is off: a one-line error naming what was wrong, no secret shown,
nothing left running, no file written where it would be lost."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from krill.config import load_config
from krill.errors import ConfigError, DevnetError, KeystoreError


def test_config_show_masks_a_password_with_a_slash_and_an_rpc_key_in_the_path():
    cfg = load_config(None, ["database.url=postgresql+psycopg://alice:pa/ss@db.example/krill",
                             "chain.rpc_url=https://eth-mainnet.g.alchemy.com/v2/SECRETKEY123"], environ={})
    text = repr(cfg.masked())
    assert "pa/ss" not in text and "SECRETKEY123" not in text
    assert "alice:********@db.example/krill" in text and "https://eth-mainnet.g.alchemy.com/" in text
    assert load_config(None, [], environ={}).masked()["chain"]["rpc_url"] == "http://127.0.0.1:8545"


def test_a_new_keystore_path_must_end_in_json(tmp_path):
    from krill.role_init import keystore_path

    with pytest.raises(ConfigError, match=r"must end in \.json"):
        keystore_path(str(tmp_path / "mykey.key"), "worker")
    assert keystore_path(str(tmp_path / "mykey.json"), "worker") == (tmp_path / "mykey.json", False)


def test_a_keystore_with_an_empty_ethereum_section_is_a_keystore_error(tmp_path):
    from krill.keystore import create_keystore, unlock

    info = create_keystore("k", "pw", directory=tmp_path)
    doc = json.loads(info.path.read_text())
    doc["ethereum"] = {}
    info.path.write_text(json.dumps(doc))
    with pytest.raises(KeystoreError, match="malformed ethereum section"):
        unlock(info.path, "pw")
    for value, found in ((None, "missing"), ("0x12", "a str"), ([1], "a list")):
        doc["ethereum"] = value
        info.path.write_text(json.dumps(doc))
        with pytest.raises(KeystoreError) as refused:
            unlock(info.path, "pw")
        assert str(refused.value) == (f"keystore {info.path}: malformed ethereum section ({found}; expected the JSON "
                                      "object of an Ethereum keystore, version 3)")


def test_a_sqlite_url_with_a_tilde_opens_under_home(tmp_path, monkeypatch):
    from krill.db.session import make_engine

    monkeypatch.setenv("HOME", str(tmp_path))
    engine = make_engine("sqlite:///~/sub/x.db")
    with engine.connect():
        pass
    engine.dispose()
    assert (tmp_path / "sub" / "x.db").exists()


@pytest.mark.parametrize("content", ['{"pid": "abc", "port": 1, "chain_id": 1, "protocol_address": "0x", '
                                     '"token_address": "0x", "deploy_block": 0, "config_path": "c"}', "{torn"])
def test_a_damaged_devnet_state_is_removed_by_down_not_a_loop(tmp_path, content):
    from krill.chain.devnet import read_state, stop_devnet

    (tmp_path / "devnet.json").write_text(content)
    with pytest.raises(DevnetError, match="damaged"):
        read_state(tmp_path)
    with pytest.raises(DevnetError, match="removed it"):
        stop_devnet(tmp_path)
    assert read_state(tmp_path) is None and not (tmp_path / "devnet.json").exists()


def test_cli_errors_come_before_the_work_and_without_a_traceback(tmp_path):
    from krill.cli import cli

    runner = CliRunner()
    env = {"KRILL_HOME": str(tmp_path / "home")}
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("chain = [")
    not_a_table = tmp_path / "scalar.toml"
    not_a_table.write_text("chain = 5\n")
    for args, needle in (
        (["demo", "--summary", str(tmp_path / "missing" / "s.json")], "does not exist"),
        (["demo", "--spec", str(bad_toml)], "is not valid TOML"),
        (["demo", "--spec", str(not_a_table)], "`chain` must be a table"),
        (["store", "get", "bafkreifjjcie6lypi6ny7amxnfftagclbuxndqonfipmb64f2km2devei4", "-o",
          str(tmp_path / "missing" / "x")], "does not exist"),
    ):
        result = runner.invoke(cli, args, env=env)
        assert result.exit_code != 0, (args, result.output)
        assert needle in result.output, (args, result.output)
        assert "Traceback" not in result.output and not isinstance(result.exception, (TypeError, OSError)), args
    assert not (tmp_path / "home" / "demo").exists()  # refused before a demo folder was made
