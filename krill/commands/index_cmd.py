"""`krill index sync|rebuild|status`: keep the local index of chain + store up to date.

Design decisions:
- Everything comes from the effective configuration: chain (RPC URL, protocol address, deploy
  block, confirmations, retries), store and database. The index starts at `chain.deploy_block`.
- `sync` makes one pass (or keeps following with `--follow` until Ctrl-C); `rebuild` drops only
  the index tables and replays from the deploy block; role state is never touched. It is the
  remedy `SchemaVersionError` names for an index of another schema version, so it opens the
  database with `rebuilding_index`, which resets such index tables instead of refusing them.
- `sync` and `rebuild` only read the store: on an embedded-Kubo repo a running role's node holds (a coordinator's,
  a worker's) it reads the blocks already there on disk (`open_store_to_read`, said once on stderr), and
  content not there is recorded unavailable, retried by a later sync. They stopped with `RepoInUseError`.
  `sync --follow` keeps that error: each pass would retry that content at once, without a node, and use up
  its fetch attempts (`max_fetch_attempts`) in as many polls; `--no-store` follows the events alone.
- Output is one line per pass (blocks, events, content fetched); `--json` prints machine-readable
  reports, every pass. `--follow` in text does not repeat a pass that found nothing new: the first
  says so and that it stays quiet until there is something, where every poll (one a second by
  default) printed "no new confirmed block" again. web3 and SQLAlchemy are imported inside the commands so `krill --help` stays instant.
"""

from __future__ import annotations

import json
from contextlib import ExitStack

import click

from krill.commands.context import FiniteFloatRange, current_config


def _open(stack: ExitStack, with_store: bool = True, rebuilding: bool = False, read_held_repo: bool = False):
    """(indexer, config); `read_held_repo`: a repo a running role holds is read from its blocks on disk."""
    from krill.db.indexer import Indexer
    from krill.runtime import connect_chain, open_configured_database

    config = current_config()
    # The one way every command connects: an unreachable node is a one-line error, a wrong chain id refused;
    # a database that cannot be opened is one line too.
    chain = connect_chain(config)
    db = stack.enter_context(open_configured_database(config, rebuilding_index=rebuilding))
    store = None
    if with_store:
        from krill.store.base import open_store, open_store_to_read

        store = stack.enter_context(open_store_to_read(config.store, lambda line: click.echo(line, err=True))
                                    if read_held_repo else open_store(config.store))
    indexer = Indexer(chain, db, store, start_block=config.chain.deploy_block,
                      confirmations=config.chain.confirmations_on(chain.w3.eth.chain_id))
    return indexer, config


def _line(report) -> str:
    fetched = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted(report.fetched.items())) or "nothing fetched"
    if report.next_block > report.from_block:
        span = f"blocks {report.from_block}..{report.next_block - 1} (confirmed head {report.safe_head})"
    else:  # up to date, or a start block past the head: "blocks 10..9" named a range that is not one
        span = f"no new confirmed block (next block {report.next_block}, confirmed head {report.safe_head})"
    return f"{span}: {report.events} events in {report.batches} batches; {fetched}"


def _report_json(report) -> str:
    return json.dumps({"from_block": report.from_block, "next_block": report.next_block,
                       "safe_head": report.safe_head, "events": report.events, "batches": report.batches,
                       "fetched": report.fetched}, sort_keys=True)


def following_printer(as_json: bool, echo):
    """What `sync --follow` prints of each pass (module docstring): JSON every pass; in text, a pass that found
    nothing new only when the pass before it found something."""
    quiet = False

    def show(report) -> None:
        nonlocal quiet
        if as_json:
            echo(_report_json(report))
            return
        idle = report.next_block == report.from_block and not report.events and not report.fetched
        if idle and quiet:
            return
        echo(_line(report) + ("; quiet until there is something new" if idle else ""))
        quiet = idle

    return show


@click.group()
def index() -> None:
    """The local index of contract events, headers and manifests (SQLite or PostgreSQL)."""


@index.command("sync")
@click.option("--follow", is_flag=True, help="Keep indexing new blocks until interrupted.")
@click.option("--poll", "poll_s", type=FiniteFloatRange(0.05, 3600), default=None,
              help="Seconds between passes with --follow (default: chain.poll_interval_s).")
@click.option("--no-store", is_flag=True, help="Index chain events only; leave headers and manifests pending.")
@click.option("--json", "as_json", is_flag=True, help="Print each pass as a JSON line.")
def sync(follow: bool, poll_s: float | None, no_store: bool, as_json: bool) -> None:
    """Index confirmed blocks not yet indexed, then fetch pending headers and manifests."""
    from krill.store.embedded_kubo import RepoInUseError

    with ExitStack() as stack:
        try:
            indexer, config = _open(stack, with_store=not no_store, read_held_repo=not follow)
        except RepoInUseError as exc:  # only with --follow (module docstring)
            raise RepoInUseError(f"krill index sync --follow fetches content as it is published, which needs the "
                                 f"node of the IPFS repo {exc.repo}, and {exc.who} runs that node: run `krill index "
                                 "sync` without --follow (one pass, reading the blocks already in the repo), or follow "
                                 "the events alone with --follow --no-store", exc.repo, exc.holder) from exc

        if not follow:
            report = indexer.sync()
            click.echo(_report_json(report) if as_json else _line(report))
            return
        try:
            indexer.follow(poll_s or config.chain.poll_interval_s, on_pass=following_printer(as_json, click.echo))
        except KeyboardInterrupt:
            click.echo("stopped", err=True)


@index.command("rebuild")
@click.option("--no-store", is_flag=True, help="Rebuild from chain events only.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def rebuild(no_store: bool, as_json: bool) -> None:
    """Drop the index tables and replay the chain from the deploy block (role state is kept)."""
    with ExitStack() as stack:
        indexer, _ = _open(stack, with_store=not no_store, rebuilding=True, read_held_repo=True)
        report = indexer.rebuild()
        click.echo(_report_json(report) if as_json else "rebuilt: " + _line(report))


@index.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(as_json: bool) -> None:
    """Show the index cursor against the chain, row counts and content fetch states."""
    with ExitStack() as stack:
        indexer, _ = _open(stack, with_store=False)
        st = indexer.status()
        data = {"chain_id": st.chain_id, "protocol": st.protocol, "next_block": st.next_block,
                "safe_head": st.safe_head, "lag_blocks": st.lag_blocks, "rows": st.rows, "headers": st.headers,
                "manifests": st.manifests}
        if as_json:
            click.echo(json.dumps(data, sort_keys=True))
            return
        if st.next_block is None:
            click.echo(f"empty index (confirmed head {st.safe_head}): run `krill index sync`")
            return
        click.echo(f"contract {st.protocol} on chain {st.chain_id}: next block {st.next_block}, "
                   f"confirmed head {st.safe_head}, {st.lag_blocks} blocks behind")
        click.echo("rows       " + ", ".join(f"{k} {v}" for k, v in sorted(st.rows.items())))
        click.echo("headers    " + (", ".join(f"{k} {v}" for k, v in sorted(st.headers.items())) or "none"))
        click.echo("manifests  " + (", ".join(f"{k} {v}" for k, v in sorted(st.manifests.items())) or "none"))
