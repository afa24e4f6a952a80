"""The detection benchmark's smoke size, through the real protocol: figures exist and make sense.

The study is run once in the suite, as `krill bench robustness --tiny` runs it (its detection part),
so this one run also checks how the robustness report embeds it (a run of its own cost about 90 s).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from krill.bench.detection import markdown
from krill.commands.bench_cmd import bench

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def test_tiny_robustness_run_reports_every_attack_of_the_detection_study(tmp_path, monkeypatch):
    import tempfile

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the study makes its work directory
    out = tmp_path / "out"
    ran = CliRunner().invoke(bench, ["robustness", "--tiny", "--out", str(out)])
    assert ran.exit_code == 0, ran.output
    assert not list(scratch.glob("krill-detection-*"))  # its demos' chain and store data are removed
    result = json.loads((out / "robustness-tiny.json").read_text())["detection"]
    assert result["size"] == "tiny"
    attacks = result["attacks"]
    assert set(attacks) == {"honest", "forge-rewards", "cherry-pick"}
    assert attacks["honest"]["failed"] == 0 and attacks["honest"]["folded"] > 0, result
    for name in ("forge-rewards", "cherry-pick"):
        a = attacks[name]
        assert a["folded"] == 0, a  # rejected by the coordinator's cheap replay, never applied
        assert a["checked"] == 0 or a["detection_rate"] == 1.0, a
    # Each cheated commit is rejected by the coordinator's cheap replay, or as jailed when a verifier's
    # slash landed before the coordinator's ingest reached it (a race on a loaded machine; the replay
    # rule alone is pinned by tests/integration/verifier/test_fault_enum.py).
    for name, code in (("forge-rewards", "wrong_rewards"), ("cherry-pick", "wrong_assignment")):
        rejected = attacks[name]["rejected_by_coordinator"]
        assert set(rejected) <= {code, "jailed"} and sum(rejected.values()) >= 1, (name, rejected)
    forged = attacks["forge-rewards"]
    if forged["checked"]:
        assert forged["caught_within"]["0.1"]["10"] == pytest.approx(1 - 0.9 ** 10)
    table = markdown(result)
    assert "| forge-rewards |" in table and "k=20" in table
    assert "## Detection\n\n" + table.rstrip() in (out / "robustness-tiny.md").read_text()
