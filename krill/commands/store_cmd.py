"""`krill store add|put-block|get|cat|pin|unpin`: the configured content store, for people.

Design decisions:
- A thin layer over `open_store(config.store)`, so what a person sees is exactly what the roles
  get: the same CIDs (Kubo's `--cid-version 1 --raw-leaves`) and the same verification on read.
- Output goes to stdout (`cat`) or a file (`get -o`); `get` refuses to print binary to a terminal.
- `get` and `cat` only read: on an embedded-Kubo repo a running role's node holds they read the blocks
  already in it on disk (`open_store_to_read`, which says so on stderr) instead of stopping with
  `RepoInUseError`. `add`, `put-block`, `pin` and `unpin` need the repo's node and keep the error, with
  advice for this case (the error alone said "each process needs its own store.repo_path").
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from krill.commands.context import current_config


def _store(command: str):
    """The configured store for `krill store <command>`, which writes or pins through it."""
    from krill.store.base import open_store
    from krill.store.embedded_kubo import RepoInUseError

    try:
        return open_store(current_config().store)
    except RepoInUseError as exc:
        raise RepoInUseError(f"krill store {command} writes to the IPFS repo {exc.repo} through its node, which "
                             f"{exc.who} runs: run it once that process has stopped, or against another repo "
                             "(--set store.repo_path=...); get and cat read the repo's blocks meanwhile",
                             exc.repo, exc.holder) from exc


def _reader():
    """The configured store for a command that only reads (the blocks on disk of a repo a running role holds)."""
    from krill.store.base import open_store_to_read

    return open_store_to_read(current_config().store, lambda line: click.echo(line, err=True))


@click.group("store")
def store() -> None:
    """Add and fetch content in the configured content store (verified by CID)."""


@store.command("add")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--pin", is_flag=True, help="Pin the content after adding it.")
def add(path: Path, pin: bool) -> None:
    """Add a file; print its CID (identical to `ipfs add --cid-version 1 --raw-leaves`)."""
    with _store("add") as s:
        click.echo(s.add(path, pin=pin))


@store.command("put-block")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def put_block(path: Path) -> None:
    """Store a file of at most 1 MiB as one raw block; print its CID."""
    from krill.store.cid import MAX_BLOCK_SIZE

    data = path.read_bytes()
    if len(data) > MAX_BLOCK_SIZE:  # the store's own refusal names its Python method ("use add()")
        raise click.BadParameter(f"{path} is {len(data)} bytes; one raw block holds at most {MAX_BLOCK_SIZE}: "
                                 f"store it with `krill store add {path}`", param_hint="PATH")
    with _store("put-block") as s:
        click.echo(s.put_block(data))


@store.command("get")
@click.argument("cid")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write to this file.")
@click.option("--max-bytes", type=click.IntRange(0), help="Refuse objects larger than this.")
def get(cid: str, output: Path | None, max_bytes: int | None) -> None:
    """Fetch CID, verify it, and write it to --output (or stdout when not a terminal)."""
    if output is not None and not output.expanduser().resolve().parent.is_dir():
        raise click.BadParameter(f"the folder {output.expanduser().resolve().parent} does not exist",
                                 param_hint="--output")
    with _reader() as s:
        data = s.get(cid, max_bytes=max_bytes)
    if output is not None:
        output.write_bytes(data)
        click.echo(f"{len(data)} bytes written to {output}", err=True)
    elif sys.stdout.isatty():
        raise click.UsageError("refusing to print content to a terminal; use -o FILE or `krill store cat`")
    else:
        click.echo(data, nl=False)


@store.command("cat")
@click.argument("cid")
def cat(cid: str) -> None:
    """Fetch CID, verify it, and print it."""
    with _reader() as s:
        click.echo(s.get(cid), nl=False)


@store.command("pin")
@click.argument("cid")
def pin(cid: str) -> None:
    """Keep CID and everything under it."""
    with _store("pin") as s:
        s.pin(cid)


@store.command("unpin")
@click.argument("cid")
def unpin(cid: str) -> None:
    """Let CID be garbage-collected."""
    with _store("unpin") as s:
        s.unpin(cid)
