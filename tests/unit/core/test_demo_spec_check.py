"""`krill demo --spec`: the spec overrides are checked before anything starts (`krill.demo.orchestrate.check_spec`),
with one-line errors naming the file and the keys; the demo's and the benchmarks' own specs pass."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from krill.errors import ConfigError


@pytest.mark.parametrize("overrides", [
    {}, {"version": {"contributions": 4, "deadline_s": 10.0}, "eval_n": 20},
    {"seed": 3, "version": {"contributions": 2}, "chain": {"check_probability_ppm": 1_000_000}},
    {"compression": {"dense_versions": 2}, "rule": {"type": "trimmed-mean", "trim_fraction": 0.2},
     "limits": {"max_sequences": 128}, "chain": {"max_staleness": 3}, "staleness": {"max_staleness": 3}},
])
def test_the_demos_and_the_benchmarks_specs_pass(overrides):
    from krill.demo.orchestrate import DemoConfig, check_spec

    check_spec(DemoConfig(spec_overrides=overrides))
    check_spec(DemoConfig(spec_overrides=overrides, fresh_gradients=False))


@pytest.mark.parametrize(("overrides", "message"), [
    ({"seedz": 3}, "f.toml: seedz: Extra inputs are not permitted"),
    ({"rollout": {"group_sizes": 4}}, "f.toml: rollout.group_sizes: Extra inputs are not permitted"),
    ({"rule": {"type": "median", "bogus": 1}}, "f.toml: rule.bogus: Extra inputs are not permitted"),
    ({"version": {"contributions": 0}}, "f.toml: version.contributions: Input should be greater than or equal to 1"),
    ({"chain": 5}, "f.toml: `chain` must be a table ([chain] ...), not int"),
    ({"chain": {"max_staleness": 1}, "staleness": {"max_staleness": 2}},
     "f.toml: chain.max_staleness = 1 and staleness.max_staleness = 2 differ"),
    ({"num_shards": 4}, "f.toml: num_shards is set by create-run, remove it"),
])
def test_what_create_run_would_refuse_is_refused_first(overrides, message):
    from krill.demo.orchestrate import DemoConfig, check_spec

    with pytest.raises(ConfigError) as err:
        check_spec(DemoConfig(spec_overrides=overrides), "f.toml")
    assert str(err.value) == message


@pytest.mark.parametrize(("content", "needle"), [
    (b"seedz = 3\n[version]\ncontributionz = 5\n",
     ": version.contributionz: Extra inputs are not permitted; seedz: Extra inputs are not permitted"),
    (b"\xff\xfe[version]\n", " is not valid TOML: not UTF-8 text (invalid start byte at byte 0)"),
])
def test_the_demo_refuses_a_bad_spec_file_before_it_starts(tmp_path, monkeypatch, content, needle):
    import krill.demo.orchestrate as orchestrate
    from krill.cli import cli

    def started(*args, **kwargs):
        raise AssertionError("run_demo started with an invalid spec")

    monkeypatch.setattr(orchestrate, "run_demo", started)
    spec = tmp_path / "f.toml"
    spec.write_bytes(content)
    result = CliRunner().invoke(cli, ["demo", "--spec", str(spec), "--model", str(tmp_path)],
                                env={"KRILL_HOME": str(tmp_path / "home")})
    assert result.exit_code == 1, result.output
    assert result.output.strip() == f"error: --spec {spec}{needle}"
    assert not (tmp_path / "home" / "demo").exists()


def test_run_demo_checks_the_spec_before_anything_starts(tmp_path, monkeypatch):
    """`run_demo` (also the benchmarks' entry) refuses before it makes the work folder."""
    from krill.demo.orchestrate import DemoConfig, run_demo

    monkeypatch.setenv("KRILL_HOME", str(tmp_path / "home"))

    with pytest.raises(ConfigError, match="seedz"):
        run_demo(DemoConfig(spec_overrides={"seedz": 1}), tmp_path / "w", echo=print)
    assert not (tmp_path / "w").exists()
