"""The content-store interface and `open_store(config)`.

Design decisions:
- A store is a small abstract class: `add` (a whole file, Kubo's UnixFS CID), `put_block` (one raw
  block, CID from its sha256 alone), `get` (bytes, capped), `has`, `pin`, `unpin`, `close`. Roles
  see only this; the backend is chosen by the config's `type` (`local`, `kubo`, `embedded-kubo`).
- `prepare` + `put_prepared` split `add` in two: the CID now (hashing only), the write later. The
  coordinator names a version's optimizer states in its record before the publication transaction
  and writes them after it, off the critical path of the workers, who do not read them. A
  blockstore-backed store keeps the blocks it hashed, so nothing is hashed twice.
- The store is never trusted. `get` returns only bytes it has checked against the CID asked for
  (and against a sha256 when the caller knows one, as headers do for their files); size caps are
  enforced while reading, before anything large is held in memory.
- Blockstore-backed stores (local directory, embedded Kubo repo) implement two primitives,
  `_read_block` and `_write_block`; the UnixFS building and verified walking are shared here so
  both produce and accept exactly Kubo's DAGs. The Kubo RPC store overrides `add` and `_get`.
- The embedded-Kubo backend is an optional extra; its module is imported only when chosen.
- `open_store_to_read` is `open_store` for a command that only reads: an embedded-Kubo repo another
  process's node holds (a running role's) is read from its blocks on disk (`RepoBlocksReader`), said
  once through the caller's `say`; a command that writes, pins or must fetch keeps `RepoInUseError`.
"""

from __future__ import annotations

import hashlib
import io
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from krill.errors import IntegrityError, StoreError
from krill.store.cid import MAX_BLOCK_SIZE, normalize_cid, raw_block_cid
from krill.store.unixfs import ObjectTooLargeError, build_file_dag, read_file

__all__ = ["BlockBackedStore", "Content", "ContentStore", "ObjectTooLargeError", "PreparedContent", "open_store",
           "open_store_to_read"]

Content = bytes | bytearray | memoryview | Path | BinaryIO


@dataclass(frozen=True)
class PreparedContent:
    """Content whose CID is known and which is not stored yet (`ContentStore.prepare`)."""

    cid: str
    size: int
    data: bytes | None = field(default=None, repr=False)  # the bytes, where the backend adds them whole
    blocks: tuple[tuple[str, bytes], ...] | None = field(default=None, repr=False)  # or its built DAG


class ContentStore(ABC):
    """Content-addressed storage whose every read is verified against the CID."""

    max_get_bytes: int

    # ------------------------------------------------------------------ public API

    @abstractmethod
    def add(self, data: Content, pin: bool = False) -> str:
        """Store a file; return the CID `ipfs add --cid-version 1 --raw-leaves` gives it."""

    def prepare(self, data: bytes) -> PreparedContent:
        """The CID `add(data)` will return, computed without writing anything; `put_prepared` stores it."""
        from krill.store.cid import file_cid

        data = bytes(data)
        return PreparedContent(cid=file_cid(data), size=len(data), data=data)

    def put_prepared(self, prepared: PreparedContent, pin: bool = False) -> str:
        """Store what `prepare` returned (idempotent); returns its CID."""
        cid = self.add(prepared.data, pin=pin)
        if cid != prepared.cid:
            raise IntegrityError(f"content prepared as {prepared.cid} was stored as {cid}")
        return cid

    def put_block(self, block: bytes, pin: bool = False) -> str:
        """Store one raw block (at most 1 MiB); its CID is `digest_to_cid(sha256(block))`."""
        block = bytes(block)
        if len(block) > MAX_BLOCK_SIZE:
            raise StoreError(f"block is {len(block)} bytes; put_block takes at most {MAX_BLOCK_SIZE} "
                             "(use add() for larger content)")
        cid = raw_block_cid(block)
        self._put_raw(cid, block)
        if pin:
            self.pin(cid)
        return cid

    def get(self, cid: str, max_bytes: int | None = None, sha256: bytes | None = None) -> bytes:
        """The content named by `cid`, verified; at most `max_bytes` (default: the store's cap).

        Raises `ContentNotFoundError` if absent, `ObjectTooLargeError` if over the cap,
        `IntegrityError` if what arrived does not match `cid` (or `sha256` when given).
        """
        limit = self.max_get_bytes if max_bytes is None else min(int(max_bytes), self.max_get_bytes)
        if limit < 0:
            raise StoreError(f"max_bytes must be >= 0, got {max_bytes}")
        data = self._get(normalize_cid(cid), limit)
        if sha256 is not None and hashlib.sha256(data).digest() != bytes(sha256):
            raise IntegrityError(f"content of {cid} does not match the sha256 {bytes(sha256).hex()} named for it")
        return data

    @abstractmethod
    def has(self, cid: str) -> bool:
        """Whether the store holds the root block of `cid` locally (no network lookup)."""

    @abstractmethod
    def pin(self, cid: str) -> None:
        """Keep `cid` and everything under it."""

    def pin_all(self, cids: list[str]) -> None:
        """`pin` each of `cids` (a store that can pin several in one request overrides this)."""
        for cid in cids:
            self.pin(cid)

    @abstractmethod
    def unpin(self, cid: str) -> None:
        """Allow `cid` to be garbage-collected."""

    @abstractmethod
    def close(self) -> None:
        """Release connections, files and nodes; the store is unusable afterwards."""

    def __enter__(self) -> ContentStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ backend primitives

    @abstractmethod
    def _put_raw(self, cid: str, block: bytes) -> None:
        """Store one raw block whose CID the caller computed."""

    @abstractmethod
    def _get(self, cid: str, limit: int) -> bytes:
        """The verified content of `cid` (canonical CIDv1), refusing more than `limit` bytes."""


