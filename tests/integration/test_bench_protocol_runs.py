"""Issue 8's demo-based benchmarks at their tiny size: protocol, verify, scale and latency (Anvil, real processes).

Each runs a `krill demo` of under a minute of training on a tiny random model (about 80 s with
set-up on 2 cores), so the module is marked slow; the figures come from the default-size runs.
The in-process benchmarks and the analyses are tested in tests/unit/bench/test_bench_protocol_suite.py.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from krill.commands.bench_cmd import bench

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def _run(tmp_path, name: str) -> dict:
    result = CliRunner().invoke(bench, [name, "--tiny", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for suffix in (".json", ".md", ".png"):
        assert (tmp_path / f"{name}-tiny{suffix}").stat().st_size > 0
    data = json.loads((tmp_path / f"{name}-tiny.json").read_text())
    assert data["machine"]["cpu_count"] >= 1 and len(data["loadavg_start"]) == len(data["loadavg_end"]) == 3
    return data


def test_protocol_tiny_breaks_down_worker_and_coordinator_time(tmp_path):
    data = _run(tmp_path, "protocol")
    w, c = data["worker"], data["coordinator"]
    assert w["contributions"] >= 2 and w["busy_seconds"] > 0 and w["waiting_seconds"] >= 0
    parts = {row["part"]: row for row in w["parts"]}
    for part in ("rollout", "reward", "gradient"):
        assert parts[part]["seconds"] > 0, part
    # The worker packages, saves and submits in the background while it makes the next one: those parts
    # are overlapped.
    assert w["pipelined"] >= 1 and w["overlapped_seconds"] > 0
    for part in ("compress", "hash_sign", "save", "upload", "chain_tx", "chain_confirm"):
        assert parts[part]["seconds"] + parts[part]["overlapped_seconds"] > 0, part
    assert sum(row["seconds"] for row in w["parts"]) == pytest.approx(w["busy_seconds"], rel=1e-6)
    assert 0 < w["overhead_pct"] < 100 and isinstance(w["target_met"], bool)
    assert c["versions"] >= 1
    medians = {row["part"]: row["median_ms"] for row in c["parts"]}
    for part in ("fetch", "validate", "aggregate", "optimizer", "store", "publish_tx", "wall"):
        assert medians[part] is not None and medians[part] > 0, part
    assert c["bytes_received_per_version"] > 0 and c["bytes_published_per_version"] > 0


def test_verify_tiny_compares_every_check_stage_with_the_workers_cost(tmp_path):
    data = _run(tmp_path, "verify")
    assert data["checked"] >= 1 and data["failed"] == 0 and data["joined"] >= 1
    stages = {row["stage"]: row for row in data["stages"]}
    for stage in ("signature", "payload", "assignment", "rewards", "resample", "gradient", "replay checks"):
        assert stages[stage]["median_ms"] is not None and stages[stage]["median_pct_of_worker"] is not None, stage
    assert data["replay_pct"] > 0 and isinstance(data["target_met"], bool)
    assert [a["p"] for a in data["amortised"]] == [0.1, 0.25]
    loads = data["model_loads"]
    assert loads["loads"] >= 1 and loads["checks_that_loaded"] >= 1 and loads["median_ms"] > 0
    assert stages["replay checks"]["median_ms_without_model_load"] <= stages["replay checks"]["median_ms"]
    assert data["floor"]["replay_pct"] > 0 and data["floor"]["settings"]["num_shards"] == 2
    assert [r["max_new_tokens"] for r in data["floor_by_length"]] == [2, 4]
    assert all(r["replay_pct"] > 0 for r in data["floor_by_length"])


def test_scale_tiny_measures_throughput_lag_and_memory(tmp_path):
    data = _run(tmp_path, "scale")
    (point,) = data["points"]
    assert point["workers"] == 2 and point["accepted"] >= 1 and point["accepted_per_s"] > 0
    assert point["coordinator_wall_s_per_version"] > 0 and point["index_lag_s_median"] is not None
    # the 45-s budget starts once version 1 is out, so the roles' start-up (about 10 s here) is not in it
    assert point["commit_window_s"] >= 40, point
    memory = point["memory_mib"]
    assert memory["worker"]["processes"] == 2 and memory["coordinator"]["max_mib"] > 50
    assert memory["verifier"]["max_mib"] > 50
    assert {g["figure"] for g in data["growth"]} >= {"accepted_per_s", "index_lag_s_median", "coordinator_mib"}


def test_latency_tiny_runs_workers_and_verifier_through_a_lagging_link(tmp_path):
    data = _run(tmp_path, "latency")
    (point,) = data["points"]
    assert point["stopped"] is None and point["link"] == "100 ± 20 ms one way"
    assert point["versions"] >= 2 and point["versions_per_min"] > 0
    assert point["accepted"] >= 1 and point["rejected_by_reason"].get("wrong_rewards", 0) >= 1  # the forger
    assert point["verifier"]["attested"] + point["verifier"]["pending"] + point["verifier"]["skipped"] >= 1
    worker, verifier = point["links"]["worker"], point["links"]["verifier"]
    # Every worker and the verifier reached the node through the proxies, the workers' head waiters too.
    assert worker["methods"]["eth_chainId"] >= 3 and verifier["methods"]["eth_chainId"] >= 1
    assert worker["websockets"] >= 3 and worker["unparsed"] == verifier["unparsed"] == 0
    per = point["worker_requests_per_commit"]
    assert per["commits"] >= 2 and 0.8 <= per["methods"]["eth_sendRawTransaction"] <= 1.2  # one commit each
    assert per["total"] > per["methods"]["eth_sendRawTransaction"]
