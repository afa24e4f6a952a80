"""The embedded content store: IPFS blocks in a directory that processes on one host share.

Design decisions:
- Blocks, not files: each IPFS block (raw leaf, dag-pb node, raw header block) is one file named by
  its canonical CIDv1 under `blocks/<last two CID characters>/`. The store therefore holds exactly
  the DAGs Kubo would, so its content can be exported to any IPFS node unchanged, and `add` and
  `put_block` share one namespace as they do in Kubo.
- Safe sharing without locks: a block is written to a unique temporary file in the same file system
  and moved into place with `os.replace`, which is atomic, so a reader sees a whole block or none.
  Two writers of one block write identical bytes (it is content-addressed), so the last rename wins
  harmlessly. No fsync: a block torn by a power cut fails verification on the next read, is
  deleted, and is re-written by the next put; durability is the network's job (pins elsewhere).
- Every read is verified (`BlockBackedStore._get` walks the DAG checking each block's hash); a block
  that fails is removed so that a later put can heal it, and `IntegrityError` is raised.
- Pins are marker files under `pins/`. `gc()` deletes blocks reachable from no pin, but only those
  older than a grace period, so a block another process has just written for a pin it is about to
  make is never collected under it.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from pathlib import Path

from krill.errors import ContentNotFoundError, IntegrityError, StoreError
from krill.store.base import BlockBackedStore
from krill.store.cid import DAG_PB, cid_parts, normalize_cid
from krill.store.unixfs import BlockMismatchError, decode_dag_pb


class LocalStore(BlockBackedStore):
    """A content-addressed block directory; see the module docstring."""

    def __init__(self, path: Path | str, max_get_bytes: int = 1 << 30):
        self.root = Path(path).expanduser()
        self.max_get_bytes = int(max_get_bytes)
        self._blocks = self.root / "blocks"
        self._pins = self.root / "pins"
        self._tmp = self.root / "tmp"
        try:
            for folder in (self._blocks, self._pins, self._tmp):
                folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the local store at {self.root}: {exc}") from None

    def _block_path(self, cid: str) -> Path:
        return self._blocks / cid[-2:] / cid

    # ------------------------------------------------------------------ block primitives

    def _read_block(self, cid: str) -> bytes:
        cid = normalize_cid(cid)
        try:
            return self._block_path(cid).read_bytes()
        except FileNotFoundError:
            raise ContentNotFoundError(f"{cid} is not in the local store at {self.root}") from None

    def _write_block(self, cid: str, block: bytes) -> None:
        cid = normalize_cid(cid)
        target = self._block_path(cid)
        try:
            if target.stat().st_size == len(block):
                return
        except FileNotFoundError:
            pass
        tmp = self._tmp / f"{cid}.{os.getpid()}.{uuid.uuid4().hex}"
        try:
            # In the try: on a full disk the first block of a new shard folder failed here, as a bare OSError.
            target.parent.mkdir(exist_ok=True)
            with open(tmp, "wb") as fh:
                fh.write(block)
            os.replace(tmp, target)
        except OSError as exc:
            # The file system that refused the write may refuse this too (remounted read-only, it answers EROFS
            # even for a temporary file never made): the error to report is the write's, as a StoreError.
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise StoreError(f"cannot write block {cid} to {self.root}: {exc}") from None

    def _get(self, cid: str, limit: int) -> bytes:
        try:
            return super()._get(cid, limit)
        except BlockMismatchError as exc:
            # The file on disk is corrupt (torn write, disk fault, tampering): drop it so that the
            # next put of the same content heals the store.
            self._block_path(normalize_cid(exc.cid)).unlink(missing_ok=True)
            raise

    # ------------------------------------------------------------------ public API

    def has(self, cid: str) -> bool:
        return self._block_path(normalize_cid(cid)).exists()

    def pin(self, cid: str) -> None:
        cid = normalize_cid(cid)
        if not self.has(cid):
            raise ContentNotFoundError(f"cannot pin {cid}: it is not in the local store")
        (self._pins / cid).touch()

    def unpin(self, cid: str) -> None:
        (self._pins / normalize_cid(cid)).unlink(missing_ok=True)

    def pins(self) -> list[str]:
        """The pinned root CIDs, sorted."""
        return sorted(p.name for p in self._pins.iterdir())

    def gc(self, grace_s: float = 3600.0) -> int:
        """Delete unpinned blocks older than `grace_s` seconds; return how many were deleted."""
        keep: set[str] = set()
        for root in self.pins():
            self._mark(root, keep)
        cutoff = time.time() - grace_s
        removed = 0
        for shard in self._blocks.iterdir():
            for path in shard.iterdir():
                if path.name in keep:
                    continue
                try:
                    if path.stat().st_mtime < cutoff:
                        path.unlink()
                        removed += 1
                except FileNotFoundError:
                    continue
        return removed

    def _mark(self, cid: str, keep: set[str]) -> None:
        stack = [cid]
        while stack:
            current = stack.pop()
            if current in keep:
                continue
            keep.add(current)
            if cid_parts(current)[0] == DAG_PB:
                try:
                    links, _ = decode_dag_pb(self._read_block(current))
                except (ContentNotFoundError, IntegrityError):
                    continue
                stack.extend(link.cid for link in links)

    def close(self) -> None:
        """Nothing to release: every operation opens and closes its own files."""