class BlockBackedStore(ContentStore):
    """A store that holds IPFS blocks itself: UnixFS DAGs are built and walked here, in Python."""

    @abstractmethod
    def _read_block(self, cid: str) -> bytes:
        """The stored bytes of one block (unverified); `ContentNotFoundError` if absent."""

    @abstractmethod
    def _write_block(self, cid: str, block: bytes) -> None:
        """Store one block under its CID; a no-op if it is already there."""

    def add(self, data: Content, pin: bool = False) -> str:
        with _open_content(data) as stream:
            cids = []
            for cid, block in build_file_dag(stream):
                self._write_block(cid, block)
                cids.append(cid)
        if pin:
            self.pin(cids[-1])
        return cids[-1]

    def prepare(self, data: bytes) -> PreparedContent:
        data = bytes(data)
        blocks = tuple(build_file_dag(data))
        return PreparedContent(cid=blocks[-1][0], size=len(data), blocks=blocks)

    def put_prepared(self, prepared: PreparedContent, pin: bool = False) -> str:
        if prepared.blocks is None:
            return super().put_prepared(prepared, pin=pin)
        for cid, block in prepared.blocks:
            self._write_block(cid, block)
        if pin:
            self.pin(prepared.cid)
        return prepared.cid

    def _put_raw(self, cid: str, block: bytes) -> None:
        self._write_block(cid, block)

    def _get(self, cid: str, limit: int) -> bytes:
        return read_file(self._read_block, cid, limit)


class _open_content:
    """Context manager giving a binary stream for bytes, a path or an open stream (left open)."""

    def __init__(self, data: Content):
        self._data = data
        self._owned: BinaryIO | None = None

    def __enter__(self) -> BinaryIO:
        if isinstance(self._data, bytes | bytearray | memoryview):
            return io.BytesIO(bytes(self._data))
        if isinstance(self._data, str | Path):
            self._owned = open(self._data, "rb")  # noqa: SIM115 - closed in __exit__
            return self._owned
        if hasattr(self._data, "read"):
            return self._data
        raise StoreError(f"cannot store a {type(self._data).__name__}; pass bytes, a path or a binary stream")

    def __exit__(self, *exc) -> None:
        if self._owned is not None:
            self._owned.close()


def open_store(config) -> ContentStore:
    """Open the store a `LocalStoreConfig`, `KuboStoreConfig` or `EmbeddedKuboStoreConfig` describes."""
    kind = getattr(config, "type", None)
    if kind == "local":
        from krill.store.local import LocalStore

        return LocalStore(config.path, max_get_bytes=config.max_get_bytes)
    if kind == "kubo":
        from krill.store.kubo import KuboStore

        return KuboStore(config.api_url, timeout_s=config.timeout_s, max_get_bytes=config.max_get_bytes)
    if kind == "embedded-kubo":
        from krill.store.embedded_kubo import EmbeddedKuboStore

        return EmbeddedKuboStore(config.repo_path, swarm_addresses=config.swarm_addresses,
                                 bootstrap=config.bootstrap, timeout_s=config.timeout_s,
                                 max_get_bytes=config.max_get_bytes)
    raise StoreError(f"unknown store type {kind!r}; expected 'local', 'kubo' or 'embedded-kubo'")



def open_store_to_read(config, say: Callable[[str], None]) -> ContentStore:
    """`open_store(config)` for a caller that only reads. An embedded-Kubo repo another process's node holds
    (`RepoInUseError`) is opened as the blocks already in it (`RepoBlocksReader`: verified reads, nothing
    fetched from the network, nothing written), and `say` gets one line saying so."""
    if getattr(config, "type", None) != "embedded-kubo":
        return open_store(config)
    from krill.store.embedded_kubo import RepoBlocksReader, RepoInUseError, held_repo_note

    try:
        return open_store(config)
    except RepoInUseError as exc:
        reader = RepoBlocksReader(exc.repo, max_get_bytes=config.max_get_bytes)
        say(held_repo_note(exc))
        return reader
