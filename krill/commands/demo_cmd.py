"""`krill demo`: the embedded default, on one machine, cleaned up on exit (also on Ctrl-C, SIGTERM, SIGHUP).

By default it runs the whole protocol (see `krill.demo.orchestrate`): local chain, store and
database, base model, a coordinator, workers (one forging rewards) and verifiers as separate
processes, until a time or version budget, then the eval table, per-worker outcomes and the
release CID. `--chain-round` instead plays one scripted contract round (stake, commit, attest,
slash, publishVersion, settle, claim) and prints what the chain says: a quick smoke test of the
chain layer.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from krill.commands.context import FiniteFloatRange


@click.command()
@click.option("--summary", "summary_path", type=click.Path(dir_okay=False), help="Also write the summary JSON here.")
@click.option("--minutes", type=FiniteFloatRange(0.1, 600), default=12.0, show_default=True,
              help="Training time budget after set-up.")
@click.option("--versions", type=click.IntRange(1), default=400, show_default=True, help="Version budget.")
@click.option("--workers", type=click.IntRange(1, 16), default=4, show_default=True, help="Worker processes.")
@click.option("--adversaries", type=click.IntRange(0, 16), default=1, show_default=True,
              help="How many workers forge their rewards.")
@click.option("--verifiers", type=click.IntRange(1, 8), default=2, show_default=True, help="Verifier processes.")
@click.option("--workdir", type=click.Path(file_okay=False), help="Work directory (default: a new one under $KRILL_HOME/demo).")
@click.option("--spec", "spec_file", type=click.Path(dir_okay=False, exists=True),
              help="TOML file of run-spec overrides for the demo's run.")
@click.option("--model", "model_dir", type=click.Path(file_okay=False, exists=True),
              help="Local HF model directory to post-train (default: the built-in base model).")
@click.option("--explorer-port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Port of the explorer the demo serves (0: a free one).")
@click.option("--no-explorer", is_flag=True, help="Do not start the explorer.")
@click.option("--serve", is_flag=True, help="Keep the explorer serving the finished run until Ctrl-C.")
@click.option("--pipelined", is_flag=True,
              help="Workers commit twice per version and versions fold what came in (gradients about one "
                   "version stale) instead of waiting for every honest worker's commit.")
@click.option("--chain-round", is_flag=True, help="Only play one scripted contract round and print what the chain says.")
def demo(summary_path, minutes, versions, workers, adversaries, verifiers, workdir, spec_file, model_dir,
         explorer_port, no_explorer, serve, pipelined, chain_round) -> None:
    """Run Krill end to end on this machine and print the outcome."""
    from rich.console import Console

    console = Console()
    if summary_path and not Path(summary_path).expanduser().resolve().parent.is_dir():
        from krill.errors import ConfigError

        # Checked now: the summary is written at the very end, after minutes of work.
        raise ConfigError(f"--summary {summary_path}: the folder {Path(summary_path).expanduser().resolve().parent} "
                          "does not exist")
    if chain_round:
        summary = _chain_round(console)
    else:
        import tomllib

        from krill.config import krill_home
        from krill.demo.disk import earlier_demos, gigabytes
        from krill.demo.orchestrate import DemoConfig, check_spec, run_demo
        from krill.errors import ConfigError

        if adversaries > workers:
            raise ConfigError(f"--adversaries {adversaries} exceeds --workers {workers}")
        try:
            overrides = tomllib.loads(Path(spec_file).read_text(encoding="utf-8")) if spec_file else {}
        except OSError as exc:  # a device that fails reads, no permission
            raise ConfigError(f"--spec {spec_file} cannot be read: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"--spec {spec_file} is not valid TOML: not UTF-8 text ({exc.reason} at byte "
                              f"{exc.start})") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"--spec {spec_file} is not valid TOML: {exc}") from None
        config = DemoConfig(workers=workers, adversaries=adversaries, verifiers=verifiers, minutes=minutes,
                            versions=versions, spec_overrides=overrides,
                            model_dir=Path(model_dir) if model_dir else None,
                            explorer_port=None if no_explorer else explorer_port, serve=serve,
                            fresh_gradients=not pipelined)
        check_spec(config, f"--spec {spec_file}" if spec_file else "the demo's run spec")  # before anything starts
        where = Path(workdir) if workdir else krill_home() / "demo" / time.strftime("%Y%m%d-%H%M%S")
        console.print(f"[bold]krill demo[/bold] in {where}")
        earlier = None if workdir else earlier_demos(where.parent, where)
        if earlier:
            console.print(f"{len(earlier)} earlier demo(s) in {where.parent} take "
                          f"{gigabytes(sum(b for _, b in earlier))}; delete the ones you no longer need", highlight=False)
        summary = run_demo(config, where, echo=lambda line: console.print(line, highlight=False),
                           on_summary=lambda s: _print_summary(console, s), earlier=earlier)
    if summary_path:
        Path(summary_path).write_text(json.dumps(summary, indent=2), encoding="utf-8")


def _print_summary(console, summary: dict) -> None:
    from rich.table import Table

    evals = Table(title="evaluation (greedy accuracy, held-out prompts)")
    for col in ("model", "accuracy"):
        evals.add_column(col)
    evals.add_row("base (version 0)", f"{summary['base_accuracy']:.3f}")
    evals.add_row(f"post-trained (version {summary['versions']})", f"{summary['final_accuracy']:.3f}")
    console.print(evals)
    table = Table(title="workers")
    for col in ("name", "behavior", "accepted", "rejected", "slashed", "trust", "rewards"):
        table.add_column(col)
    for w in summary["workers"]:
        table.add_row(w["name"], w["behavior"], str(w["accepted"]), str(w["rejected"]), str(w["slashed"]),
                      f"{w['trust']:.3f}" if w["trust"] is not None else "-", f"{w['rewards']:.2f}")
    console.print(table)
    v = summary["verifications"]
    console.print(f"verifications: {v['checked']} checked, {v['failed']} failed; "
                  f"release CID [bold]{summary['release_cid']}[/bold]; wall time {summary['wall_seconds'] / 60:.1f} min")
    if summary.get("explorer"):
        console.print(f"explorer: {summary['explorer']}" + ("" if summary.get("serving") else " (stopped with the demo; "
                      "`krill demo --serve` keeps it up, or run `krill explorer --db sqlite:///<workdir>/krill.db`)"))


def _chain_round(console) -> dict:
    from rich.table import Table

    from krill.chain.anvil import AnvilProcess
    from krill.demo.processes import interrupt_on_signals
    from krill.demo.scripted_round import run_scripted_round

    with interrupt_on_signals(), AnvilProcess.start() as node:
        console.print(f"[bold]krill demo --chain-round[/bold]: local chain at {node.rpc_url} (Anvil pid {node.pid})")
        report = run_scripted_round(node.rpc_url, echo=lambda step, text: console.print(f"  [cyan]{step:9}[/cyan] {text}"))
    table = Table(title="what the chain says")
    table.add_column("field")
    table.add_column("value")
    for key, value in report.summary.items():
        table.add_row(key, str(value))
    console.print(table)
    return report.summary
