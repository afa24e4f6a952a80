"""`krill calibrate`: honest work measured in-process, the margin rule, the table, and the verifier loading it."""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from krill.calibration.measure import Plan, measure
from krill.calibration.table import (
    HonestCheck,
    build_table,
    load_table,
    looser,
    passes,
    tolerances,
    verifier_tolerances,
    write_table,
)
from krill.model.build import TinyModelSpec, build_tiny_model
from krill.protocol.spec import VerifySpec

ROOT = Path(__file__).resolve().parents[3]
TINY = TinyModelSpec(hidden=32, layers=2, heads=2, intermediate=64)
PLAN = Plan(checks=24, batches=(2,), codecs=("fp16", "bf16"), versions=2, group_size=4)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("calibrate") / "model"
    build_tiny_model(seed=3, spec=TINY, directory=path)
    return path


@pytest.fixture(scope="module")
def measured(tiny_model):
    """One small honest calibration. A random model never earns the arithmetic reward (zero advantages,
    zero gradients), so the reward here is a deterministic function of the completion's length:
    worker and verifier agree on it, and groups have reward variance, hence real gradients."""
    from krill.rl.tasks.arithmetic import Arithmetic

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Arithmetic, "reward", lambda self, meta, completion: float(len(completion) % 2))
        threads = torch.get_num_threads()
        records, meta = measure(tiny_model, PLAN)
        assert torch.get_num_threads() == threads  # producer and replayer thread counts are restored
    return records, meta


def test_small_calibration_has_every_condition_and_no_honest_failure(measured):
    from krill.bench_env import machine_facts

    records, meta = measured
    assert len(records) >= PLAN.checks and meta["contributions"] == PLAN.contributions
    conditions = {(c.producer_threads, c.replayer_threads, c.codec) for c in records}
    assert conditions == {(p, r, c) for p in (1, 2) for r in (1, 2) for c in ("fp16", "bf16")}
    assert {c.version for c in records} == {0, 1} and any(c.behaviour_version < c.version for c in records)
    live = [c for c in records if c.stage == "gradient" and not c.zero_gradient]
    assert len(live) >= 8
    # Codec noise is measured, not assumed away: bf16 (8-bit mantissa) is coarser than fp16 (11-bit).
    gap = {codec: max(1 - c.cosine for c in live if c.codec == codec) for codec in ("fp16", "bf16")}
    assert 0 < gap["fp16"] < gap["bf16"] < 1e-3
    table = build_table(records, meta, machine_facts())
    assert table["honest_failures"] == 0 and table["checks"] == len(records)
    assert set(table["verify"]) == set(VerifySpec.model_fields)
    assert set(table["codec"]) == {"fp16", "bf16"}
    assert len(table["distribution"]) == 8
    row = table["distribution"][0]
    for stat in ("token_mismatches", "max_logprob_diff", "teacher_logprob_diff", "one_minus_cosine", "rel_norm_diff"):
        assert set(row[stat]) == {"count", "p50", "p99", "max"}
    for c in records:
        assert passes(c, VerifySpec(**table["codec"][c.codec]["verify"])) and passes(c, VerifySpec(**table["verify"]))


def test_margin_rule_floors_and_token_mismatches():
    base = dict(batch=2, codec="fp16", producer_threads=1, replayer_threads=2, version=0, behaviour_version=0)
    resample = [HonestCheck(stage="resample", max_logprob_diff=2e-6, teacher_logprob_diff=3.1e-6, **base)]
    grads = [HonestCheck(stage="gradient", cosine=1 - 2e-5, rel_norm_diff=4.4e-4, **base),
             HonestCheck(stage="gradient", cosine=0.0, zero_gradient=True, **base)]
    v = tolerances(resample, grads)
    assert v.logprob_abs_tol == 1e-4  # 10 x 3.1e-6 is under the floor
    assert v.grad_min_cosine == pytest.approx(1 - 2e-4)
    assert v.grad_norm_rel_tol == pytest.approx(4.4e-3)
    assert v.exact_resample
    mismatched = HonestCheck(stage="resample", token_mismatches=1, teacher_logprob_diff=3.33e-5, **base)
    v = tolerances(resample + [mismatched], grads)
    assert not v.exact_resample and v.logprob_abs_tol == pytest.approx(3.4e-4)
    assert passes(mismatched, v) and not passes(mismatched, VerifySpec())
    capped = tolerances([], [HonestCheck(stage="gradient", cosine=0.5, **base)])
    assert capped.grad_min_cosine == pytest.approx(0.9)


