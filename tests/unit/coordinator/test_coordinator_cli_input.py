"""`krill coordinator` flags checked where they are parsed: `create-run --fund` (a float that took `nan`, `inf`
and negative amounts) and `run --shards` (which let a negative shard through to the opened run)."""

from __future__ import annotations

import contextlib

import pytest
from click.testing import CliRunner

from krill.cli import cli


@pytest.fixture
def stubbed(tmp_path, monkeypatch):
    """create-run with keystore, chain and store stubbed; the fund that reaches `create_run` is recorded."""
    import krill.coordinator.create_run as create_run_module
    import krill.runtime as runtime

    monkeypatch.setenv("KRILL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KRILL_CONFIG", raising=False)
    monkeypatch.setattr(runtime, "unlock_identity", lambda config, *a, **k: type("Identity", (), {"account": None})())
    monkeypatch.setattr(runtime, "connect_chain", lambda *a, **k: object())
    monkeypatch.setattr(runtime, "open_configured_store", lambda *a, **k: contextlib.nullcontext(object()))
    funds = []

    def create_run(chain, store, model_dir, **kwargs):
        funds.append(kwargs["fund"])
        return create_run_module.CreatedRun("ab" * 32, "n", "cid", "spec", 2, "0x0", kwargs["fund"] or 0, 1)

    monkeypatch.setattr(create_run_module, "create_run", create_run)
    return tmp_path, funds


@pytest.mark.parametrize("fund", ["nan", "inf", "-5", "-0.000001", "1e-19", "lots"])
def test_a_bad_fund_is_refused_naming_it_before_anything_happens(stubbed, fund):
    tmp_path, funds = stubbed
    result = CliRunner().invoke(cli, ["coordinator", "create-run", "--model", str(tmp_path), "--fund", fund])
    assert result.exit_code == 2, (result.output, result.exception)
    assert "--fund" in result.output and repr(fund) in result.output
    assert funds == []


@pytest.mark.parametrize(("fund", "units"), [("0", 0), ("12.3", 12_300_000_000_000_000_000),
                                             ("0.5", 500_000_000_000_000_000), ("20000", 20_000 * 10**18)])
def test_a_fund_in_tokens_reaches_create_run_exactly(stubbed, fund, units):
    tmp_path, funds = stubbed
    result = CliRunner().invoke(cli, ["coordinator", "create-run", "--model", str(tmp_path), "--fund", fund])
    assert result.exit_code == 0, (result.output, result.exception)
    assert funds == [units]


def test_a_negative_shard_is_refused_before_the_run_is_opened(tmp_path, monkeypatch):
    import krill.coordinator.context as context

    monkeypatch.setenv("KRILL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KRILL_CONFIG", raising=False)
    opened = []
    monkeypatch.setattr(context, "open_run_context", lambda *a, **k: opened.append(a) or pytest.fail("opened"))
    result = CliRunner().invoke(cli, ["coordinator", "run", "--shards", "0,-1"])
    assert result.exit_code == 2, (result.output, result.exception)
    assert "--shards" in result.output and "shard numbers start at 0, got [-1]" in result.output
    assert opened == []
