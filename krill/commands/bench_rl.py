"""`krill bench rl`: Krill's in-process RL loop against TRL's GRPOTrainer, same model, task and settings.

Design decisions:
- The command picks a size and writes what people read; the runs and figures come from
  `krill.bench.rl_compare` (and `krill.bench.rl_trl` for TRL, which needs the optional extra
  `krill[bench]`; without it the TRL side is skipped with a note, never faked).
- Output under `--out`: `rl.json` (every run's curve, the machine, the settings), `rl.md`
  (markdown tables) and `rl.png` (accuracy against training time per run; steps/min). `--tiny`
  and `--full` write `rl-tiny.*` / `rl-full.*`, so a smoke run never overwrites the committed
  default-size results.
- The markdown says when the machine was shared (load average above the usable CPUs, or other
  processes using a measurable share of the CPUs during the runs): figures on a shared machine
  are slower than on an idle one, for both sides alike since runs alternate.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from krill.commands.bench_cmd import output_dir
from krill.commands.context import FiniteFloatRange

SHARED_CORES = 0.25  # other processes' mean CPU use (cores) above which a run counts as shared


def _dense_start(compression: dict) -> str:
    """' after N dense versions' where the run's compression starts dense, else nothing."""
    n = compression.get("dense_versions", 0)
    return f" after {n} dense version{'s' if n != 1 else ''}" if n else ""


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _num(x: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def _machine_line(m: dict, trl: str | None) -> str:
    v = m["versions"]
    return (f"{m['usable_cpus']} usable CPUs of {m['cpu_count']}, {m['memory_gib']} GiB, {m['platform']}, "
            f"Python {m['python']}, torch {v.get('torch')}, transformers {v.get('transformers')}, "
            f"TRL {trl or 'not installed'}; {m['date_utc']}")


def shared_note(r: dict) -> str | None:
    """A sentence saying the machine was shared during the runs, or None when it looked idle."""
    runs = r["runs"]
    cpus = r["machine"]["usable_cpus"] or 1
    others = [x["other_cores_busy"] for x in runs if x["other_cores_busy"] is not None]
    # Measured during the runs only: the 1-minute load average at a run's start still counts the demos
    # `bench rl` ran just before, and said "shared" of an idle machine.
    if not any(o > SHARED_CORES for o in others):
        return None
    mean_others = f"{sum(others) / len(others):.2f}" if others else "unknown"
    return (f"The machine was shared with other work: other processes used {mean_others} of {cpus} cores on "
            f"average during the runs (up to {max(others, default=0):.2f}), and the 1-minute load average at the "
            f"start of a run was up to {max(x['load_start'] for x in runs):.1f}. Absolute rates are lower than on an "
            "idle machine; runs alternate, so both sides saw similar conditions.")


def markdown(r: dict) -> str:
    s, summary = r["settings"], r["summary"]
    k, t, ratio = summary.get("krill"), summary.get("trl"), summary.get("krill_over_trl", {})
    lines = [f"# krill bench rl ({r['size']})", "", f"Machine: {_machine_line(r['machine'], r['trl_version'])}.", ""]
    if note := shared_note(r):
        lines += [note, ""]
    lines += [f"Model: {s['model']}, {s['parameters']:,} parameters; task {s['task']}; "
              f"{s['workers'] * s['prompts_per_worker']} prompts x {s['group_size']} samples per optimizer step, "
              f"at most {s['max_completion_tokens']} completion tokens, temperature 1, AdamW lr {s['lr']:g} constant, "
              f"grad-norm clip 1, no KL, advantage = reward - group mean, token-level loss, fp32, no gradient "
              f"checkpointing, {s['torch_threads']} torch thread(s). Krill: `krill train local`'s loop "
              f"({s['workers']} simulated workers, rollouts up to {s['krill_config']['staleness']['max_staleness']} "
              f"versions stale, int8 shared-mask compression at density {s['krill_config']['compression']['density']}"
              f"{_dense_start(s['krill_config']['compression'])}, "
              f"{s['krill_config']['rule']['type']} aggregation, per-shard AdamW). TRL: GRPOTrainer, one generation "
              f"batch per step (on-policy), loss_type dapo, scale_rewards none, beta 0, no vLLM.", "",
              f"{s['seeds']} seed(s) per side, alternating; {s['seconds']:.0f} s of training per run"
              + (f" (or {s['max_steps']} steps)" if s["max_steps"] else "")
              + f"; greedy accuracy on {s['eval_n']} held-out prompts every {s['eval_every_s']:.0f} s of training "
              "time and at the end (evaluation and set-up are off the clock). Medians over seeds; "
              "ratios are Krill / TRL.", ""]
    if t is None:
        lines += [f"TRL: {r['trl_note']}", ""]
    lines += ["| figure | Krill | TRL | Krill / TRL |", "|---|---:|---:|---:|",
              f"| optimizer steps per minute | {_num(k['steps_per_min'], '{:.1f}')} | "
              f"{_num(t and t['steps_per_min'], '{:.1f}')} | {_num(ratio.get('steps_per_min'), '{:.2f}')} |",
              f"| steps per CPU-minute (all threads) | {_num(k['steps_per_cpu_min'], '{:.1f}')} | "
              f"{_num(t and t['steps_per_cpu_min'], '{:.1f}')} | {_num(ratio.get('steps_per_cpu_min'), '{:.2f}')} |"]
    for target in s["targets"]:
        key = str(target)
        kt, tt = k["time_to"][key], t["time_to"][key] if t else None
        lines.append(f"| training seconds to {round(100 * target)}% (runs that got there) | {_num(kt)} "
                     f"({k['reached'][key]}/{k['runs']}) | {_num(tt)}"
                     + (f" ({t['reached'][key]}/{t['runs']})" if t else "")
                     + f" | {_num(ratio.get('time_to', {}).get(key), '{:.2f}')} |")
    for target in s["targets"]:
        key = str(target)
        if "crossing" not in k:  # results written before the figure existed
            break
        kc, tc = k["crossing"][key], t["crossing"][key] if t else None
        lines.append(f"| training seconds to {round(100 * target)}%, read between evaluations | {_num(kc, '{:.1f}')} | "
                     f"{_num(tc, '{:.1f}')} | {_num(ratio.get('crossing', {}).get(key), '{:.2f}')} |")
    for target in s["targets"]:
        key = str(target)
        lines.append(f"| optimizer steps to {round(100 * target)}% | {_num(k['steps_to'][key])} | "
                     f"{_num(t['steps_to'][key] if t else None)} | "
                     f"{_num(ratio.get('steps_to', {}).get(key), '{:.2f}')} |")
    lines += [f"| accuracy (%) after {s['seconds']:.0f} s of training | {_pct(k['final_accuracy'])} | "
              f"{_pct(t and t['final_accuracy'])} | {_num(ratio.get('final_accuracy'), '{:.2f}')} |",
              f"| base accuracy (%) | {_pct(k['base_accuracy'])} | {_pct(t and t['base_accuracy'])} | |", ""]
    lines += _protocol_md(r)
    lines += ["## Runs (in the order they ran)", "",
              "| system | seed | steps | train s | steps/min | accuracy (%) | "
              + " | ".join(f"s to {round(100 * x)}%" for x in s["targets"])
              + " | load at start | other processes (cores) |",
              "|---|---:|---:|---:|---:|---:|" + "---:|" * len(s["targets"]) + "---:|---:|"]
    from krill.bench.rl_compare import time_to

    for run in r["runs"]:
        lines.append(f"| {run['system']} | {run['seed']} | {run['steps']} | {run['train_seconds']:.0f} | "
                     f"{run['steps_per_min']:.1f} | {_pct(run['base_accuracy'])} -> {_pct(run['final_accuracy'])} | "
                     + " | ".join(_num(time_to(run["curve"], x)) for x in s["targets"])
                     + f" | {run['load_start']:.1f} | {_num(run['other_cores_busy'], '{:.2f}')} |")
    lines += ["", f"Wall time of the whole benchmark: {r['seconds']:.0f} s."]
    return "\n".join(lines) + "\n"


def _protocol_md(r: dict) -> list[str]:
    p, trl = r.get("protocol"), r["summary"].get("trl")
    if p is None:
        return ["Full protocol (`krill demo`): not measured in this run (pass `--demo-db` with a finished demo's "
                "`krill.db`, once per demo, to add its time to each target).", ""]
    demos = p["demos"]
    lines = [f"## Full protocol ({len(demos)} `krill demo` run{'s' * (len(demos) != 1)})", ""]
    for i, d in enumerate(demos, 1):
        setup = "" if d.get("setup_seconds") is None else (
            f"; set-up to version 1 ({d['setup_seconds']:.0f} s) and the coordinator's evaluations "
            f"({d['eval_seconds']:.0f} s) off the clock")
        if d.get("contributions_per_version") is not None and d.get("prompts_per_contribution"):
            setup += (f"; {d['contributions_per_version']:g} contributions of {d['prompts_per_contribution']} "
                      f"prompts x {d['group_size']} samples folded per version (median)")
        who = ""
        if d.get("seed") is not None:
            who += f"run seed {d['seed']}"
        if d.get("workers"):
            w = d["workers"]
            who += f"{', ' if who else ''}{w['honest']} honest worker(s), {w['attacking']} attacking"
        lines.append(f"- demo {i}: {d['db']}{f' ({who})' if who else ''}: {d['versions']} versions in "
                     f"{d['seconds']:.0f} s{setup}")
    lines += ["", "Protocol time: the coordinator's own clock between publications, less its evaluations, summed from "
              "version 1's publication (version 1's seconds are mostly the workers' start-up, left out as TRL's "
              "set-up is; its own training step is charged as an ordinary version), up to the first of its "
              "evaluations (500 held-out prompts, every few versions) at or above the target; the version after "
              "each evaluation is charged at least an ordinary version's seconds (the workers computed while the "
              "coordinator evaluated); the median over demos (a demo that never got there counts as slowest) "
              "against TRL's median training time to the same target.", "",
              "Not like for like, in the protocol's disfavour and favour: each demo's roles (workers, verifiers, "
              "coordinator, chain, store) run as separate processes on all the machine's cores, while TRL and "
              "`krill train local` run in one process on one torch thread; and a demo version folds the "
              "contributions of every honest worker (the prompts per version above), TRL's step "
              f"{_trl_prompts(r.get('settings') or {})}.", ""]
    lines += _target_table(demos, p["time_to"], trl and trl["time_to"], "time_to", "{:.0f}")
    if "crossing" not in p:  # results written before the figure existed
        return lines + [""]
    lines += ["", "Read between evaluations (linear between the last evaluation below the target and the first at "
              "or above it, on both sides): the first-evaluation figures above lag the crossing by up to one "
              "evaluation interval, a demo's every few versions (10 by default) and TRL's every few seconds of training.", ""]
    lines += _target_table(demos, p["crossing"], trl and trl.get("crossing", {}), "crossing", "{:.1f}")
    return lines + [""]


def _trl_prompts(settings: dict) -> str:
    """TRL's prompts per step (`prompts_per_worker` x `workers` of the in-process runs)."""
    if "prompts_per_worker" in settings and "workers" in settings:
        return f"{settings['prompts_per_worker'] * settings['workers']} prompts"
    return "its own batch"


def _target_table(demos: list[dict], medians: dict, trl_times: dict | None, key: str, fmt: str) -> list[str]:
    """Seconds to each target per demo (`demo[key]`), their median and TRL's, and the ratio."""
    lines = ["| target | " + " | ".join(f"demo {i} s" for i in range(1, len(demos) + 1))
             + " | protocol median s | TRL median s | protocol / TRL |", "|---|" + "---:|" * (len(demos) + 3)]
    for target, seconds in medians.items():
        tt = trl_times.get(target) if trl_times else None
        ratio = None if seconds is None or not tt else seconds / tt
        lines.append(f"| {round(100 * float(target))}% | " + " | ".join(_num(d[key][target], fmt) for d in demos)
                     + f" | {_num(seconds, fmt)} | {_num(tt, fmt)} | {_num(ratio, '{:.2f}')} |")
    return lines


def plot(r: dict, path: Path) -> Path:
    """Accuracy against training time for every run, and steps/min per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"krill": "tab:blue", "trl": "tab:orange"}
    styles = ["-", "--", ":", "-."]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    for run in r["runs"]:
        xs = [row[1] for row in run["curve"]]
        ys = [100 * row[3] for row in run["curve"]]
        ax.plot(xs, ys, color=colours[run["system"]], alpha=0.8, marker=".", linestyle=styles[run["seed"] % 4],
                label=f"{run['system']} seed {run['seed']}")
    for i, demo in enumerate((r.get("protocol") or {}).get("demos", [])):
        ax.plot([row[1] for row in demo["curve"]], [100 * row[3] for row in demo["curve"]], color="tab:green",
                marker=".", linestyle=styles[i % 4], label=f"krill demo {i + 1} (full protocol)")
    for target in r["settings"]["targets"]:
        ax.axhline(100 * target, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("training time (s, evaluation excluded)")
    ax.set_ylabel("greedy accuracy (%)")
    ax.set_title(f"{r['settings']['task']}: accuracy against time")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(True, alpha=0.3)
    names = [f"{run['system']}\nseed {run['seed']}" for run in r["runs"]]
    bx.bar(range(len(names)), [run["steps_per_min"] for run in r["runs"]],
           color=[colours[run["system"]] for run in r["runs"]])
    bx.set_xticks(range(len(names)), names, fontsize=7)
    bx.set_ylabel("optimizer steps per minute")
    bx.set_title("steps/min (in run order)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


@click.command("rl")
@click.option("--full", "size", flag_value="full", help="5 seeds x 10 minutes per run (hours).")
@click.option("--tiny", "size", flag_value="tiny",
              help="A smoke size on a tiny random model (seconds; TRL only when installed).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("bench/results"),
              callback=output_dir,
              show_default=True, help="Directory for rl.json, rl.md and rl.png.")
@click.option("--seeds", type=click.IntRange(1, 100), default=None, help="Seeds per side (default: the size's).")
@click.option("--seconds", type=FiniteFloatRange(min=1.0), default=None,
              help="Training seconds per run (default: the size's).")
@click.option("--threads", type=click.IntRange(0, 256), default=None,
              help="torch CPU threads per run (default 1; 0: torch's default, one per core).")
@click.option("--skip-trl", is_flag=True, help="Run only the Krill side (noted in the output).")
@click.option("--demo-db", "demo_dbs", type=click.Path(dir_okay=False, exists=True, path_type=Path), multiple=True,
              help="A finished `krill demo`'s krill.db: add the full protocol's time to each target (repeat it "
                   "for several demos: the median over them is compared).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON (progress goes to stderr).")
def rl(size: str | None, out_dir: Path, seeds: int | None, seconds: float | None, threads: int | None,
       skip_trl: bool, demo_dbs: tuple[Path, ...], as_json: bool) -> None:
    """Time to accuracy and steps/min: `krill train local` against TRL's GRPOTrainer, matched settings."""
    from krill.bench.rl_compare import run_compare

    size = size or "default"

    def echo(line: str) -> None:
        click.echo(line, err=as_json)

    result = run_compare(size, echo, seeds=seeds, seconds=seconds, threads=threads, skip_trl=skip_trl,
                         demo_dbs=demo_dbs)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / ("rl" if size == "default" else f"rl-{size}")
    text = markdown(result)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    stem.with_suffix(".md").write_text(text)
    png = plot(result, stem.with_suffix(".png"))
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    click.echo(text)
    click.echo(f"wrote {stem.with_suffix('.json')}, {stem.with_suffix('.md')}, {png}")
