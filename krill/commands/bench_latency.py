"""`krill bench latency`: the protocol with its workers and verifiers 0-300 ms from their chain node.

Design decisions:
- The command picks a size, runs `krill.bench.latency` (one demo run per link profile) and writes
  `latency.json`, `latency.md` and `latency.png` under `--out` (`latency-tiny.*` for `--tiny`, so a
  smoke run never overwrites the committed results; `latency-<profile>.*` for `--link`, one profile alone).
- Progress goes one line at a time; with `--json` to stderr, and stdout carries only the JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from krill.commands.bench_cmd import output_dir


@click.command("latency")
@click.option("--tiny", is_flag=True, help="A smoke size: one link (100 ms one way), 30 s of training.")
@click.option("--link", default=None, metavar="PROFILE",
              help="Run one link profile of the default size alone (0, 100, 300, or '100 ms, stalls and resets'): "
                   "alternate runs before and after a change on the same machine.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("bench/results"),
              callback=output_dir,
              show_default=True, help="Directory for latency.json, latency.md and latency.png.")
@click.option("--keep", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Run the demos in this directory and keep them (default: a temporary one, removed).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON (progress goes to stderr).")
def latency(tiny: bool, link: str | None, out_dir: Path, keep: Path | None, as_json: bool) -> None:
    """Versions/min, outcomes, verifier verdicts and chain requests per commit with workers and verifiers on slow, lossy links."""
    from krill.bench.latency import markdown, plots, profile_named, run_latency
    from krill.bench.report import write

    if tiny and link is not None:
        raise click.UsageError("--tiny and --link: choose one")
    if link is not None:
        try:
            profile_named(link)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--link") from None
    result = run_latency("tiny" if tiny else "default", lambda line: click.echo(line, err=as_json), keep, link)
    stem = "latency" if link is None else "latency-" + profile_named(link).replace(",", "").replace(" ", "-")
    text, paths = write(result, out_dir, stem, markdown, plots)
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True, default=str))
        return
    click.echo(text)
    click.echo("wrote " + ", ".join(map(str, paths)))