def test_verifier_applies_the_looser_of_spec_and_table(tmp_path):
    from krill.config import KrillConfig
    from krill.verifier.replay import Replayer

    table = {"format": "krill-calibration/1",
             "verify": {"logprob_abs_tol": 5e-4, "grad_min_cosine": 0.995, "grad_norm_rel_tol": 0.2,
                        "exact_resample": True},
             "codec": {"int8": {"verify": {"logprob_abs_tol": 5e-4, "grad_min_cosine": 0.95,
                                           "grad_norm_rel_tol": 0.3, "exact_resample": False}}}}
    path = write_table(table, tmp_path / "cal.toml")
    spec = SimpleNamespace(verify=VerifySpec(logprob_abs_tol=1e-3, grad_min_cosine=0.999, grad_norm_rel_tol=0.01),
                           compression=SimpleNamespace(dtype="fp16"))
    assert verifier_tolerances(spec, path) == VerifySpec(logprob_abs_tol=1e-3, grad_min_cosine=0.995,
                                                         grad_norm_rel_tol=0.2, exact_resample=True)
    spec.compression = SimpleNamespace(dtype="int8")  # the codec's own section when the table has one
    assert verifier_tolerances(spec, path) == VerifySpec(logprob_abs_tol=1e-3, grad_min_cosine=0.95,
                                                         grad_norm_rel_tol=0.3, exact_resample=False)
    assert looser(spec.verify, spec.verify) == spec.verify
    replayer = Replayer(SimpleNamespace(address="0x" + "ab" * 20), None, spec, b"\x01" * 32, 31337,
                        calibration=KrillConfig(verifier={"calibration": str(path)}).verifier.calibration)
    assert replayer.verify.grad_min_cosine == 0.95
    default = Replayer(SimpleNamespace(address="0x" + "ab" * 20), None, spec, b"\x01" * 32, 31337)
    assert default.verify == looser(spec.verify, load_table().tolerances_for("int8"))


def test_shipped_table_is_honest_package_data_and_matches_the_spec_defaults():
    path = ROOT / "krill" / "protocol" / "calibration.toml"
    data = tomllib.loads(path.read_text())
    assert data["checks"] >= 1000 and data["honest_failures"] == 0
    assert {c["codec"] for c in data["distribution"]} >= {"fp16", "bf16"}
    assert load_table().verify == VerifySpec()
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "calibration.toml" in package_data["krill.protocol"]


def test_cli_writes_the_table(tiny_model, tmp_path):
    from click.testing import CliRunner

    from krill.cli import cli

    out = tmp_path / "cal" / "table.toml"
    result = CliRunner().invoke(cli, ["calibrate", "--out", str(out), "--checks", "1", "--model", str(tiny_model),
                                      "--batches", "2", "--codecs", "fp16", "--threads", "1", "--versions", "1",
                                      "--records", str(tmp_path / "records.jsonl")])
    assert result.exit_code == 0, result.output
    assert "honest failures at these tolerances: 0 of 3" in result.output
    table = load_table(out)
    assert set(table.codec) == {"fp16"}
    assert len((tmp_path / "records.jsonl").read_text().splitlines()) == 3


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--batches", "2,x", "'2,x': give comma-separated integers, e.g. 2,4,8"),
    ("--threads", "0", "'0': give positive integers"),
    ("--codecs", "fp8", "'fp8': choose among fp16, bf16, int8"),
    # Before: a value listed twice was measured twice over, for one entry of the table.
    ("--threads", "2,1,2,1", "'2,1,2,1': 2, 1 given more than once"),
    ("--batches", "4,4", "'4,4': 4 given more than once"),
    ("--codecs", "int8,fp16,int8", "'int8,fp16,int8': int8 given more than once"),
])
def test_cli_names_the_list_option_it_refuses(tmp_path, option, value, message):
    """Before: `Error: Invalid value: '0': give positive integers`, the same for --batches and --threads."""
    from click.testing import CliRunner

    from krill.cli import cli

    (tmp_path / "model").mkdir()
    result = CliRunner().invoke(cli, ["calibrate", "--out", str(tmp_path / "t.toml"), "--model",
                                      str(tmp_path / "model"), option, value])
    assert result.exit_code == 2, result.output
    assert result.output.endswith(f"Error: Invalid value for '{option}': {message}\n"), result.output
    assert not (tmp_path / "t.toml").exists()
