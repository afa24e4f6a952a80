"""`krill bench robustness`: accuracy under gradient attacks, aggregation cost, staleness, detection.

Design decisions:
- The command only picks a size, runs the parts and writes what people read; the figures come
  from `krill.bench.robustness_inproc` (training grids on the in-process loop, aggregation
  timings) and `krill.bench.detection` (another study, imported lazily: when that module is
  not installed the section is skipped with a note, never faked).
- Output under `--out`: `robustness.json` (every figure, the machine, the settings),
  `robustness.md` (markdown tables) and PNG plots (matplotlib Agg). `--tiny` and `--full` write
  `robustness-tiny.*` / `robustness-full.*`, so a smoke run never overwrites the committed
  default-size results.
- Progress goes one line per cell; with `--json` it goes to stderr and stdout carries only the
  JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from krill.commands.bench_cmd import output_dir


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _machine_line(m: dict) -> str:
    v = m["versions"]
    return (f"{m['usable_cpus']} usable CPUs of {m['cpu_count']}, {m['memory_gib']} GiB, {m['platform']}, "
            f"Python {m['python']}, torch {v.get('torch')}, transformers {v.get('transformers')}; {m['date_utc']}")


def _stderr(r: dict) -> float:
    accuracies = [row["accuracy"] for row in r["robustness"]] or [r["base_accuracy"]]
    p = sum(accuracies) / len(accuracies)
    return (p * (1 - p) / r["settings"]["eval_n"]) ** 0.5


def _robustness_md(r: dict) -> list[str]:
    s = r["settings"]
    clean = {row["rule"]: row["accuracy"] for row in r["robustness"] if row["byzantine"] == 0}
    lines = ["## Robustness: final greedy accuracy (%) under gradient attacks", "",
             f"Each cell: {s['versions']} versions from the base model ({_pct(r['base_accuracy'])}%), "
             f"{s['workers']} submissions per version of which the Byzantine ones are computed from the honest "
             f"rows of the same shard; {s['prompts_per_worker']} prompts x {s['group_size']} samples per honest "
             f"worker, seed 0, accuracy on {s['eval_n']} held-out prompts. One run per cell: the binomial "
             f"standard error of one accuracy is about {_pct(_stderr(r))} points, and runs that differ in any way "
             "follow different training paths, so gaps of a few points are within run-to-run variation.", ""]
    if "tolerance-edge" in s["attacks"]:
        lines += ["tolerance-edge: the Byzantine workers do their honest work (all workers are simulated) and send "
                  "their own gradients moved against the honest mean as far as the verifier's gradient check admits, "
                  "so a replay passes them.", ""]
    for fraction in [f for f in s["fractions"] if f > 0]:
        cells = [row for row in r["robustness"] if row["fraction"] == fraction]
        attacks = [a for a in s["attacks"] if any(row["attack"] == a for row in cells)]
        f = cells[0]["byzantine"] if cells else 0
        lines += [f"### {round(100 * fraction)}% Byzantine ({f} of {s['workers']})", "",
                  "| rule | no attack | " + " | ".join(attacks) + " |",
                  "|---|---:|" + "---:|" * len(attacks)]
        for rule in s["rules"]:
            acc = {row["attack"]: row["accuracy"] for row in cells if row["rule"] == rule}
            lines.append(f"| {rule} | {_pct(clean[rule]) if rule in clean else '-'} | "
                         + " | ".join(_pct(acc[a]) if a in acc else "-" for a in attacks) + " |")
        lines.append("")
    return lines


def _timing_md(r: dict) -> list[str]:
    rows = r["aggregation_time"]
    rules = list(dict.fromkeys(row["rule"] for row in rows))
    lines = ["## Time per aggregation (ms, median of repeats; x = times the plain mean)", "",
             f"Seeded Gaussian rows [n, d], unit weights; cells with n x d above "
             f"{r['settings']['timing_max_elements']:,} elements are skipped (memory).", "",
             "| n | d | " + " | ".join(rules) + " |", "|---:|---:|" + "---:|" * len(rules)]
    for n, d in dict.fromkeys((row["n"], row["d"]) for row in rows):
        cell = {row["rule"]: row for row in rows if (row["n"], row["d"]) == (n, d)}
        lines.append(f"| {n} | {d:,} | " + " | ".join(
            f"{1000 * cell[x]['seconds']:,.1f}" + ("" if x == "mean" else f" (x{cell[x]['vs_mean']:,.0f})")
            for x in rules) + " |")
    return lines + [""]


def _staleness_md(r: dict) -> list[str]:
    s = r["settings"]
    acc = {(row["max_staleness"], row["correction"]): row["accuracy"] for row in r["staleness"]}
    lines = ["## Staleness: final greedy accuracy (%) by bound S_max", "",
             f"Default rule, {s['staleness_workers']} workers, {s['versions']} versions, rollouts drawn up to S_max "
             "versions behind (inverse staleness weight in both columns); 'without' fixes the importance ratio at 1.",
             "", "| S_max | with truncated IS | without correction |", "|---:|---:|---:|"]
    for bound in s["staleness_bounds"]:
        lines.append(f"| {bound} | {_pct(acc[(bound, 'truncated-is')])} | {_pct(acc[(bound, 'none')])} |")
    return lines + [""]


def markdown(r: dict) -> str:
    s = r["settings"]
    lines = [f"# krill bench robustness ({r['size']})", "", f"Machine: {_machine_line(r['machine'])}.", "",
             f"Model: {s['model']}, {s['parameters']:,} parameters; base accuracy {_pct(r['base_accuracy'])}% on "
             f"{s['eval_n']} held-out prompts.", ""]
    lines += _robustness_md(r) + _timing_md(r) + _staleness_md(r)
    lines += ["## Detection", ""]
    if r.get("detection_markdown"):
        lines.append(r["detection_markdown"].rstrip())
    else:
        lines.append(r.get("detection_note", "not run"))
    lines += ["", "## Wall time (s)", "", "| part | seconds |", "|---|---:|"]
    lines += [f"| {k} | {v:,.1f} |" for k, v in r["seconds"].items()]
    return "\n".join(lines) + "\n"


def plots(r: dict, stem: Path) -> list[Path]:
    """robustness bars per Byzantine fraction, aggregation time vs d, accuracy vs S_max."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s, out = r["settings"], []
    fractions = [f for f in s["fractions"] if f > 0]
    fig, axes = plt.subplots(1, len(fractions), figsize=(6 * len(fractions), 4), squeeze=False)
    clean = {row["rule"]: row["accuracy"] for row in r["robustness"] if row["byzantine"] == 0}
    for ax, fraction in zip(axes[0], fractions, strict=True):
        cols = ["none", *s["attacks"]]
        width = 0.8 / len(s["rules"])
        for i, rule in enumerate(s["rules"]):
            acc = {row["attack"]: row["accuracy"] for row in r["robustness"]
                   if row["rule"] == rule and row["fraction"] == fraction}
            ys = [100 * (clean.get(rule, 0.0) if a == "none" else acc.get(a, 0.0)) for a in cols]
            ax.bar([j + i * width for j in range(len(cols))], ys, width, label=rule)
        ax.axhline(100 * r["base_accuracy"], color="grey", linestyle="--", label="base model")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cols))], cols)
        ax.set_ylim(0, 1.35 * ax.get_ylim()[1])  # room for the legend above the bars
        ax.set_ylabel("final greedy accuracy (%)")
        ax.set_title(f"{round(100 * fraction)}% Byzantine workers ('none': no attacker)")
        ax.legend(fontsize=8)
    out.append(_save(fig, stem.with_name(stem.name + ".png"), plt))
    ns = list(dict.fromkeys(row["n"] for row in r["aggregation_time"]))
    fig, axes = plt.subplots(1, len(ns), figsize=(5 * len(ns), 4), squeeze=False)
    for ax, n in zip(axes[0], ns, strict=True):
        for rule in dict.fromkeys(row["rule"] for row in r["aggregation_time"]):
            pts = [(row["d"], row["seconds"]) for row in r["aggregation_time"] if row["n"] == n and row["rule"] == rule]
            ax.plot([d for d, _ in pts], [1000 * t for _, t in pts], marker="o", label=rule)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("shard size d (parameters)")
        ax.set_ylabel("ms per aggregation")
        ax.set_title(f"n = {n} submissions")
        ax.legend(fontsize=8)
    out.append(_save(fig, stem.with_name(stem.name + "-timing.png"), plt))
    fig, ax = plt.subplots(figsize=(6, 4))
    for correction, label in (("truncated-is", "with truncated IS"), ("none", "without correction")):
        pts = [(row["max_staleness"], row["accuracy"]) for row in r["staleness"] if row["correction"] == correction]
        ax.plot([b for b, _ in pts], [100 * a for _, a in pts], marker="o", label=label)
    ax.axhline(100 * r["base_accuracy"], color="grey", linestyle="--", label="base model")
    ax.set_xlabel("max staleness S_max (versions)")
    ax.set_ylabel("final greedy accuracy (%)")
    ax.set_title(f"staleness, {s['versions']} versions")
    ax.legend(fontsize=8)
    out.append(_save(fig, stem.with_name(stem.name + "-staleness.png"), plt))
    return out


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run_detection_part(size: str, echo) -> dict:
    """The detection study's result and markdown, or a note when its module is not there yet."""
    try:
        from krill.bench.detection import markdown as detection_markdown
        from krill.bench.detection import run_detection
    except ModuleNotFoundError as exc:
        if exc.name != "krill.bench.detection":
            raise
        note = "skipped: krill.bench.detection is not available in this checkout"
        echo(f"detection: {note}")
        return {"detection": None, "detection_note": note}
    result = run_detection(size, echo)
    return {"detection": result, "detection_markdown": detection_markdown(result)}


