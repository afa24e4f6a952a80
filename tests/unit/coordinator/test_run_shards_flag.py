"""`krill coordinator run --shards` is refused as the configuration's `coordinator.shards` is."""

from __future__ import annotations

import pytest
from click.testing import CliRunner


class Opened(Exception):
    pass


@pytest.fixture
def opened(monkeypatch, tmp_path):
    """The shards `run` opens its run context with (the run itself is not started)."""
    import krill.coordinator.context as context

    seen = []

    def open_run_context(config, stack, shards):
        seen.append(shards)
        raise Opened

    monkeypatch.setattr(context, "open_run_context", open_run_context)
    monkeypatch.setenv("KRILL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KRILL_CONFIG", raising=False)
    return seen


@pytest.mark.parametrize(("text", "needle"), [("0,0", "names a shard twice: [0]"), ("1,0,1,2,2", "names a shard twice: [1, 2]"),
                                              (",", "must name at least one shard"), ("a", "expected shard numbers")])
def test_a_flag_the_configuration_would_refuse_is_refused(opened, text, needle):
    from krill.cli import cli

    result = CliRunner().invoke(cli, ["coordinator", "run", "--shards", text])
    assert result.exit_code == 2, result.output
    assert needle in result.output and "--shards" in result.output
    assert opened == []  # refused before anything was opened


def test_a_good_flag_reaches_the_run_context(opened):
    from krill.cli import cli

    result = CliRunner().invoke(cli, ["coordinator", "run", "--shards", "1, 0"])
    assert isinstance(result.exception, Opened), result.output
    assert opened == [[0, 1]]
