"""`krill bench aggregate`: time of each aggregation rule against the plain mean, and agreement with references.

Design decisions:
- Timing reuses `krill.bench.robustness_inproc.aggregation_timing` (seeded Gaussian rows [n, d],
  unit weights, median of repeats within a time budget, cells above a memory cap skipped), so the
  two benchmarks measure the same thing the same way. Each rule is timed as a new run's spec gets it
  (`reductions = "fixed-tree"`, the sums over coordinates every CPU folds to the same bits; clip-mix-trim
  clipping to the non-zero norms' median), which is what a coordinator of a new run pays; this one covers shard sizes up to 8M
  parameters for n in {8, 16, 64} submissions, on one torch thread: the coordinator's default
  (`coordinator.threads`), and on a shared machine two threads that wait on each other make
  small cells noisy.
- Agreement: Krill's trimmed mean and median against two independent implementations on random
  inputs (Gaussian, heavy-tailed Student-t with 1 degree of freedom, and many ties: integers 0..4),
  unit weights, n odd and even. References: ByzFL's `TrMean(f)` and `Median` (the `bench` extra,
  `byzfl==0.0.11`), and a plain numpy sort (written here, a dozen lines). ByzFL's package
  `__init__` imports its whole federated-learning framework (torchvision, seaborn); only its
  aggregators are needed, so when that import fails they are loaded from the installed package
  without its `__init__`. Without ByzFL the comparison says so and the numpy reference remains.
- Krill's trimmed mean with fraction f/n trims exactly f values at each end (weight mass, unit
  weights), the same as `TrMean(f)`. Krill's median is the lower median on an exact half split
  (a weighted median needs one rule for ties of mass); ByzFL (numpy's median) averages the two
  middle values, so for even n the two differ by definition: the table compares them on odd n
  and, for even n, Krill against the lower middle value (numpy) and reports ByzFL's gap.
- Krill aggregates in float64 and returns float32: agreement is a relative difference below 1e-6
  (float32 has 24 bits, about 6e-8), per coordinate relative to max(1, |reference|).
- Sizes: `tiny` (CI smoke, seconds) and `default` (about 7 minutes on one core of a shared machine).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from krill.bench.report import machine_line, pyplot, save, started

SIZES: dict[str, dict] = {
    "tiny": {"timing_ns": (8, 16), "timing_ds": (4096,), "timing_max_elements": 1 << 20, "timing_repeats": 1,
             "timing_budget_s": 1.0, "threads": 1, "agreement_ns": (7, 8), "agreement_d": 1000, "trials": 2},
    "default": {"timing_ns": (8, 16, 64), "timing_ds": (1 << 16, 1 << 20, 1 << 22, 1 << 23),
                "timing_max_elements": 1 << 26, "timing_repeats": 3, "timing_budget_s": 10.0, "threads": 1,
                "agreement_ns": (7, 8, 9, 16, 63, 64), "agreement_d": 20_000, "trials": 5},
}
TOLERANCE = 1e-6
DISTRIBUTIONS = ("gaussian", "student-t (1 dof)", "ties (integers 0..4)")


def byzfl_aggregators():
    """(ByzFL's aggregators module or None, a note saying which and how it was loaded)."""
    import importlib
    import importlib.util
    import sys
    import types
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("byzfl")
    except PackageNotFoundError:
        return None, "ByzFL is not installed (`pip install 'krill[bench]'`): compared with numpy only"
    try:
        import byzfl  # noqa: F401  (the whole package, when its dependencies are there)
    except ImportError as exc:
        # Its __init__ pulls the FL framework (torchvision, seaborn); the aggregators need numpy,
        # torch and scipy. Register the package without running its __init__, then import them.
        spec = importlib.util.find_spec("byzfl")
        package = types.ModuleType("byzfl")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["byzfl"] = package
        how = f"aggregators loaded without the package __init__ ({type(exc).__name__}: {exc})"
    else:
        how = "imported as a package"
    try:
        module = importlib.import_module("byzfl.aggregators.aggregators")
    except ImportError as exc:
        return None, f"ByzFL {v} is installed but its aggregators do not import ({exc}): compared with numpy only"
    return module, f"ByzFL {v}, {how}"


def _inputs(rng: np.random.Generator, dist: str, n: int, d: int) -> np.ndarray:
    if dist == "gaussian":
        return rng.normal(size=(n, d))
    if dist.startswith("student"):
        return rng.standard_t(1, size=(n, d))
    return rng.integers(0, 5, size=(n, d)).astype(np.float64)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b) / np.maximum(1.0, np.abs(b))))


