"""`krill bench compression`: bytes per contribution and per version against dense fp32; accuracy at equal budget.

Design decisions:
- The command picks a size, runs `krill.bench.compression` (in-process) and writes
  `compression.json`, `compression.md` and `compression.png` under `--out`
  (`compression-tiny.*` for `--tiny`, so a smoke run never overwrites the committed results).
- Progress goes one line at a time; with `--json` to stderr, and stdout carries only the JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from krill.commands.bench_cmd import output_dir


@click.command("compression")
@click.option("--tiny", is_flag=True, help="A smoke size: tiny random model, two settings, two versions (seconds).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("bench/results"),
              callback=output_dir,
              show_default=True, help="Directory for compression.json, compression.md and compression.png.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON (progress goes to stderr).")
def compression(tiny: bool, out_dir: Path, as_json: bool) -> None:
    """Wire bytes per contribution and version per compression setting vs dense fp32, and accuracy."""
    from krill.bench.compression import markdown, plots, run_compression
    from krill.bench.report import write

    result = run_compression("tiny" if tiny else "default", lambda line: click.echo(line, err=as_json))
    text, paths = write(result, out_dir, "compression", markdown, plots)
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True, default=str))
        return
    click.echo(text)
    click.echo("wrote " + ", ".join(map(str, paths)))
