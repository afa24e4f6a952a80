"""`krill bench verify`: a verifier's cost per checked contribution against the worker's cost to make it.

Design decisions:
- Measured on the protocol: a `krill demo` run (`krill.bench.demo_probe`) with honest workers and
  one verifier that checks every commit (check probability 1), so each commit's evidence
  document exists. The evidence holds the wall time of each replay stage (`ms`: signature,
  payload, assignment, rewards, resample, gradient; `verifier/replay.py`; a verdict that also
  recomputed the shard a failing verdict named has two gradient checks, and the stage is their
  sum), and the worker's
  outcome log holds what the same contribution cost to produce (sample + learn + package, with
  their phases); the two are joined by the header digest.
- Cost ratio per stage = stage time / the worker's production time of that contribution; the
  table gives the median over checked commits. The replay checks (assignment, rewards, resample,
  gradient: the ones that redo the worker's work) have a target of under 10%. The expected cost
  per commit of a verifier that checks with probability p is p times the per-check figure, given
  at the run spec's default p and the demo's.
- A verifier loads each version it replays once (cached): the version's state is fetched before
  the stages, and the model is loaded inside the first resample (behaviour version) or gradient
  (learner version) stage that needs it, which records it as `model_load_ms`. With one or two
  checks per version most checks load one, so the table gives each stage with and without that
  once-per-version cost; the worker's own loading of a version is likewise outside its
  production time.
- After the demo, the floor of a replay is measured in process (`krill.bench.replay_floor`): the
  worker's and the verifier's passes alone on one thread, and what checking one group of the
  batch would cost both sides, so the table can be read against what no protocol change to the
  checks' surroundings could remove.
- The floor is also measured by completion length (`replay_floor.by_completion_length`, caps 4,
  16 and 64 on a random model of the base model's shape): the task's answers are a few tokens,
  and this shows whether the check would meet its target where generation is longer.
- Sizes: `tiny` (CI smoke: a tiny random model, 2 workers, under a minute of training) and
  `default` (the default base model, 2 workers, 4 minutes).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

from krill.bench import replay_floor
from krill.bench.demo_probe import (
    TINY_SHAPE,
    DemoResult,
    evidence_rows,
    model_dir,
    run_probed_demo,
    temporary_workdir,
    worker_records,
)
from krill.bench.report import fmt, machine_line, pyplot, save, started

SIZES: dict[str, dict] = {
    "tiny": {"model": "tiny", "workers": 2, "minutes": 0.75,
             "spec": {"version": {"contributions": 2, "deadline_s": 5.0}, "eval_n": 20},
             "floor": {"prompts": 4, "repeats": 2}, "lengths": {"lengths": (2, 4), "prompts": 2, "repeats": 1}},
    "default": {"model": "base", "workers": 2, "minutes": 4.0, "spec": {}, "floor": {"prompts": 16, "repeats": 8},
                "lengths": {"lengths": (4, 16, 64), "prompts": 16, "repeats": 4}},
}
STAGES = ("signature", "payload", "assignment", "rewards", "resample", "gradient")
REPLAY = ("assignment", "rewards", "resample", "gradient")
TARGET_REPLAY_PCT = 10.0
# The worker phase each replay stage redoes (for the like-for-like column).
COUNTERPART = {"rewards": "reward", "resample": "rollout", "gradient": "gradient"}


def production_seconds(record: dict) -> float:
    """What a contribution cost its worker to produce: sample + learn + package (not upload or commit)."""
    s = record["seconds"]
    return s.get("sample", 0.0) + s.get("learn", 0.0) + s.get("package", 0.0)


def pairs(evidence: list[dict], records: list[dict]) -> list[dict]:
    """Each passed check joined with its contribution's worker record (by header digest)."""
    by_digest = {r["digest"]: r for r in records if r.get("digest") and r["status"] == "committed"
                 and not r.get("resumed")}
    out = []
    for e in evidence:
        record = by_digest.get(e["digest"])
        if record is None or not e["ok"]:
            continue
        ms: dict[str, float] = {}  # a stage run more than once (two gradient shards) counts every run
        loads: dict[str, float] = {}
        for c in e["checks"]:
            ms[c["name"]] = ms.get(c["name"], 0) + c["ms"]
            if "model_load_ms" in (c.get("figures") or {}):
                loads[c["name"]] = loads.get(c["name"], 0.0) + float(c["figures"]["model_load_ms"])
        out.append({"commit_id": e["commit_id"], "stages_ms": ms, "model_load_ms": loads,
                    "worker_ms": 1000 * production_seconds(record),
                    "worker_phases_ms": {k: 1000 * v for k, v in (record.get("phases") or {}).items()},
                    "gradient_shards": len([c for c in e["checks"] if c["name"] == "gradient"])})
    return out


