"""A benchmark's `--out` is checked before the benchmark runs: a path through a file (or a folder that cannot
be written) used to fail when the results were written, after the whole run, with a traceback that lost them."""

from __future__ import annotations

import importlib

import pytest
from click.testing import CliRunner

from krill.cli import cli

# command -> (module holding the run function the command imports, that function's name)
RUNS = {
    "aggregate": ("krill.bench.aggregate", "run_aggregate"),
    "compression": ("krill.bench.compression", "run_compression"),
    "latency": ("krill.bench.latency", "run_latency"),
    "protocol": ("krill.bench.protocol", "run_protocol"),
    "rl": ("krill.bench.rl_compare", "run_compare"),
    "robustness": ("krill.bench.robustness_inproc", "run_inproc"),
    "scale": ("krill.bench.scale", "run_scale"),
    "verify": ("krill.bench.verify", "run_verify"),
}


@pytest.mark.parametrize("command", sorted(RUNS))
def test_out_through_a_file_is_refused_before_the_benchmark_runs(tmp_path, monkeypatch, command):
    module, name = RUNS[command]
    ran = []

    def run(*args, **kwargs):
        ran.append(args)
        raise AssertionError("the benchmark ran although its --out cannot be written")

    monkeypatch.setattr(importlib.import_module(module), name, run)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    out = blocker / "results"
    result = CliRunner().invoke(cli, ["bench", command, "--tiny", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "--out" in result.output and str(out) in result.output and "Not a directory" in result.output
    assert ran == []


def test_out_is_made_before_the_benchmark_runs(tmp_path, monkeypatch):
    out = tmp_path / "new" / "results"
    seen = []

    def run(*args, **kwargs):
        seen.append(out.is_dir())
        raise SystemExit(0)  # stop here: only the order matters

    monkeypatch.setattr(importlib.import_module("krill.bench.aggregate"), "run_aggregate", run)
    result = CliRunner().invoke(cli, ["bench", "aggregate", "--tiny", "--out", str(out)])
    assert result.exit_code == 0 and seen == [True]
    assert list(out.iterdir()) == []  # the write test leaves nothing behind
