import json
import math

import pytest
from click.testing import CliRunner

from krill.bench.rl_compare import crossing_time, protocol_times, summarise, time_to, trl_available
from krill.commands.bench_cmd import bench


def _run(system: str, seed: int, curve: list, steps_per_min: float = 60.0) -> dict:
    return {"system": system, "seed": seed, "curve": curve, "steps_per_min": steps_per_min,
            "steps_per_cpu_min": steps_per_min / 2, "final_accuracy": curve[-1][3], "base_accuracy": curve[0][3]}


def test_time_to_target_is_the_first_checkpoint_at_or_above_it():
    curve = [[0, 0.0, 0.0, 0.2], [10, 15.0, 14.0, 0.41], [20, 30.0, 29.0, 0.38], [30, 45.0, 44.0, 0.5]]
    assert time_to(curve, 0.4) == 15.0 and time_to(curve, 0.5) == 45.0 and time_to(curve, 0.6) is None
    assert time_to(curve, 0.2) == 0.0


def test_the_crossing_is_read_between_the_evaluations_around_it():
    curve = [[0, 0.0, 0.0, 0.2], [10, 15.0, 14.0, 0.41], [20, 30.0, 29.0, 0.38], [30, 45.0, 44.0, 0.5]]
    # 0.3 lies 10/21 of the way from 0.2 (0 s) to 0.41 (15 s); 0.45 between 0.38 (30 s) and 0.5 (45 s)
    assert crossing_time(curve, 0.3) == pytest.approx(15.0 * 10 / 21)
    assert crossing_time(curve, 0.45) == pytest.approx(30.0 + 15.0 * 0.07 / 0.12)
    assert crossing_time(curve, 0.5) == 45.0 and crossing_time(curve, 0.6) is None
    assert crossing_time(curve, 0.2) == 0.0 and crossing_time(curve[1:], 0.3) == 15.0  # the first evaluation
    for target in (0.3, 0.4, 0.45, 0.5):  # never after the first evaluation at or above it
        assert crossing_time(curve, target) <= time_to(curve, target)


def test_medians_count_unreached_targets_as_slowest_and_ratios_divide_medians():
    krill = [_run("krill", 0, [[0, 0, 0, 0.2], [9, 20.0, 0, 0.5]], 30.0),
             _run("krill", 1, [[0, 0, 0, 0.2], [9, 40.0, 0, 0.5]], 40.0),
             _run("krill", 2, [[0, 0, 0, 0.2], [9, 60.0, 0, 0.3]], 50.0)]
    trl = [_run("trl", s, [[0, 0, 0, 0.2], [9, 10.0 * (s + 1), 0, 0.6]], 100.0) for s in range(3)]
    out = summarise(krill + trl, (0.5, 0.9))
    assert out["krill"]["time_to"] == {"0.5": 40.0, "0.9": None}
    assert out["krill"]["reached"] == {"0.5": 2, "0.9": 0}
    assert out["trl"]["time_to"]["0.5"] == 20.0
    assert out["krill_over_trl"]["time_to"] == {"0.5": 2.0, "0.9": None}
    # read between evaluations: krill's three runs cross 0.5 at 20, 40 and never; TRL's at 10 x (s + 1) x 0.75
    assert out["krill"]["crossing"] == {"0.5": 40.0, "0.9": None}
    assert out["trl"]["crossing"]["0.5"] == pytest.approx(15.0)
    assert out["krill_over_trl"]["crossing"]["0.5"] == pytest.approx(40.0 / 15.0)
    assert out["krill"]["steps_to"]["0.5"] == 9 and out["krill_over_trl"]["steps_to"]["0.5"] == 1.0
    assert out["krill_over_trl"]["steps_per_min"] == 0.4
    assert math.isclose(out["krill_over_trl"]["final_accuracy"], 0.5 / 0.6)
    # Most runs not reaching a target: the median is "not reached", not the one run that did.
    assert summarise([krill[0], krill[2], krill[2]], (0.5,))["krill"]["time_to"]["0.5"] is None
    assert "krill_over_trl" not in summarise(krill, (0.5,))


def test_trl_reward_is_the_tasks_strict_reward_on_the_completion_ids():
    from krill.bench.rl_trl import task_reward
    from krill.model.tokenizer import build_char_tokenizer
    from krill.rl.tasks import get_task

    task, tok = get_task("arithmetic"), build_char_tokenizer()
    _, meta = task.prompt(7, "train")
    answer = tok(task.reference(meta), add_special_tokens=False)["input_ids"]
    eos = tok.eos_token_id
    means: list[float] = []
    reward = task_reward(task, tok, means)
    got = reward(prompts=["p"] * 3, completions=["c"] * 3, meta=[json.dumps(meta)] * 3,
                 completion_ids=[answer + [eos], answer[:-1] + [eos], answer + answer[:1] + [eos]])
    assert got == [1.0, 0.0, 0.0] and means == [1 / 3]