def stage_table(joined: list[dict]) -> list[dict]:
    """Per stage (and replay / all): median ms and median share of the worker's production time, with and
    without the version's model load (`model_load_ms`, in the first check of a version that needs it)."""
    rows = []
    for name, members in [*((s, (s,)) for s in STAGES), ("replay checks", REPLAY), ("all checks", STAGES)]:
        ms = [sum(p["stages_ms"].get(m, 0) for m in members) for p in joined]
        loads = [sum(p.get("model_load_ms", {}).get(m, 0.0) for m in members) for p in joined]
        ratio = [100 * total / p["worker_ms"] for total, p in zip(ms, joined, strict=True) if p["worker_ms"]]
        steady = [100 * (total - load) / p["worker_ms"]
                  for total, load, p in zip(ms, loads, joined, strict=True) if p["worker_ms"]]
        worker = COUNTERPART.get(name)
        counterpart = [p["worker_phases_ms"].get(worker) for p in joined if worker] if worker else []
        counterpart = [x for x in counterpart if x is not None]
        rows.append({"stage": name, "median_ms": statistics.median(ms) if ms else None,
                     "mean_ms": statistics.fmean(ms) if ms else None,
                     "median_pct_of_worker": statistics.median(ratio) if ratio else None,
                     "median_ms_without_model_load": statistics.median([t - x for t, x in zip(ms, loads, strict=True)])
                     if ms else None,
                     "median_pct_without_model_load": statistics.median(steady) if steady else None,
                     "worker_counterpart": worker,
                     "worker_counterpart_median_ms": statistics.median(counterpart) if counterpart else None})
    return rows


def model_loads(joined: list[dict]) -> dict:
    """How often a check loaded a version's model, and what a load cost (median ms)."""
    loads = [ms for p in joined for ms in p.get("model_load_ms", {}).values()]
    return {"checks_that_loaded": sum(bool(p.get("model_load_ms")) for p in joined), "loads": len(loads),
            "median_ms": statistics.median(loads) if loads else None}


def analyse(demo: DemoResult, check_probabilities: tuple[float, ...] = (0.1, 0.25)) -> dict:
    evidence = evidence_rows(demo)
    joined = pairs(evidence, worker_records(demo))
    table = stage_table(joined)
    replay = next(r for r in table if r["stage"] == "replay checks")["median_pct_of_worker"]
    total = next(r for r in table if r["stage"] == "all checks")["median_pct_of_worker"]
    steady = next(r for r in table if r["stage"] == "replay checks")["median_pct_without_model_load"]
    return {"checked": len(evidence), "failed": sum(not e["ok"] for e in evidence), "joined": len(joined),
            "model_loads": model_loads(joined), "replay_pct_without_model_load": steady,
            "worker_production_median_ms": statistics.median([p["worker_ms"] for p in joined]) if joined else None,
            "stages": table, "replay_pct": replay, "all_pct": total,
            "target_pct": TARGET_REPLAY_PCT, "target_met": None if replay is None else replay < TARGET_REPLAY_PCT,
            "amortised": [{"p": p, "replay_pct_per_commit": None if replay is None else p * replay,
                           "all_pct_per_commit": None if total is None else p * total} for p in check_probabilities],
            "demo": {"versions": demo.summary["versions"], "train_seconds": demo.summary.get("train_seconds"),
                     "wall_seconds": round(demo.seconds, 1)}}


def _shape(kind: str):
    """The `TinyModelSpec` of the bench's model: the base model's recipe, or the tiny random one's."""
    from krill.model.base import BaseModelRecipe
    from krill.model.build import TinyModelSpec

    return BaseModelRecipe().spec if kind == "base" else TinyModelSpec(**TINY_SHAPE)


def run_verify(size: str = "default", echo: Callable[[str], None] = print, keep: Path | None = None) -> dict:
    """Run the demo of `size` with a verifier checking every commit; compare costs per stage."""
    from krill.demo.orchestrate import DemoConfig

    s = SIZES[size]
    result = started(size)
    t0 = time.perf_counter()
    spec = {**s["spec"], "chain": {"check_probability_ppm": 1_000_000}}
    with temporary_workdir(keep, "krill-bench-verify-") as tmp:
        root = Path(tmp)
        model = model_dir(s["model"], root)
        config = DemoConfig(workers=s["workers"], adversaries=0, verifiers=1, minutes=s["minutes"], shards=2,
                            eval_every=1000, spec_overrides=spec, model_dir=model, release=False, explorer_port=None,
                            audit_last=0, verifier_nice=0)
        echo(f"verify: demo with {s['workers']} honest workers and a verifier checking every commit, "
             f"{s['minutes']} min on the {s['model']} model ...")
        demo = run_probed_demo(config, root / "demo", echo=lambda line: echo(f"  {line}"))
        result.update(analyse(demo))
        echo("verify: the floor of a replay, in process ...")
        result["floor"] = replay_floor.measure(model, num_shards=2, **s["floor"])
        echo("verify: the floor by completion length, in process ...")
        result["floor_by_length"] = replay_floor.by_completion_length(_shape(s["model"]), num_shards=2, **s["lengths"])
    described = str(model) if s["model"] == "base" else f"tiny random Llama (hidden {TINY_SHAPE['hidden']})"
    result["settings"] = {**s, "model_dir": described, "shards": 2, "verifiers": 1, "check_probability": 1.0}
    result["seconds"] = round(time.perf_counter() - t0, 1)
    echo(f"verify: {result['joined']} checked contributions; replay checks {fmt(result['replay_pct'], 1)}% of the "
         f"worker's cost (target < {TARGET_REPLAY_PCT:g}%), all checks {fmt(result['all_pct'], 1)}%")
    return result


