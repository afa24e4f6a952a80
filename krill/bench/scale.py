"""`krill bench scale`: 4 to 32 workers as real processes against Anvil and the local store.

Design decisions:
- Each point is a `krill demo` run (`krill.bench.demo_probe`) with n honest worker processes, one
  coordinator and one verifier (the demo's check probability, 0.1) on a tiny random model, so
  that the protocol, not the model, is what grows. Workers keep the default cap of 2 commits per
  version, and versions close at 4 accepted contributions or a 10 s deadline.
- Figures per point: accepted commits per second over the commit window (first to last commit,
  block time), commits that landed, work dropped as stale, the index lag (probe: chain head minus
  the shared index's last block, in blocks and seconds), the coordinator's wall seconds per
  version (the commit window over the versions published: block times have 1 s resolution) and
  its busy seconds per version (median sum of its phases), the median worker contribution, and
  the peak resident memory per role (probe: VmHWM of every role process).
- What grows how: for each figure, the exponent k of a least-squares fit figure ~ n^k over the
  points (log-log), printed with the figure; k near 0 is flat, near 1 linear.
- Memory guard: before a point, the free memory (`MemAvailable`) must hold n workers at the
  largest worker peak measured so far (400 MiB before the first point) plus 1.5 GiB for the
  other roles, with a 25% margin; a point that does not fit is skipped and says so.
- Each point's training budget starts once version 1 is published (`DemoConfig.budget_from`):
  n workers import torch and transformers (about 5 s of CPU each) on the same cores, so 32 of them
  took about 80 s to start, and a budget counted from their launch left 21 s of commits to
  measure at that point (2026-12-06), against 78 s at 4 workers.
- Sizes: `tiny` (CI smoke: one point, 2 workers, 45 s) and `default` (4, 8, 16, 32 workers,
  90 s of training each; about 12 minutes on 2 cores).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from krill.bench.demo_probe import (
    commit_rows,
    metric_rows,
    model_dir,
    run_probed_demo,
    temporary_workdir,
    worker_records,
)
from krill.bench.protocol import coordinator_parts, worker_breakdown
from krill.bench.report import fmt, machine_line, pyplot, save, started

SIZES: dict[str, dict] = {
    "tiny": {"workers": (2,), "minutes": 0.75},
    "default": {"workers": (4, 8, 16, 32), "minutes": 1.5},
}
SPEC = {"version": {"contributions": 4, "deadline_s": 10.0}, "eval_n": 20}
WORKER_MIB_GUESS = 400.0
OTHER_ROLES_MIB = 1536.0


def available_mib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def point_figures(demo, workers: int) -> dict:
    """The figures of one point (see the module docstring)."""
    commits = commit_rows(demo)
    times = [c["block_time"] for c in commits if c["block_time"] is not None]
    window = (max(times) - min(times)) if len(times) > 1 else None
    accepted = sum(c["status"] == "accepted" for c in commits)
    rejected = sum(c["status"] == "rejected" for c in commits)
    per_version = [x for x in (coordinator_parts(r) for r in metric_rows(demo) if r["version"] > 1) if x]
    worker = worker_breakdown(worker_records(demo))
    memory = demo.probe.memory_by_role()
    lag = demo.probe.lag_figures()
    return {"workers": workers, "commits": len(commits), "accepted": accepted, "rejected": rejected,
            "dropped_stale": worker["dropped"], "commit_window_s": window,
            "accepted_per_s": accepted / window if window else None,
            "versions": demo.summary["versions"],
            # Block times have 1 s resolution: the commit window over the versions published in it is finer.
            "coordinator_wall_s_per_version": window / demo.summary["versions"] if window and demo.summary["versions"]
            else None,
            "coordinator_busy_s_per_version": statistics.median([x["busy"] for x in per_version]) if per_version else None,
            "accepted_per_version": statistics.fmean([x["accepted"] for x in per_version]) if per_version else None,
            "worker_contribution_ms": worker["median_contribution_ms"],
            "worker_waiting_pct": worker["waiting_pct_of_wall"],
            "index_lag_blocks_median": lag["blocks"]["median"], "index_lag_blocks_p95": lag["blocks"]["p95"],
            "index_lag_s_median": lag["seconds"]["median"], "index_lag_s_p95": lag["seconds"]["p95"],
            "index_lag_s_max": lag["seconds"]["max"],
            "memory_mib": memory, "demo_seconds": round(demo.seconds, 1),
            "train_seconds": demo.summary.get("train_seconds")}


GROWTH = (
    ("accepted_per_s", "accepted commits per second"),
    ("coordinator_wall_s_per_version", "coordinator wall seconds per version"),
    ("coordinator_busy_s_per_version", "coordinator busy seconds per version"),
    ("accepted_per_version", "contributions folded per version"),
    ("index_lag_s_median", "index lag, median seconds"),
    ("index_lag_s_p95", "index lag, 95th percentile seconds"),
    ("index_lag_blocks_median", "index lag, median blocks"),
    ("worker_contribution_ms", "median worker contribution (ms)"),
    ("worker_total_mib", "peak memory, all workers together (MiB)"),
    ("coordinator_mib", "peak memory, coordinator (MiB)"),
)


def _flat(point: dict) -> dict:
    m = point.get("memory_mib") or {}
    return point | {"worker_total_mib": (m.get("worker") or {}).get("total_mib"),
                    "coordinator_mib": (m.get("coordinator") or {}).get("max_mib")}


def growth(points: list[dict]) -> list[dict]:
    """Exponent k of figure ~ n^k (least squares on logs) for each figure of `GROWTH`."""
    out = []
    for key, label in GROWTH:
        xy = [(math.log(p["workers"]), math.log(_flat(p)[key])) for p in points
              if _flat(p).get(key) is not None and _flat(p)[key] > 0]
        k, values = None, [_flat(p).get(key) for p in points]
        if len(xy) >= 2:
            mx, my = statistics.fmean(x for x, _ in xy), statistics.fmean(y for _, y in xy)
            den = sum((x - mx) ** 2 for x, _ in xy)
            k = sum((x - mx) * (y - my) for x, y in xy) / den if den else None
        reading = "0 at every point" if values and all(v == 0 for v in values) else _reading(k)
        out.append({"figure": key, "label": label, "exponent": k, "values": values, "reading": reading})
    return out


def _reading(k: float | None) -> str:
    if k is None:
        return "not enough points"
    if abs(k) < 0.2:
        return "flat"
    if k < 0:
        return f"shrinks ~ n^{k:.2f}"
    if abs(k - 1) < 0.2:
        return "linear"
    return f"grows ~ n^{k:.2f}"


def run_scale(size: str = "default", echo: Callable[[str], None] = print, keep: Path | None = None) -> dict:
    """One demo per worker count of `size`; figures per point and how each grows."""
    from krill.demo.orchestrate import DemoConfig

    s = SIZES[size]
    result = started(size)
    result["settings"] = {**s, "model": "tiny random Llama (hidden 32, 2 layers)", "verifiers": 1, "shards": 2,
                          "spec": SPEC, "check_probability": "demo default (0.1)"}
    t0 = time.perf_counter()
    points, skipped, per_worker = [], [], WORKER_MIB_GUESS
    with temporary_workdir(keep, "krill-bench-scale-") as tmp:
        root = Path(tmp)
        model = model_dir("tiny", root)
        for n in s["workers"]:
            need = 1.25 * (n * per_worker + OTHER_ROLES_MIB)
            free = available_mib()
            if free is not None and free < need:
                note = f"{n} workers skipped: {free:,.0f} MiB free, about {need:,.0f} MiB needed"
                echo(f"scale: {note}")
                skipped.append({"workers": n, "note": note})
                continue
            # Pipelined (two commits per worker and version): the load on the roles is what is measured.
            config = DemoConfig(workers=n, adversaries=0, verifiers=1, minutes=s["minutes"], shards=2,
                                eval_every=1000, spec_overrides=SPEC, model_dir=model, release=False,
                                explorer_port=None, audit_last=0, fresh_gradients=False, verifier_nice=0,
                                budget_from="first_version")
            echo(f"scale: {n} workers, {s['minutes']} min ...")
            demo = run_probed_demo(config, root / f"demo-{n}", echo=lambda line: None)
            point = point_figures(demo, n)
            points.append(point)
            worker_mem = (point["memory_mib"].get("worker") or {}).get("max_mib")
            per_worker = max(per_worker if points[:-1] else 0.0, worker_mem or WORKER_MIB_GUESS)
            echo(f"scale: {n} workers: {point['accepted']} accepted in {fmt(point['commit_window_s'], 0)} s "
                 f"({fmt(point['accepted_per_s'], 2)}/s), {point['versions']} versions, coordinator "
                 f"{fmt(point['coordinator_wall_s_per_version'], 2)} s/version, index lag "
                 f"{fmt(point['index_lag_s_median'], 2)} s median, worker peak {fmt(worker_mem, 0)} MiB")
    result.update(points=points, skipped=skipped, growth=growth(points), seconds=round(time.perf_counter() - t0, 1))
    return result


def markdown(r: dict) -> str:
    s = r["settings"]
    lines = [f"# krill bench scale ({r['size']})", "", f"Machine: {machine_line(r)}.", "",
             f"One `krill demo` run per point: n honest worker processes, a coordinator and a verifier (check "
             f"probability {s['check_probability']}) against Anvil and the local store, {s['model']}, "
             f"{s['shards']} shards, {s['minutes']} min of training each from version 1 on; versions close at "
             f"{s['spec']['version']['contributions']} accepted contributions or after "
             f"{s['spec']['version']['deadline_s']:g} s; each worker commits at most 2 per version.", "",
             "| workers | commits | accepted/s | dropped stale | versions | folded/version | coordinator s/version "
             "(wall / busy) | index lag s (median / p95) | worker contribution ms | worker waiting | peak MiB: "
             "worker (each, max) / all workers / coordinator / verifier |",
             "|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---|"]
    for p in r["points"]:
        m = p["memory_mib"]

        def mem(role, key, m=m):
            return fmt((m.get(role) or {}).get(key), 0)

        lines.append(f"| {p['workers']} | {p['commits']} | {fmt(p['accepted_per_s'], 2)} | {p['dropped_stale']} | "
                     f"{p['versions']} | {fmt(p['accepted_per_version'], 1)} | "
                     f"{fmt(p['coordinator_wall_s_per_version'], 2)} / {fmt(p['coordinator_busy_s_per_version'], 2)} | "
                     f"{fmt(p['index_lag_s_median'], 2)} / {fmt(p['index_lag_s_p95'], 2)} | "
                     f"{fmt(p['worker_contribution_ms'], 0)} | {fmt(p['worker_waiting_pct'], 0, '%')} | "
                     f"{mem('worker', 'max_mib')} / {mem('worker', 'total_mib')} / {mem('coordinator', 'max_mib')} / "
                     f"{mem('verifier', 'max_mib')} |")
    for sk in r["skipped"]:
        lines.append(f"| {sk['workers']} | skipped: {sk['note']} |" + " |" * 9)
    lines += ["", "What grows how with the number of workers n (least-squares exponent k of figure ~ n^k):", "",
              "| figure | k | reading | values |", "|---|---:|---|---|"]
    for g in r["growth"]:
        values = ", ".join(fmt(v, 2) for v in g["values"])
        lines.append(f"| {g['label']} | {fmt(g['exponent'], 2)} | {g['reading']} | {values} |")
    lines += ["", f"Benchmark wall time: {r['seconds']:.0f} s."]
    return "\n".join(lines) + "\n"


def plots(r: dict, stem: Path) -> list[Path]:
    """Accepted/s, coordinator s/version, index lag and peak memory against the number of workers."""
    plt = pyplot()
    pts = r["points"]
    ns = [p["workers"] for p in pts]
    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    panels = (("accepted_per_s", "accepted commits / s"), ("coordinator_wall_s_per_version", "coordinator s / version"),
              ("index_lag_s_median", "index lag, median s"), ("worker_total_mib", "peak MiB, all workers"))
    for ax, (key, label) in zip(axes, panels, strict=True):
        ax.plot(ns, [_flat(p).get(key) or 0.0 for p in pts], marker="o")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("worker processes")
        ax.set_title(label)
        ax.grid(True, alpha=0.3)
    return [save(fig, stem.with_suffix(".png"))]
