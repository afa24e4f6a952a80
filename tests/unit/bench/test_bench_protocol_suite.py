"""Issue 8's benchmarks: the in-process ones at their tiny size, and the analyses of the demo-based ones.

`krill bench aggregate --tiny` and `krill bench compression --tiny` run here in seconds; the
demo-based ones (protocol, verify, scale) need Anvil and run in
tests/integration/test_bench_protocol_runs.py. Their analyses are checked here on hand-made
records with known answers.
"""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from krill.bench.protocol import coordinator_parts, waiting_gaps, worker_breakdown, worker_parts
from krill.bench.scale import growth
from krill.bench.verify import model_loads, pairs, stage_table
from krill.commands.bench_cmd import bench


def _machine_and_load(data: dict) -> None:
    assert data["machine"]["cpu_count"] >= 1 and data["machine"]["date_utc"]
    assert len(data["loadavg_start"]) == 3 and len(data["loadavg_end"]) == 3


def _files(tmp_path, name: str) -> dict:
    for suffix in (".json", ".md", ".png"):
        assert (tmp_path / f"{name}-tiny{suffix}").stat().st_size > 0
    return json.loads((tmp_path / f"{name}-tiny.json").read_text())


def test_aggregate_tiny_times_every_rule_and_agrees_with_the_references(tmp_path):
    result = CliRunner().invoke(bench, ["aggregate", "--tiny", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    data = _files(tmp_path, "aggregate")
    assert json.loads(result.stdout) == data
    _machine_and_load(data)
    cells = {(row["n"], row["d"]) for row in data["timing"]}
    assert cells == {(8, 4096), (16, 4096)}
    for row in data["timing"]:
        assert row["seconds"] > 0 and math.isfinite(row["vs_mean"])
        assert row["reductions"] == "fixed-tree"  # each rule as a new run's spec gets it, what its coordinator pays
    assert "reductions: fixed-tree" in (tmp_path / "aggregate-tiny.md").read_text()
    assert {row["rule"] for row in data["timing"]} == {"mean", "median", "trimmed-mean", "clip-mix-trim",
                                                        "centered-clipping"}
    assert data["all_agree"] and {row["rule"] for row in data["agreement"]} == {"trimmed-mean", "median"}
    for row in data["agreement"]:
        assert row["vs_numpy"] <= 1e-6
        if data["byzfl_used"] and not row["byzfl_differs_by_definition"]:
            assert row["vs_byzfl"] <= 1e-6
    # Even n: ByzFL's median averages the two middle values; Krill's is the lower one.
    assert any(row["byzfl_differs_by_definition"] for row in data["agreement"] if row["n"] % 2 == 0)


def test_compression_tiny_reports_wire_bytes_and_accuracy_per_setting(tmp_path):
    result = CliRunner().invoke(bench, ["compression", "--tiny", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = _files(tmp_path, "compression")
    _machine_and_load(data)
    rows = {row["setting"]: row for row in data["rows"]}
    default, dense = rows["int8, 25% mask (spec default)"], rows["fp16, dense"]
    for row in rows.values():
        assert 0.0 <= row["accuracy"] <= 1.0 and 0.0 <= row["accuracy_at_budget"] <= 1.0
        assert row["dense_fp32_bytes_per_contribution"] > row["bytes_per_contribution"] > 0
        assert row["bytes_per_version"] == pytest.approx(data["settings"]["workers"] * row["bytes_per_contribution"])
    # fp16 on every coordinate is half of fp32; int8 on a quarter of them is far less.
    assert dense["gradient_ratio_vs_dense"] == pytest.approx(2.0, rel=0.05)
    assert default["gradient_ratio_vs_dense"] > 6
    assert data["budget_bytes"] == pytest.approx(default["bytes_per_version"] * data["settings"]["versions"])
    assert dense["budget_version"] is not None and dense["budget_version"] < data["settings"]["versions"]


def _record(worker, t, total, status="committed", **phases):
    seconds = {"sample": phases.get("rollout", 0) + phases.get("reward", 0), "learn": phases.get("gradient", 0),
               "package": 0.1, "upload": 0.05, "commit": 0.2, "total": total}
    return {"worker": worker, "time": t, "status": status, "seconds": seconds, "phases": phases, "digest": f"{int(t):064d}"}


def test_worker_breakdown_splits_phases_waiting_and_overhead():
    records = [_record("a", 10.0, 5.0, rollout=4.0),  # first contribution: start-up, left out
               _record("a", 14.0, 2.0, rollout=1.2, reward=0.1, gradient=0.3, compress=0.05, hash=0.02, sign=0.01,
                       chain_confirm=0.05),
               _record("a", 20.0, 2.0, rollout=1.2, reward=0.1, gradient=0.3, compress=0.05, hash=0.02, sign=0.01,
                       chain_confirm=0.05)]
    assert waiting_gaps(records) == {1: pytest.approx(2.0), 2: pytest.approx(4.0)}
    parts = worker_parts(records[1])
    assert parts["hash_sign"] == pytest.approx(0.03) and parts["chain_tx"] == pytest.approx(0.15)
    assert sum(parts.values()) == pytest.approx(2.0)
    w = worker_breakdown(records)
    assert w["contributions"] == 2 and w["first_contribution_seconds"] == 5.0
    assert w["busy_seconds"] == pytest.approx(4.0) and w["waiting_seconds"] == pytest.approx(6.0)
    assert w["overhead_pct"] == pytest.approx(100 * (2.0 - 1.6) / 2.0)
    assert w["target_met"] is False


def test_coordinator_parts_split_ingest_and_publish():
    row = {"version": 2, "accepted": 4, "wall_seconds": 3.0,
           "phases": {"index": 0.1, "ingest": 0.5, "fetch": 0.1, "validate": 0.2, "replay": 0.1, "close": 0.05,
                      "publish": 0.6, "aggregate": 0.2, "optimizer": 0.1, "store": 0.1, "publish_tx": 0.1,
                      "settle": 0.1}}
    parts = coordinator_parts(row)
    assert parts["ingest_other"] == pytest.approx(0.1) and parts["publish_other"] == pytest.approx(0.1)
    assert parts["busy"] == pytest.approx(1.35) and parts["wall"] == 3.0
    assert coordinator_parts(row | {"clock_seconds": 0.42})["wall"] == 0.42  # the coordinator's clock, when recorded
    assert coordinator_parts({"version": 3, "accepted": 1}) is None


def test_verify_stages_are_joined_to_the_workers_cost_by_digest():
    records = [_record("a", 1.0, 2.0, rollout=1.0, gradient=0.4)]
    evidence = [{"commit_id": 1, "digest": records[0]["digest"], "ok": True,
                 "checks": [{"name": n, "ms": ms} for n, ms in (("signature", 1), ("payload", 5), ("assignment", 2),
                                                               ("rewards", 3), ("resample", 100), ("gradient", 40))]},
                {"commit_id": 2, "digest": "f" * 64, "ok": True, "checks": []}]
    joined = pairs(evidence, records)
    assert len(joined) == 1 and joined[0]["worker_ms"] == pytest.approx(1500.0)
    table = {row["stage"]: row for row in stage_table(joined)}
    assert table["replay checks"]["median_ms"] == 145
    assert table["replay checks"]["median_pct_of_worker"] == pytest.approx(100 * 145 / 1500)
    assert table["resample"]["worker_counterpart_median_ms"] == pytest.approx(1000.0)
    assert table["replay checks"]["median_ms_without_model_load"] == 145  # nothing was loaded


def test_verify_tells_the_once_per_version_model_load_from_the_check():
    records = [_record("a", 1.0, 2.0), _record("b", 2.0, 2.0)]
    checks = [[("resample", 100, {"model_load_ms": "12.5"}), ("gradient", 40, {"model_load_ms": "7.5"})],
              [("resample", 80, {}), ("gradient", 40, {})]]
    evidence = [{"commit_id": i, "digest": r["digest"], "ok": True,
                 "checks": [{"name": n, "ms": ms, "figures": f} for n, ms, f in c]}
                for i, (r, c) in enumerate(zip(records, checks, strict=True))]
    joined = pairs(evidence, records)
    table = {row["stage"]: row for row in stage_table(joined)}
    assert table["replay checks"]["median_ms"] == pytest.approx(130.0)  # (140 + 120) / 2
    assert table["replay checks"]["median_ms_without_model_load"] == pytest.approx(120.0)  # (120 + 120) / 2
    assert table["resample"]["median_ms_without_model_load"] == pytest.approx((87.5 + 80) / 2)
    assert model_loads(joined) == {"checks_that_loaded": 1, "loads": 2, "median_ms": 10.0}


def test_growth_exponents_read_flat_and_linear():
    points = [{"workers": n, "accepted_per_s": 3.0, "coordinator_wall_s_per_version": 0.5 * n,
               "memory_mib": {"worker": {"total_mib": 400.0 * n}}} for n in (4, 8, 16, 32)]
    g = {row["figure"]: row for row in growth(points)}
    assert g["accepted_per_s"]["reading"] == "flat" and g["accepted_per_s"]["exponent"] == pytest.approx(0.0)
    assert g["coordinator_wall_s_per_version"]["reading"] == "linear"
    assert g["worker_total_mib"]["exponent"] == pytest.approx(1.0)
    assert g["index_lag_s_median"]["reading"] == "not enough points"


def _pipelined(t, total, foreground, **phases):
    """A record of worker "a" that handed its submission to the background after `foreground` seconds."""
    r = _record("a", t, total, **phases)
    r["seconds"]["foreground"] = foreground
    return r


def test_a_pipelined_workers_upload_and_commit_are_overlapped_not_busy():
    # Each contribution: 1.2 s on the critical path (1.0 RL, 0.1 chain read, 0.05 waiting for the previous
    # commit, 0.05 unnamed), then 0.35 s of save, upload and commit in the background.
    records = [_pipelined(10.0, 5.0, 4.5, rollout=4.0),
               _pipelined(11.6, 1.45, 1.2, rollout=0.8, gradient=0.2, chain_read=0.1, wait_submit=0.05,
                         save=0.1, chain_confirm=0.05),
               _pipelined(14.0, 1.45, 1.2, rollout=0.8, gradient=0.2, chain_read=0.1, wait_submit=0.05,
                         save=0.1, chain_confirm=0.05)]
    parts = worker_parts(records[1])
    assert parts["other"] == pytest.approx(0.05) and parts["upload"] == 0.05
    assert parts["chain_tx"] == pytest.approx(0.15)
    # Starts at 5.0, 10.15 and 12.55; critical paths end at 9.5 and 11.35.
    assert waiting_gaps(records) == {1: pytest.approx(0.65), 2: pytest.approx(1.2)}
    w = worker_breakdown(records)
    assert w["busy_seconds"] == pytest.approx(2.4) and w["pipelined"] == 2
    assert w["overlapped_seconds"] == pytest.approx(0.7)
    assert w["overhead_pct"] == pytest.approx(100 * 0.2 / 1.2)
    rows = {row["part"]: row for row in w["parts"]}
    assert rows["chain_tx"]["seconds"] == 0 and rows["chain_tx"]["overlapped_seconds"] == pytest.approx(0.3)
    assert rows["wait_submit"]["seconds"] == pytest.approx(0.1) and rows["save"]["overlapped_seconds"] == 0.2


def test_a_sampled_ahead_contributions_wait_for_the_next_version_is_waiting_not_busy():
    # The second contribution: 1.0 s of RL work, 0.05 s unnamed, and 0.6 s waiting for the next version
    # between its rollouts and its gradient.
    records = [_pipelined(10.0, 5.0, 4.5, rollout=4.0),
               _pipelined(12.0, 1.95, 1.65, rollout=0.8, gradient=0.2, wait_version=0.6, chain_confirm=0.05)]
    parts = worker_parts(records[1])
    assert parts["other"] == pytest.approx(0.05)
    w = worker_breakdown(records)
    assert w["busy_seconds"] == pytest.approx(1.05)
    # Gap: starts at 5.0 and 10.05, the first's main-loop time ends at 9.5; plus the 0.6 s version wait.
    assert w["waiting_seconds"] == pytest.approx(0.55 + 0.6)
    assert w["overhead_pct"] == pytest.approx(100 * 0.05 / 1.05)


def test_a_pipelined_workers_packaging_is_overlapped_and_an_inline_workers_is_busy():
    pipelined = [_pipelined(10.0, 5.0, 4.5, rollout=4.0),
                 _pipelined(12.0, 1.3, 1.05, rollout=0.8, gradient=0.2, compress=0.03, hash=0.01, sign=0.01,
                            encode_rollouts=0.01, chain_confirm=0.05)]
    w = worker_breakdown(pipelined)
    rows = {row["part"]: row for row in w["parts"]}
    assert rows["compress"]["seconds"] == 0 and rows["compress"]["overlapped_seconds"] == pytest.approx(0.03)
    assert rows["hash_sign"]["overlapped_seconds"] == pytest.approx(0.02)
    assert w["overhead_pct"] == pytest.approx(100 * 0.05 / 1.05)  # only the unnamed rest is on the critical path
    inline = [_record("a", 10.0, 5.0, rollout=4.0),
              _record("a", 16.0, 1.1, rollout=0.8, gradient=0.2, compress=0.03, hash=0.01, sign=0.01)]
    rows = {row["part"]: row for row in worker_breakdown(inline)["parts"]}
    assert rows["compress"]["seconds"] == pytest.approx(0.03) and rows["hash_sign"]["seconds"] == pytest.approx(0.02)


def test_verify_counts_every_gradient_check_of_a_verdict_that_ran_two():
    # A passing verdict that also recomputed the shard a failing verdict named has two gradient checks:
    # both are the verifier's cost (only the last one's ms, and the first one's model load against it, counted).
    records = [_record("a", 1.0, 2.0, rollout=1.0, gradient=0.4)]
    evidence = [{"commit_id": 1, "digest": records[0]["digest"], "ok": True,
                 "checks": [{"name": "resample", "ms": 100, "figures": {}},
                            {"name": "gradient", "ms": 90, "figures": {"model_load_ms": "10"}},
                            {"name": "gradient", "ms": 40, "figures": {}}]}]
    joined = pairs(evidence, records)
    assert joined[0]["stages_ms"]["gradient"] == 130 and joined[0]["gradient_shards"] == 2
    table = {row["stage"]: row for row in stage_table(joined)}
    assert table["gradient"]["median_ms"] == 130 and table["gradient"]["median_ms_without_model_load"] == 120
    assert table["replay checks"]["median_ms"] == 230
