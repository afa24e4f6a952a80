"""The detection benchmark's smoke size, through the real protocol: figures exist and make sense."""

from __future__ import annotations

import pytest

from krill.bench.detection import markdown, run_detection

pytestmark = pytest.mark.timeout(300)


def test_tiny_detection_run_reports_every_attack(tmp_path):
    result = run_detection("tiny", echo=lambda line: None, workdir=tmp_path)
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