@click.command("robustness")
@click.option("--full", "size", flag_value="full", help="The whole grid: every attack x fraction x rule (hours).")
@click.option("--tiny", "size", flag_value="tiny", help="A smoke size on a tiny random model (seconds, plus the detection study's own smoke size).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("bench/results"),
              callback=output_dir,
              show_default=True, help="Directory for robustness.json, robustness.md and the PNG plots.")
@click.option("--skip-detection", is_flag=True, help="Leave out the detection study (it runs whole demos); noted in the output.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON (progress goes to stderr).")
def robustness(size: str | None, out_dir: Path, skip_detection: bool, as_json: bool) -> None:
    """Accuracy under Byzantine gradient attacks per rule, aggregation cost, staleness, and detection."""
    import time

    from krill.bench.robustness_inproc import run_inproc

    size = size or "default"
    started = time.perf_counter()

    def echo(line: str) -> None:
        click.echo(line, err=as_json)

    result = run_inproc(size, echo)
    t0 = time.perf_counter()
    if skip_detection:
        result.update(detection=None, detection_note="skipped (--skip-detection): rerun without it for this section")
    else:
        result.update(run_detection_part(size, echo))
    result["seconds"]["detection"] = round(time.perf_counter() - t0, 1)
    result["seconds"]["total"] = round(time.perf_counter() - started, 1)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / ("robustness" if size == "default" else f"robustness-{size}")
    text = markdown(result)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    stem.with_suffix(".md").write_text(text)
    pngs = plots(result, stem)
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    click.echo(text)
    click.echo(f"wrote {stem.with_suffix('.json')}, {stem.with_suffix('.md')}, " + ", ".join(map(str, pngs)))
