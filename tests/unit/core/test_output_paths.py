"""Commands that work for minutes or hours and write at the end check where they will write before they start
(`krill.commands.context.output_file` / `output_folder`): a path through a file used to fail at the end with a
traceback, after the calibration, the training run, the audit or the model build was done and lost."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from krill.cli import cli

# (arguments with OUT for the bad path, module and function the command would run first)
CASES = {
    "calibrate --out": (["calibrate", "--model", "{model}", "--out", "OUT"], "krill.calibration.measure", "measure"),
    "calibrate --records": (["calibrate", "--model", "{model}", "--records", "OUT"], "krill.calibration.measure",
                            "measure"),
    "train local --summary": (["train", "local", "--model", "{model}", "--summary", "OUT"], "krill.rl.local_train",
                              "run_local"),
    "release --out": (["release", "--version", "1", "--out", "OUT"], "krill.commands.audit_cmd", "open_public_run"),
    "model init --out": (["model", "init", "--out", "OUT"], "krill.model.base", "ensure_base_model"),
}


@pytest.fixture
def blocked(tmp_path, monkeypatch):
    monkeypatch.setenv("KRILL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KRILL_CONFIG", raising=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    (tmp_path / "model").mkdir()
    return tmp_path, blocker


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_output_path_through_a_file_is_refused_before_the_work(blocked, monkeypatch, case):
    tmp_path, blocker = blocked
    args, module, name = CASES[case]
    started = []
    monkeypatch.setattr(importlib.import_module(module), name,
                        lambda *a, **k: started.append(a) or pytest.fail(f"{case}: the work started"))
    out = blocker / "sub" / "result"
    argv = [a.replace("OUT", str(out)).replace("{model}", str(tmp_path / "model")) for a in args]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 2, (result.output, result.exception)
    option = case.split()[-1]
    assert f"Invalid value for '{option}'" in result.output
    assert f"{blocker} is a file, not a folder" in result.output
    assert started == []


def test_a_folder_that_cannot_be_written_is_refused(blocked, monkeypatch):
    from krill.commands import context

    tmp_path, _ = blocked
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    # A read-only folder (root writes in any other): access(2) says no for it.
    monkeypatch.setattr(context.os, "access", lambda path, mode: Path(path) != locked and real_access(path, mode))
    monkeypatch.setattr(importlib.import_module("krill.rl.local_train"), "run_local",
                        lambda *a, **k: pytest.fail("the training started"))
    result = CliRunner().invoke(cli, ["train", "local", "--model", str(tmp_path / "model"), "--summary",
                                      str(locked / "new" / "s.json")])
    assert result.exit_code == 2 and f"cannot write in {locked}" in result.output


def test_a_new_output_folder_is_checked_not_made(blocked, monkeypatch):
    from krill.commands.context import output_file, output_folder

    tmp_path, _ = blocked
    target = tmp_path / "new" / "deeper"
    assert output_folder(None, None, target) == target and output_file(None, None, target / "f.json")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("role", ["worker", "verifier"])
def test_role_init_refuses_an_out_path_through_a_file_before_making_a_keystore(blocked, role):
    """Before: `krill worker init --out a-file/x.toml` made the keystore, funded it on the devnet, then died
    with a FileExistsError traceback writing the config."""
    tmp_path, blocker = blocked
    (tmp_path / "pw").write_text("pw\n")
    result = CliRunner().invoke(cli, [role, "init", "--devnet", "--keystore", str(tmp_path / "k.json"),
                                      "--password-file", str(tmp_path / "pw"), "--out", str(blocker / "x.toml")])
    assert result.exit_code == 2, (result.output, result.exception)
    assert "Invalid value for '--out'" in result.output and f"{blocker} is a file, not a folder" in result.output
    assert not (tmp_path / "k.json").exists()
