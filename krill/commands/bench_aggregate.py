"""`krill bench aggregate`: each rule's time vs the mean (n in {8, 16, 64}, d up to 8M); agreement with ByzFL.

Design decisions:
- The command picks a size, runs `krill.bench.aggregate` (in-process) and writes
  `aggregate.json`, `aggregate.md` and `aggregate.png` under `--out` (`aggregate-tiny.*` for
  `--tiny`, so a smoke run never overwrites the committed results).
- Progress goes one line at a time; with `--json` to stderr, and stdout carries only the JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from krill.commands.bench_cmd import output_dir


@click.command("aggregate")
@click.option("--tiny", is_flag=True, help="A smoke size: small shards, two draws per agreement cell (seconds).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("bench/results"),
              callback=output_dir,
              show_default=True, help="Directory for aggregate.json, aggregate.md and aggregate.png.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON (progress goes to stderr).")
def aggregate(tiny: bool, out_dir: Path, as_json: bool) -> None:
    """Time per aggregation rule vs the plain mean; trimmed mean and median vs ByzFL and numpy."""
    from krill.bench.aggregate import markdown, plots, run_aggregate
    from krill.bench.report import write

    result = run_aggregate("tiny" if tiny else "default", lambda line: click.echo(line, err=as_json))
    text, paths = write(result, out_dir, "aggregate", markdown, plots)
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True, default=str))
        return
    click.echo(text)
    click.echo("wrote " + ", ".join(map(str, paths)))
