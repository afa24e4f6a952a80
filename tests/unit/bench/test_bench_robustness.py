import json
import math
import sys
import types

import torch
from click.testing import CliRunner

from krill.bench.robustness_inproc import RULES, SIZES, AttackedTrainer, _config
from krill.commands.bench_cmd import bench


def test_attacked_trainer_appends_byzantine_rows_with_unit_weight(tmp_path):
    from krill.model.build import TinyModelSpec, build_tiny_model

    build_tiny_model(seed=0, spec=TinyModelSpec(hidden=32, layers=2, heads=2, intermediate=64), directory=tmp_path)
    trainer = AttackedTrainer(tmp_path, _config(SIZES["tiny"], 2), "sign-flip", 2)
    rows = torch.tensor([[1.0, -2.0], [3.0, 0.0]])
    x, w = trainer.shard_updates(0, rows, torch.tensor([0.5, 1 / 3], dtype=torch.float64))
    assert torch.equal(x, torch.tensor([[1.0, -2.0], [3.0, 0.0], [-2.0, 1.0], [-2.0, 1.0]]))
    assert torch.equal(w, torch.tensor([0.5, 1 / 3, 1.0, 1.0], dtype=torch.float64))
    clean = AttackedTrainer(tmp_path, _config(SIZES["tiny"], 2))
    assert clean.shard_updates(0, rows, w[:2])[0] is rows


def _unit(x) -> bool:
    return isinstance(x, float) and 0.0 <= x <= 1.0


def _fake_detection(monkeypatch, calls: list):
    module = types.ModuleType("krill.bench.detection")

    def run_detection(size, echo):
        calls.append(size)
        return {"size": size, "attacks": {"lazy": {"detection_rate": 1.0}}}

    module.run_detection = run_detection
    module.markdown = lambda result: "| strategy | detection |\n|---|---|\n| lazy | 1.00 |\n"
    monkeypatch.setitem(sys.modules, "krill.bench.detection", module)


def test_detection_section_is_skipped_with_a_note_when_its_module_is_missing(monkeypatch):
    from krill.commands.bench_robustness import run_detection_part

    monkeypatch.setitem(sys.modules, "krill.bench.detection", None)
    lines = []
    part = run_detection_part("tiny", lines.append)
    assert part["detection"] is None and "skipped" in part["detection_note"] and "skipped" in lines[0]


def test_tiny_size_writes_every_figure(tmp_path, monkeypatch):
    # The detection study (krill.bench.detection) runs whole demos and has its own tests; here a
    # stand-in checks that its result and markdown land in the output.
    calls: list = []
    _fake_detection(monkeypatch, calls)
    result = CliRunner().invoke(bench, ["robustness", "--tiny", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "robustness-tiny.json").read_text())
    assert json.loads(result.stdout) == data
    s = data["settings"]
    assert data["machine"]["cpu_count"] >= 1 and data["machine"]["versions"]["torch"]
    assert _unit(data["base_accuracy"])
    cells = {(r["rule"], r["attack"], r["fraction"]): r for r in data["robustness"]}
    expected = {(rule, None, 0.0) for rule in s["rules"]}
    expected |= {(rule, a, f) for rule in s["rules"] for a in s["attacks"] for f in s["fractions"] if f > 0}
    assert set(cells) == expected
    for (_, attack, _), cell in cells.items():
        assert _unit(cell["accuracy"]) and math.isfinite(cell["reward"]) and cell["seconds"] >= 0
        assert cell["byzantine"] == (0 if attack is None else round(cell["fraction"] * s["workers"]))
    timed = {(r["n"], r["d"], r["rule"]): r for r in data["aggregation_time"]}
    assert set(timed) == {(n, d, rule) for n in s["timing_ns"] for d in s["timing_ds"] for rule in RULES
                          if n * d <= s["timing_max_elements"]}
    assert all(r["seconds"] > 0 and r["repeats"] >= 1 for r in timed.values())
    assert all(r["vs_mean"] == 1.0 for r in timed.values() if r["rule"] == "mean")
    stale = {(r["max_staleness"], r["correction"]): r for r in data["staleness"]}
    assert set(stale) == {(b, c) for b in s["staleness_bounds"] for c in ("truncated-is", "none")}
    assert all(_unit(r["accuracy"]) for r in stale.values())
    assert calls == ["tiny"] and data["detection"]["attacks"]["lazy"]["detection_rate"] == 1.0
    assert {"robustness", "aggregation_time", "staleness", "detection", "total"} <= set(data["seconds"])
    md = (tmp_path / "robustness-tiny.md").read_text()
    for heading in ("## Robustness", "## Time per aggregation", "## Staleness", "## Detection", "| lazy | 1.00 |",
                    "Machine: "):
        assert heading in md
    for name in ("robustness-tiny.png", "robustness-tiny-timing.png", "robustness-tiny-staleness.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
