"""What `krill demo` creates its run and configures its workers with."""

from krill.demo.orchestrate import DEMO_SPEC, FRESH_DEADLINE_S, DemoConfig, demo_spec, role_settings


def test_fresh_gradients_close_a_version_on_every_honest_workers_one_commit():
    config = DemoConfig(workers=4, adversaries=1)
    spec = demo_spec(config)
    assert spec["version"] == {"contributions": 3, "deadline_s": FRESH_DEADLINE_S}
    assert spec["rollout"] == DEMO_SPEC["rollout"] and spec["chain"] == DEMO_SPEC["chain"]
    assert role_settings(config, "worker") == {"max_per_version": 1, "sample_ahead": True}
    assert role_settings(config, "verifier") == {"nice": 10}  # the verifiers give way to the critical path
    assert role_settings(DemoConfig(verifier_nice=0), "verifier") == {}


def test_the_callers_spec_overrides_win_field_by_field():
    config = DemoConfig(workers=3, adversaries=1, spec_overrides={
        "version": {"deadline_s": 5.0}, "chain": {"check_probability_ppm": 1_000_000}, "eval_n": 20})
    spec = demo_spec(config)
    assert spec["version"] == {"contributions": 2, "deadline_s": 5.0}
    assert spec["chain"] == {**DEMO_SPEC["chain"], "check_probability_ppm": 1_000_000}
    assert spec["eval_n"] == 20
    assert demo_spec(DemoConfig(workers=1, adversaries=1))["version"]["contributions"] == 1


def test_pipelined_demo_keeps_the_specs_close_rule_and_two_commits_per_version():
    config = DemoConfig(fresh_gradients=False)
    assert "version" not in demo_spec(config)
    assert role_settings(config, "worker") == {}


def test_a_role_lowers_its_cpu_priority_by_its_nice_setting():
    import os
    import subprocess
    import sys

    import pytest
    from pydantic import ValidationError

    from krill.config import VerifierConfig

    if not hasattr(os, "nice"):
        pytest.skip("no os.nice on this platform")
    probe = ("import os, torch; from krill.config import VerifierConfig; from krill.runtime import apply_cpu_settings; "
             "b = os.nice(0); apply_cpu_settings(VerifierConfig(threads=1, nice={})); "
             "print(os.nice(0) - b, torch.get_num_threads())")
    for nice, expected in ((0, "0 1"), (5, "5 1")):
        out = subprocess.run([sys.executable, "-c", probe.format(nice)], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == expected
    assert VerifierConfig(nice=10).nice == 10 and VerifierConfig().nice == 0
    with pytest.raises(ValidationError, match="nice"):
        VerifierConfig(nice=20)


def test_the_demo_releases_auditing_only_its_last_versions(tmp_path):
    from krill.demo.orchestrate import release_args

    cfg, out = tmp_path / "coordinator.toml", tmp_path / "release"
    args = release_args(DemoConfig(), cfg, 400, out)
    assert args[:9] == ["--config", str(cfg), "release", "--version", "400", "--out", str(out), "--json",
                        "--audit-last"] and args[9:] == ["3"]
    assert release_args(DemoConfig(audit_last=7, release_eval_n=20), cfg, 9, out)[8:] == [
        "--audit-last", "7", "--eval-n", "20"]
    assert release_args(DemoConfig(audit_last=0), cfg, 9, out)[8:] == ["--unaudited"]  # no audit at all