def agreement(ns: tuple[int, ...], d: int, trials: int, byzfl, seed: int = 0) -> list[dict]:
    """Max relative difference of Krill's trimmed mean and median from ByzFL's and numpy's, per n x input kind."""
    from krill.rl.aggregate import MedianRule, TrimmedMeanRule, aggregate

    rng = np.random.default_rng(seed)
    rows = []
    for n in ns:
        f = max(1, int(0.2 * n))
        trimmed, median = TrimmedMeanRule(trim_fraction=f / n), MedianRule()
        for dist in DISTRIBUTIONS:
            worst = {"tm_byzfl": 0.0, "tm_numpy": 0.0, "med_byzfl": 0.0, "med_numpy": 0.0}
            for _ in range(trials):
                x = _inputs(rng, dist, n, d)
                ones = torch.ones(n, dtype=torch.float64)
                k_tm = aggregate(torch.from_numpy(x), ones, trimmed)[0].double().numpy()
                k_med = aggregate(torch.from_numpy(x), ones, median)[0].double().numpy()
                xs = np.sort(x, axis=0)
                worst["tm_numpy"] = max(worst["tm_numpy"], _rel(k_tm, xs[f:n - f].mean(axis=0)))
                worst["med_numpy"] = max(worst["med_numpy"], _rel(k_med, xs[(n - 1) // 2]))  # lower middle
                if byzfl is not None:
                    worst["tm_byzfl"] = max(worst["tm_byzfl"], _rel(k_tm, np.asarray(byzfl.TrMean(f=f)(x))))
                    worst["med_byzfl"] = max(worst["med_byzfl"], _rel(k_med, np.asarray(byzfl.Median()(x))))
            for rule, key, note in (("trimmed-mean", "tm", f"f = {f} trimmed at each end"),
                                    ("median", "med", "odd n" if n % 2 else "even n: ByzFL averages the two middle "
                                                                            "values, Krill takes the lower")):
                vs_byzfl = worst[f"{key}_byzfl"] if byzfl is not None else None
                expected_gap = rule == "median" and n % 2 == 0
                agree = worst[f"{key}_numpy"] <= TOLERANCE and (vs_byzfl is None or expected_gap or vs_byzfl <= TOLERANCE)
                rows.append({"rule": rule, "n": n, "inputs": dist, "trials": trials, "d": d, "note": note,
                             "vs_byzfl": vs_byzfl, "vs_numpy": worst[f"{key}_numpy"],
                             "byzfl_differs_by_definition": expected_gap, "agree": agree})
    return rows


def run_aggregate(size: str = "default", echo: Callable[[str], None] = print) -> dict:
    """Timing per rule x n x d, and agreement with the references."""
    from krill.bench.robustness_inproc import SIZES as GRID
    from krill.bench.robustness_inproc import aggregation_timing

    s = SIZES[size]
    result = started(size)
    result["settings"] = dict(s) | {"tolerance": TOLERANCE, "torch_threads": s["threads"]}
    t0 = time.perf_counter()
    grid = dataclasses.replace(GRID["default"], **{k: v for k, v in s.items() if k.startswith("timing_")})
    threads = torch.get_num_threads()
    torch.set_num_threads(s["threads"])
    try:
        result["timing"] = aggregation_timing(grid, echo)
    finally:
        torch.set_num_threads(threads)
    t1 = time.perf_counter()
    byzfl, note = byzfl_aggregators()
    echo(f"agreement: {note}")
    result["reference"] = note
    result["byzfl_used"] = byzfl is not None
    result["agreement"] = agreement(s["agreement_ns"], s["agreement_d"], s["trials"], byzfl)
    result["all_agree"] = all(row["agree"] for row in result["agreement"])
    result["seconds"] = {"timing": round(t1 - t0, 1), "agreement": round(time.perf_counter() - t1, 1)}
    echo(f"agreement: {'all rows agree' if result['all_agree'] else 'DISAGREEMENT'} "
         f"(max relative difference <= {TOLERANCE:g})")
    return result


def markdown(r: dict) -> str:
    s = r["settings"]
    rows = r["timing"]
    rules = list(dict.fromkeys(row["rule"] for row in rows))
    lines = [f"# krill bench aggregate ({r['size']})", "", f"Machine: {machine_line(r)}.", "",
             f"## Time per aggregation (ms, median of up to {s['timing_repeats']} repeats; x = times the plain mean)",
             "", f"Seeded Gaussian rows [n, d] (float32), unit weights, {s['torch_threads']} torch threads; each rule "
             f"as a new run's spec gets it (reductions: {', '.join(sorted({str(row.get('reductions')) for row in rows}))}); "
             f"cells with n x d above {s['timing_max_elements']:,} elements are skipped (memory).", "",
             "| n | d | " + " | ".join(rules) + " |", "|---:|---:|" + "---:|" * len(rules)]
    for n, d in dict.fromkeys((row["n"], row["d"]) for row in rows):
        cell = {row["rule"]: row for row in rows if (row["n"], row["d"]) == (n, d)}
        lines.append(f"| {n} | {d:,} | " + " | ".join(
            f"{1000 * cell[x]['seconds']:,.1f}" + ("" if x == "mean" else f" (x{cell[x]['vs_mean']:,.1f})")
            for x in rules) + " |")
    lines += ["", "## Agreement with independent implementations", "",
              f"Reference: {r['reference']}; and a numpy sort. Max relative difference per coordinate (relative to "
              f"max(1, |reference|)) over {s['trials']} random draws of [n, {s['agreement_d']:,}]; agreement means "
              f"<= {s['tolerance']:g} (Krill returns float32). "
              f"Overall: **{'all agree' if r['all_agree'] else 'disagreement, see the rows'}**.", "",
              "| rule | n | inputs | vs ByzFL | vs numpy | agree | note |", "|---|---:|---|---:|---:|---|---|"]
    for row in r["agreement"]:
        byz = "-" if row["vs_byzfl"] is None else f"{row['vs_byzfl']:.1e}"
        if row["byzfl_differs_by_definition"] and row["vs_byzfl"] is not None:
            byz += " (by definition)"
        lines.append(f"| {row['rule']} | {row['n']} | {row['inputs']} | {byz} | {row['vs_numpy']:.1e} | "
                     f"{'yes' if row['agree'] else 'NO'} | {row['note']} |")
    lines += ["", f"Wall time: timing {r['seconds']['timing']:.0f} s, agreement {r['seconds']['agreement']:.0f} s."]
    return "\n".join(lines) + "\n"


def plots(r: dict, stem: Path) -> list[Path]:
    """ms per aggregation against shard size, one panel per n."""
    plt = pyplot()
    rows = r["timing"]
    ns = list(dict.fromkeys(row["n"] for row in rows))
    fig, axes = plt.subplots(1, len(ns), figsize=(5 * len(ns), 4), squeeze=False)
    for ax, n in zip(axes[0], ns, strict=True):
        for rule in dict.fromkeys(row["rule"] for row in rows):
            pts = [(row["d"], row["seconds"]) for row in rows if row["n"] == n and row["rule"] == rule]
            ax.plot([d for d, _ in pts], [1000 * t for _, t in pts], marker="o", label=rule)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("shard size d (parameters)")
        ax.set_ylabel("ms per aggregation")
        ax.set_title(f"n = {n} submissions")
        ax.legend(fontsize=8)
    return [save(fig, stem.with_suffix(".png"))]
