"""`krill demo`: the embedded default, on one machine, cleaned up on exit (also on Ctrl-C).

Today it starts its own Anvil on a free port, deploys the contracts and plays one scripted protocol
round (stake, commit, attest, slash, publishVersion, settle, claim), printing what the chain says.
"""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command()
@click.option("--summary", "summary_path", type=click.Path(dir_okay=False), help="Also write the summary as JSON here.")
def demo(summary_path: str | None) -> None:
    """Run Krill end to end on a local chain and print what the chain says."""
    from rich.console import Console
    from rich.table import Table

    from krill.chain.anvil import AnvilProcess
    from krill.demo.scripted_round import run_scripted_round

    console = Console()
    with AnvilProcess.start() as node:
        console.print(f"[bold]krill demo[/bold]: local chain at {node.rpc_url} (Anvil pid {node.pid})")
        report = run_scripted_round(node.rpc_url, echo=lambda step, text: console.print(f"  [cyan]{step:9}[/cyan] {text}"))
    table = Table(title="what the chain says")
    table.add_column("field")
    table.add_column("value")
    for key, value in report.summary.items():
        table.add_row(key, str(value))
    console.print(table)
    if summary_path:
        Path(summary_path).write_text(json.dumps(report.summary, indent=2), encoding="utf-8")