def _demo_db(path, rows: list, evals: list):
    """A demo database holding only what `protocol_times` reads: metrics rows and evaluations."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from krill.db.models import Eval, Metric, StateBase

    engine = create_engine(f"sqlite:///{path}")
    StateBase.metadata.create_all(engine)
    with Session(engine) as s:
        for v, seconds, extra in rows:
            s.add(Metric(run_id="ab" * 32, version=v, accepted=1, rejected=0, wall_seconds=seconds, extra=extra))
        for v, acc in evals:
            s.add(Eval(run_id="ab" * 32, version=v, task="arithmetic:1", split="eval", n=20, correct=round(20 * acc),
                       accuracy=acc))
        s.commit()
    engine.dispose()
    return path


def test_protocol_times_sum_the_coordinators_clock_from_version_one_less_evaluation(tmp_path):
    # Version 1 (set-up: the workers' start-up) has no clock reading; version 3's whole block seconds
    # stand in for a missing one; version 2 and 4 spent part of their seconds evaluating. Net of the
    # evaluations: 2.0, 4.0, 1.0 s; an ordinary version (not right after an evaluated one: 2 and 4) is
    # the median 1.5 s, charged for version 1's own step; version 3 follows an evaluation and is charged
    # at least that (4.0 s already is).
    rows = [(1, 26.0, None), (2, 3.0, {"clock_seconds": 2.5, "phases": {"eval": 0.5}}), (3, 4.0, {"phases": {}}),
            (4, 1.0, {"clock_seconds": 1.25, "phases": {"eval": 0.25, "index": 0.1}})]
    db = _demo_db(tmp_path / "krill.db", rows, [(0, 0.2), (2, 0.35), (4, 0.45)])
    p = protocol_times(db, (0.3, 0.4, 0.5))
    assert p["versions"] == 4 and p["seconds"] == 8.5
    assert p["setup_seconds"] == 26.0 and p["eval_seconds"] == 0.75
    assert p["curve"] == [[0, 0.0, None, 0.2], [2, 3.5, None, 0.35], [4, 8.5, None, 0.45]]
    assert p["time_to"] == {"0.3": 3.5, "0.4": 8.5, "0.5": None}
    assert p["crossing"]["0.3"] == pytest.approx(3.5 * 0.1 / 0.15) and p["crossing"]["0.5"] is None
    assert p["crossing"]["0.4"] == pytest.approx(3.5 + 5.0 * 0.5)
    assert p["contributions_per_version"] == 1 and p["prompts_per_contribution"] is None  # no spec.toml beside it
    assert p["seed"] is None and p["workers"] is None
    (tmp_path / "spec.toml").write_text("[rollout]\nprompts_per_contribution = 16\n")
    p = protocol_times(db, (0.3,))
    assert (p["contributions_per_version"], p["prompts_per_contribution"], p["group_size"]) == (1, 16, 8)
    assert p["seed"] == 0  # the spec's default where the overrides name none
    (tmp_path / "spec.toml").write_text("seed = 2\n[rollout]\nprompts_per_contribution = 16\n")
    (tmp_path / "summary.json").write_text(json.dumps({"workers": [
        {"name": "worker-0", "behavior": "honest"}, {"name": "worker-1", "behavior": "honest"},
        {"name": "worker-2", "behavior": "forge-rewards"}]}))
    p = protocol_times(db, (0.3,))
    assert p["seed"] == 2 and p["workers"] == {"honest": 2, "attacking": 1}


def test_several_demos_give_the_median_time_and_each_demos_row(tmp_path):
    from krill.bench.rl_compare import protocol_summary
    from krill.commands.bench_rl import _protocol_md

    rows = [(1, 20.0, None)] + [(v, 1.0, {"clock_seconds": 1.0}) for v in range(2, 8)]
    dbs = [_demo_db(tmp_path / f"demo{i}.db", rows, [(0, 0.2), (v30, 0.3), (v40, 0.4)])
           for i, (v30, v40) in enumerate([(3, 7), (5, 6), (2, 4)])]
    demos = [protocol_times(db, (0.3, 0.4, 0.5)) for db in dbs]
    p = protocol_summary(demos, (0.3, 0.4, 0.5))
    # version v is v s on the clock (version 1's own step an ordinary 1 s); a target no demo reached has no median
    assert [d["time_to"]["0.3"] for d in demos] == [3.0, 5.0, 2.0] and p["time_to"]["0.3"] == 3.0
    assert p["time_to"]["0.4"] == 6.0 and p["time_to"]["0.5"] is None
    assert p["reached"] == {"0.3": 3, "0.4": 3, "0.5": 0} and p["runs"] == 3
    md = "\n".join(_protocol_md({"protocol": p, "summary": {"trl": {"time_to": {"0.3": 4.0, "0.4": 4.0, "0.5": 9.0}}}}))
    assert "## Full protocol (3 `krill demo` runs)" in md and f"- demo 2: {dbs[1]}: 7 versions in 7 s" in md
    demos[0].update(seed=1, workers={"honest": 3, "attacking": 0})
    seeded = "\n".join(_protocol_md({"protocol": protocol_summary(demos, (0.3,)), "summary": {"trl": None}}))
    assert f"- demo 1: {dbs[0]} (run seed 1, 3 honest worker(s), 0 attacking): 7 versions in 7 s" in seeded
    assert "| 30% | 3 | 5 | 2 | 3 | 4 | 0.75 |" in md and "| 40% | 7 | 6 | 4 | 6 | 4 | 1.50 |" in md
    assert "| 50% | - | - | - | - | 9 | - |" in md
    # the crossings: each demo reaches 0.3 and 0.4 exactly at an evaluation, so they read as above
    assert p["crossing"] == {"0.3": 3.0, "0.4": 6.0, "0.5": None}
    assert "| 30% | 3.0 | 5.0 | 2.0 | 3.0 | - | - |" in md  # a TRL summary written before the figure existed
    md = "\n".join(_protocol_md({"protocol": p, "summary": {"trl": {"time_to": {}, "crossing": {"0.3": 2.4}}}}))
    assert "| 30% | 3.0 | 5.0 | 2.0 | 3.0 | 2.4 | 1.25 |" in md and "| 50% | - | - | - | - | - | - |" in md


def test_tiny_size_writes_every_figure(tmp_path):
    # The CI smoke test: the Krill side always; the TRL side when the `bench` extra is installed.
    result = CliRunner().invoke(bench, ["rl", "--tiny", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "rl-tiny.json").read_text())
    assert json.loads(result.stdout) == data
    assert data["machine"]["cpu_count"] >= 1 and data["machine"]["versions"]["torch"]
    systems = ["krill", "trl"] if trl_available() else ["krill"]
    assert [r["system"] for r in data["runs"]] == systems * data["settings"]["seeds"]
    for run in data["runs"]:
        assert run["steps"] == data["settings"]["max_steps"]
        assert run["curve"][0][:3] == [0, 0.0, 0.0] and run["curve"][-1][0] == run["steps"]
        assert all(0.0 <= row[3] <= 1.0 for row in run["curve"])
        assert run["train_seconds"] > 0 and run["steps_per_min"] > 0 and run["load_start"] >= 0
    assert set(data["summary"]) == ({"krill", "trl", "krill_over_trl"} if trl_available() else {"krill"})
    assert (data["trl_note"] is None) == trl_available()
    md = (tmp_path / "rl-tiny.md").read_text()
    assert "Machine: " in md and "| optimizer steps per minute |" in md and "## Runs" in md
    assert "| training seconds to 30%, read between evaluations |" in md
    assert (tmp_path / "rl-tiny.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("why", ["--skip-trl", "not installed"])
def test_tiny_size_without_trl_says_so(tmp_path, monkeypatch, why):
    import krill.bench.rl_compare

    args = ["rl", "--tiny", "--out", str(tmp_path)]
    if why == "--skip-trl":
        args.append("--skip-trl")
    else:
        monkeypatch.setattr(krill.bench.rl_compare, "trl_available", lambda: False)
    result = CliRunner().invoke(bench, args)
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "rl-tiny.json").read_text())
    assert [r["system"] for r in data["runs"]] == ["krill"] and why in data["trl_note"]
    assert "TRL: skipped" in (tmp_path / "rl-tiny.md").read_text()


def test_the_shared_note_reads_what_other_processes_used_during_the_runs_not_the_load_before():
    """The 1-minute load average at a run's start still counts the demos `bench rl` ran just before: it said
    'shared' of runs during which other processes used 0.01 cores."""
    from krill.commands.bench_rl import shared_note

    def result(others: float, load: float) -> dict:
        return {"machine": {"usable_cpus": 2}, "runs": [{"other_cores_busy": others, "load_start": load}] * 3}

    assert shared_note(result(0.01, 3.6)) is None
    assert "other processes used 0.50 of 2 cores" in shared_note(result(0.5, 0.2))
