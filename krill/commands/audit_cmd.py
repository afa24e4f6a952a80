"""`krill audit --version V | --last N | --all`: recompute published versions and compare them with the chain.

Design decisions:
- Needs only chain + store access (config: chain, store, run.id); no keystore, no database.
- Prints one table per version (check, result, detail) and a closing line; `--json` prints the
  reports as strict JSON (`AuditReport.to_dict` turns NaN and infinity into null, and
  `allow_nan=False` fails loudly rather than print what a strict parser refuses). Exit status 1
  when any check of any audited version fails, 0 when all match, so the command can gate scripts
  and CI.
- The audit only reads the store: on an embedded-Kubo repo a running role's node holds it reads the
  blocks already there on disk (`open_public_run(read_held_repo=True)`, said once on stderr; it stopped
  with `RepoInUseError`). Content not there fails the checks that read it as "not available", as any
  store fault does: it is never taken as passing. `krill release` adds to the store and keeps the error.
- Heavy imports (web3, torch) happen inside the command.
"""

from __future__ import annotations

import json
from contextlib import ExitStack

import click

from krill.commands.context import current_config


def open_public_run(stack: ExitStack, read_held_repo: bool = False):
    """(config, read-only chain, store, run spec) of the configured run, from chain + store alone.
    `read_held_repo`, for a caller that only reads: an embedded-Kubo repo a running role holds is read from
    its blocks on disk (`krill.store.base.open_store_to_read`)."""
    from krill.protocol.state import load_run
    from krill.runtime import connect_chain, open_configured_store, run_id_of
    from krill.store.base import open_store_to_read

    config = current_config()
    run_id = run_id_of(config)
    chain = connect_chain(config)
    store = stack.enter_context(open_store_to_read(config.store, lambda line: click.echo(line, err=True))
                                if read_held_repo else open_configured_store(config))
    return config, chain, store, load_run(chain, store, run_id)


def _print_report(console, report) -> None:
    from rich.table import Table

    table = Table(title=f"audit of version {report.version}", title_justify="left", show_lines=False)
    table.add_column("check", no_wrap=True)
    table.add_column("result", no_wrap=True)
    table.add_column("detail", overflow="fold")
    for check in report.checks:
        table.add_row(check.name, "[green]ok[/]" if check.ok else "[bold red]MISMATCH[/]", check.detail)
    console.print(table)


@click.command("audit")
@click.option("--version", "version", type=click.IntRange(1, None), help="Version to audit (>= 1).")
@click.option("--all", "all_versions", is_flag=True, help="Audit every published version 1..latest.")
@click.option("--last", "last", type=click.IntRange(1, None), help="Audit the N most recent published versions.")
@click.option("--json", "as_json", is_flag=True, help="Print the reports as JSON.")
def audit(version: int | None, all_versions: bool, last: int | None, as_json: bool) -> None:
    """Recompute a version from its aggregation record, parent and contributions; exit 1 on a mismatch."""
    from rich.console import Console

    from krill.audit import AuditSource, audit_versions

    if sum((version is not None, all_versions, last is not None)) != 1:
        raise click.UsageError("give exactly one of --version V, --last N and --all")
    with ExitStack() as stack:
        config, chain, store, spec = open_public_run(stack, read_held_repo=True)
        source = AuditSource(chain, store, spec, from_block=config.chain.deploy_block)
        latest = source.latest_version()
        if version is not None:
            versions = [version]
        else:
            versions = range(1 if all_versions else max(1, latest - last + 1), latest + 1)
        reports = audit_versions(source, versions)
    ok = all(r.ok for r in reports)
    if as_json:
        data = {"ok": ok, "versions": [r.to_dict() for r in reports]}
        click.echo(json.dumps(reports[0].to_dict() if version is not None else data, sort_keys=True, allow_nan=False))
    else:
        console = Console(width=max(120, Console().width), highlight=False)
        for report in reports:
            _print_report(console, report)
        if not reports:
            click.echo("no published versions to audit")
        for report in reports:
            failed = report.failures
            click.echo(f"version {report.version}: " + ("all checks match" if report.ok else
                       f"{len(failed)} MISMATCH: " + ", ".join(c.name for c in failed)))
    if not ok:
        click.get_current_context().exit(1)
