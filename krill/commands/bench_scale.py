"""`krill bench scale`: 4 to 32 workers as processes on Anvil: throughput, index lag, coordinator time, memory.

Design decisions:
- The command picks a size, runs `krill.bench.scale` (one demo run per worker count) and writes
  `scale.json`, `scale.md` and `scale.png` under `--out` (`scale-tiny.*` for `--tiny`, so a smoke
  run never overwrites the committed results).
- Progress goes one line at a time; with `--json` to stderr, and stdout carries only the JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from krill.commands.bench_cmd import output_dir


@click.command("scale")
@click.option("--tiny", is_flag=True, help="A smoke size: one point of 2 workers, 45 s of training.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("bench/results"),
              callback=output_dir,
              show_default=True, help="Directory for scale.json, scale.md and scale.png.")
@click.option("--keep", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Run the demo in this directory and keep it (default: a temporary one, removed).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON (progress goes to stderr).")
def scale(tiny: bool, out_dir: Path, keep: Path | None, as_json: bool) -> None:
    """Accepted commits/s, index lag, coordinator s/version and peak memory per role for 4 to 32 worker processes."""
    from krill.bench.report import write
    from krill.bench.scale import markdown, plots, run_scale

    result = run_scale("tiny" if tiny else "default", lambda line: click.echo(line, err=as_json), keep)
    text, paths = write(result, out_dir, "scale", markdown, plots)
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True, default=str))
        return
    click.echo(text)
    click.echo("wrote " + ", ".join(map(str, paths)))
