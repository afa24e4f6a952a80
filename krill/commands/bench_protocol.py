"""`krill bench protocol`: a worker's and the coordinator's wall time by phase, and the protocol overhead.

Design decisions:
- The command picks a size, runs `krill.bench.protocol` (a demo run with every role as its own
  process) and writes `protocol.json`, `protocol.md` and `protocol.png` under `--out`
  (`protocol-tiny.*` for `--tiny`, so a smoke run never overwrites the committed results).
- Progress goes one line at a time; with `--json` to stderr, and stdout carries only the JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from krill.commands.bench_cmd import output_dir


@click.command("protocol")
@click.option("--tiny", is_flag=True, help="A smoke size: tiny random model, 2 workers, 45 s of training.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("bench/results"),
              callback=output_dir,
              show_default=True, help="Directory for protocol.json, protocol.md and protocol.png.")
@click.option("--keep", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Run the demo in this directory and keep it (default: a temporary one, removed).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON (progress goes to stderr).")
def protocol(tiny: bool, out_dir: Path, keep: Path | None, as_json: bool) -> None:
    """Worker wall time by phase (rollout ... chain confirmation, waiting), coordinator time per version."""
    from krill.bench.protocol import markdown, plots, run_protocol
    from krill.bench.report import write

    result = run_protocol("tiny" if tiny else "default", lambda line: click.echo(line, err=as_json), keep)
    text, paths = write(result, out_dir, "protocol", markdown, plots)
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True, default=str))
        return
    click.echo(text)
    click.echo("wrote " + ", ".join(map(str, paths)))
