"""Helpers for the tests of the commands that read an embedded-Kubo repo another process's node holds."""

from __future__ import annotations

from pathlib import Path


def held_note(pid: int, repo: Path) -> str:
    """The line a command prints on stderr when it reads the blocks of `repo`, which pid `pid`'s node holds."""
    return (f"note: pid {pid} holds the IPFS repo {Path(repo).resolve()} (its node runs there), so this reads the "
            "blocks already in the repo on disk, without a node: content not in this repo cannot be fetched from the "
            "network now\n")


def copy_blocks(local_store: Path, repo: Path) -> int:
    """Copy every block of the local store at `local_store` into the Kubo repo `repo`'s flatfs, as the holding
    node's process writes its blocks (`EmbeddedKuboStore._write_block`); returns how many."""
    from krill.store.embedded_kubo import _flatfs_path

    count = 0
    for path in (Path(local_store) / "blocks").glob("*/*"):
        target = _flatfs_path(Path(repo) / "blocks", path.name)
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(path.read_bytes())
        count += 1
    return count


def drop_block(repo: Path, cid: str) -> None:
    """Remove one block from the Kubo repo `repo`'s flatfs."""
    from krill.store.embedded_kubo import _flatfs_path

    _flatfs_path(Path(repo) / "blocks", cid).unlink()
