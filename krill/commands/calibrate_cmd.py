"""`krill calibrate`: measure the verifier's statistics on honest work and write the tolerance table.

Design decisions:
- The work is `krill.calibration.measure` (honest contributions through the protocol's own
  functions) and `krill.calibration.table` (margin rule, distribution, TOML); this module only
  parses options, shows progress (one dense line per few contributions) and prints the result.
- The default run is the one that produced the shipped table (`krill/protocol/calibration.toml`):
  the default base model, >= 1,000 checks over batch sizes {2,4,8,16}, torch threads {1,2} for
  producer and replayer, and the codecs fp16, bf16 and int8.
- Exit status 1 when any honest check fails at the chosen tolerances (the cosine cap was hit):
  the table is still written, so the distribution can be read.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from krill.commands.context import output_file


def _ints(ctx: click.Context, param: click.Parameter, text: str) -> tuple[int, ...]:
    """A click callback: `--batches` / `--threads` as positive integers (click names the option refused)."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r}: give comma-separated integers, e.g. 2,4,8") from None
    if not values or min(values) < 1:
        raise click.BadParameter(f"{text!r}: give positive integers")
    _once_each(text, values)
    return values


def _once_each(text: str, values: tuple) -> None:
    """Refuse a value listed twice: it was measured twice over, for one entry of the table."""
    twice = sorted({v for v in values if values.count(v) > 1}, key=values.index)
    if twice:
        raise click.BadParameter(f"{text!r}: {', '.join(map(str, twice))} given more than once")


def _codecs(ctx: click.Context, param: click.Parameter, text: str) -> tuple[str, ...]:
    values = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [v for v in values if v not in ("fp16", "bf16", "int8")]
    if not values or unknown:
        raise click.BadParameter(f"{text!r}: choose among fp16, bf16, int8")
    _once_each(text, values)
    return values


def _q3(q: dict) -> str:
    """p50 / p99 / max of one statistic."""
    return "-" if q.get("count", 0) == 0 else " / ".join(f"{q[k]:.2g}" for k in ("p50", "p99", "max"))


def _print(console, table: dict) -> None:
    from rich.table import Table

    out = Table(title=f"honest checks by condition: {table['checks']} checks; quantiles p50 / p99 / max "
                "(gradient statistics over non-zero gradients)", title_justify="left")
    for name in ("batch", "threads\nwork/ver", "codec", "checks", "token\nmismatch", "|Δ log-prob|\nre-sampled",
                 "|Δ log-prob|\nteacher-forced", "1 - cosine", "relative norm\ndifference", "zero\ngradients"):
        out.add_column(name, justify="right", no_wrap=True)
    for row in table["distribution"]:
        out.add_row(str(row["batch"]), f"{row['producer_threads']}/{row['replayer_threads']}", row["codec"],
                    str(row["checks"]), f"{row['token_mismatches'].get('max', 0):g}", _q3(row["max_logprob_diff"]),
                    _q3(row["teacher_logprob_diff"]), _q3(row["one_minus_cosine"]), _q3(row["rel_norm_diff"]),
                    str(row["zero_gradient_checks"]))
    console.print(out)
    tol = Table(title="chosen tolerances", title_justify="left")
    for name in ("section", "logprob_abs_tol", "grad_min_cosine", "grad_norm_rel_tol", "exact_resample"):
        tol.add_column(name, justify="right", no_wrap=True)
    sections = [(f"codec.{c}.verify", s["verify"]) for c, s in table["codec"].items()] + [("verify", table["verify"])]
    for name, v in sections:
        tol.add_row(name, f"{v['logprob_abs_tol']:g}", f"{v['grad_min_cosine']:.6g}", f"{v['grad_norm_rel_tol']:g}",
                    str(v["exact_resample"]).lower())
    console.print(tol)
    console.print(f"rule: {table['rule']}", markup=False, soft_wrap=True)
    console.print(f"{table['token_mismatch_note']}; honest failures at these tolerances: {table['honest_failures']} "
                  f"of {table['checks']} (at the run spec defaults: {table['honest_failures_at_spec_defaults']}); "
                  f"{table['run']['contributions']} contributions in {table['run']['seconds']:g} s", markup=False, soft_wrap=True)