def markdown(r: dict) -> str:
    s = r["settings"]
    met = "met" if r["target_met"] else "missed" if r["target_met"] is not None else "not measured"
    lines = [f"# krill bench verify ({r['size']})", "", f"Machine: {machine_line(r)}.", "",
             f"A `krill demo` run: {s['workers']} honest workers, one verifier checking every commit (p = 1), "
             f"{s['shards']} shards, model {s['model_dir']}, {s['minutes']} min of training: "
             f"{r['demo']['versions']} versions, {r['checked']} commits checked ({r['failed']} failed), "
             f"{r['joined']} joined with the worker's log. Worker production (sample + learn + package), median: "
             f"{fmt(r['worker_production_median_ms'], 0)} ms.", "",
             f"Replay checks per checked contribution = **{fmt(r['replay_pct'], 1)}%** of the worker's cost to "
             f"produce it (target < {r['target_pct']:g}%: {met}); all checks {fmt(r['all_pct'], 1)}%. Without "
             f"the once-per-version model load: {fmt(r.get('replay_pct_without_model_load'), 1)}%.", "",
             "| stage | median ms | mean ms | median % of the worker's production | median ms, model load left out "
             "| median %, model load left out | worker phase it redoes | that phase, median ms |",
             "|---|---:|---:|---:|---:|---:|---|---:|"]
    for row in r["stages"]:
        lines.append(f"| {row['stage']} | {fmt(row['median_ms'], 0)} | {fmt(row['mean_ms'], 1)} | "
                     f"{fmt(row['median_pct_of_worker'], 1, '%')} | {fmt(row.get('median_ms_without_model_load'), 0)} | "
                     f"{fmt(row.get('median_pct_without_model_load'), 1, '%')} | {row['worker_counterpart'] or ''} | "
                     f"{fmt(row['worker_counterpart_median_ms'], 1)} |")
    lines += ["", "Expected verifier cost per commit (not per check) at check probability p:", "",
              "| p | replay checks | all checks |", "|---:|---:|---:|"]
    for a in r["amortised"]:
        lines.append(f"| {a['p']:g} | {fmt(a['replay_pct_per_commit'], 1, '%')} | {fmt(a['all_pct_per_commit'], 1, '%')} |")
    loads = r.get("model_loads") or {}
    lines += ["", f"Loading a version's model (once per version, cached; weights loaded into the least recently used "
              f"model) falls into the first resample or gradient check that needs it: {loads.get('loads', 0)} loads "
              f"in {loads.get('checks_that_loaded', 0)} of {r['joined']} checks, median "
              f"{fmt(loads.get('median_ms'), 1)} ms. The worker's production likewise leaves out its own loading "
              "of each new version.", "",
              f"Benchmark wall time: {r['seconds']:.0f} s."]
    if r.get("floor"):
        lines += replay_floor.markdown_lines(r["floor"])
    if r.get("floor_by_length"):
        lines += replay_floor.length_markdown_lines(r["floor_by_length"], f"{s['model']} model's")
    return "\n".join(lines) + "\n"


def plots(r: dict, stem: Path) -> list[Path]:
    """Median % of the worker's production cost per check stage, with the 10% target line."""
    plt = pyplot()
    rows = r["stages"]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar([row["stage"] for row in rows], [row["median_pct_of_worker"] or 0.0 for row in rows])
    ax.axhline(r["target_pct"], color="red", linestyle="--", label=f"target for the replay checks ({r['target_pct']:g}%)")
    ax.set_ylabel("median % of the worker's cost")
    ax.set_title(f"verifier cost per checked contribution ({r['joined']} checks)")
    ax.tick_params(axis="x", labelrotation=30)
    ax.legend(fontsize=8)
    return [save(fig, stem.with_suffix(".png"))]
