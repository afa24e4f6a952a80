"""A `--password-file` that is not UTF-8 text is one `error:` line naming the file, not a traceback, both in
`krill keys` (new, show --unlock) and in the roles' `init`."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from krill.cli import cli
from krill.keystore import KdfCost, create_keystore


@pytest.fixture
def binary_password(tmp_path, monkeypatch):
    monkeypatch.setenv("KRILL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KRILL_CONFIG", raising=False)
    monkeypatch.delenv("KRILL_KEYSTORE__PASSWORD", raising=False)
    path = tmp_path / "password"
    path.write_bytes(b"\xff\xfepw\n")
    return path


def _assert_one_line(result, path):
    assert result.exit_code == 1, (result.output, result.exception)
    assert result.output.strip() == f"error: password file {path} is not UTF-8 text (invalid start byte at byte 0)"


def test_keys_new(tmp_path, binary_password):
    result = CliRunner().invoke(cli, ["keys", "new", "--name", "k", "--dir", str(tmp_path / "keys"),
                                      "--password-file", str(binary_password)])
    _assert_one_line(result, binary_password)
    assert not (tmp_path / "keys" / "k.json").exists()


def test_keys_show_unlock(tmp_path, binary_password):
    info = create_keystore("k", "pw", directory=tmp_path / "keys", cost=KdfCost.FAST)
    result = CliRunner().invoke(cli, ["keys", "show", str(info.path), "--unlock", "--password-file",
                                      str(binary_password)])
    _assert_one_line(result, binary_password)


def test_role_init(tmp_path, binary_password):
    pytest.importorskip("krill.worker")
    result = CliRunner().invoke(cli, ["worker", "init", "--rpc-url", "http://127.0.0.1:1", "--protocol", "0x" + "00" * 20,
                                      "--keystore", str(tmp_path / "keys" / "w.json"), "--password-file",
                                      str(binary_password), "--out", str(tmp_path / "w.toml")])
    _assert_one_line(result, binary_password)