@click.command("calibrate")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), default=Path("calibration.toml"),
              callback=output_file,
              show_default=True, help="Where to write the table (TOML).")
@click.option("--checks", type=click.IntRange(1, 1_000_000), default=1000, show_default=True,
              help="At least this many honest checks (one stage comparison of one replayed contribution).")
@click.option("--model", "model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Local HF causal-LM directory (default: the built-in base model, built on first use).")
@click.option("--task", "task_name", default=None, help="Task (default: the one the model was warm-started on).")
@click.option("--batches", default="2,4,8,16", show_default=True, callback=_ints,
              help="Prompts per contribution to measure.")
@click.option("--codecs", default="fp16,bf16,int8", show_default=True, callback=_codecs,
              help="Gradient codecs to measure.")
@click.option("--threads", "thread_counts", default="1,2", show_default=True, callback=_ints,
              help="torch thread counts, for producer and replayer each.")
@click.option("--versions", type=click.IntRange(1, 20), default=3, show_default=True,
              help="Model versions per run spec (each folded from the previous one's honest gradients).")
@click.option("--records", "records_path", type=click.Path(dir_okay=False, path_type=Path), callback=output_file,
              help="Also write every check's figures as JSON lines here.")
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON instead of a readable summary.")
def calibrate(out: Path, checks: int, model_dir: Path | None, task_name: str | None, batches: tuple[int, ...],
              codecs: tuple[str, ...], thread_counts: tuple[int, ...], versions: int, records_path: Path | None,
              as_json: bool) -> None:
    """Measure the verifier's comparison statistics on honest work and write the tolerance table."""
    import sys
    import time

    from rich.console import Console
    from transformers.utils import logging as hf_logging

    from krill.bench_env import machine_facts
    from krill.calibration.measure import Plan, measure
    from krill.calibration.table import build_table, write_table

    hf_logging.disable_progress_bar()
    console = Console(stderr=as_json, width=None if sys.stdout.isatty() else 150)
    plan = Plan(checks=checks, batches=batches, codecs=codecs, producer_threads=thread_counts,
                replayer_threads=thread_counts, versions=versions, task=task_name)
    if model_dir is None:
        from krill.model.base import ensure_base_model

        model_dir = ensure_base_model(progress=lambda step, loss, acc: console.print(
            f"building the base model: step {step}, loss {loss:.3f}, accuracy {acc:.1%}"))
    started = time.perf_counter()
    console.print(f"calibrating on {model_dir}: {plan.contributions} contributions, "
                  f"{plan.contributions * plan.checks_per_contribution} checks")

    def progress(done: int, total: int, records) -> None:
        if done % 8 and done != total:
            return
        last = records[-1]
        console.print(f"{done}/{total} contributions, {len(records)} checks, {time.perf_counter() - started:.0f} s; "
                      f"now batch {last.batch}, codec {last.codec}, version {last.version}")

    records, meta = measure(model_dir, plan, progress)
    table = build_table(records, meta, machine_facts())
    write_table(table, out)
    if records_path is not None:
        records_path.parent.mkdir(parents=True, exist_ok=True)
        records_path.write_text("".join(json.dumps(r.as_dict(), sort_keys=True) + "\n" for r in records))
    if as_json:
        click.echo(json.dumps(table, sort_keys=True))
    else:
        _print(console, table)
        console.print(f"wrote {out}")
    if table["honest_failures"]:
        from krill.errors import KrillError

        raise KrillError(f"{table['honest_failures']} honest checks fail at the chosen tolerances (the cosine cap "
                         f"was reached); read the distribution in {out}")
