"""The worker's persisted state: its next nonce and the commit in flight, safe against `kill -9`.

Design decisions:
- One JSON document per (run, worker) under the worker's state directory
  (`runs/<run id>/state.json`), replaced atomically: written to a temporary file, fsynced,
  renamed over the old one, and the directory fsynced. A reader sees the old state or the new,
  never a torn one.
- A nonce is handed out in memory before any work is done with it, and made durable together with
  the first thing that can leave the machine under it: the pending contribution (one state write
  names the contribution and moves `next_nonce` past it), or the log line of work dropped before
  it was saved. A crash during sampling or learning may hand the same nonce out again, which is
  safe: nothing was signed and saved under it, so nothing can be on its way. What must never
  happen, a second, different contribution signed under a nonce whose first one might already be
  uploaded or committed (the contract keys a commit by (run, worker, version, nonce)), cannot:
  that first one was saved, and with it the higher `next_nonce`. (Persisting the reservation on
  its own cost two fsyncs per contribution on the worker's critical path for no safety.)
- The contribution is made durable before it is committed: the exact bytes (signed header and
  every file) go to one bundle file `pending/<digest>.bundle` first (written to a temporary
  file, fsynced, renamed; one fsync however many files the contribution has), then the state
  names it as `pending` with (learner version, behaviour version, nonce, digest). After a restart
  the pending commit is looked up on-chain by digest; if it is there the worker moves on,
  otherwise it re-uploads the same bytes and commits the same digest. Nothing is recomputed, so
  the digest cannot change and a commit can never be made twice. A pending contribution saved by
  an earlier version as a folder of files (`pending/<digest>/`) is still read.
- Thread-safe: the worker submits one contribution in a background thread while it makes the
  next (`krill.worker.pipeline`); every method that touches the document or the files holds one
  lock.
- Every finished nonce (committed, dropped as stale, ...) is appended to `contributions.jsonl`
  (fsynced) before the pending entry is cleared; a crash in between repeats the line on restart,
  marked `resumed`, but never loses it. A line torn by a crash mid-append (a full disk, a power
  cut before the fsync) has no newline; the first line a process appends after it starts on a new
  line (checked once per process: only a crash tears a line), so the torn fragment is the only line
  `history` skips: appended straight after it, the repeated outcome joined the fragment into one
  line that does not parse, and was lost from the log and from `krill worker status`.
- A write that fails (a full disk, a read-only file system) is a `WorkerStateError` naming the
  file, which stops the worker, and leaves the state on disk as it was before it: the temporary
  file is removed (where the file system still allows it: a read-only one refuses even that, and its
  error is not the one to report), and a contribution whose state write failed is not named as
  pending, in memory either, and its bundle is deleted. It used to surface as a bare `OSError: [Errno 28] No space left on device` traceback,
  naming no file, with the temporary file left behind.
- A fresh state must learn the nonces this worker already committed before it hands one out (the
  chain's `Committed` events; `krill.worker.runner`). The document records that as `recovered`,
  set in the same write that moves `next_nonce` past them: a worker stopped during that scan
  (which sits out an RPC outage in `Backoff`) finds `recovered` false on restart and scans again,
  instead of taking the state written at its first start for a recovered one and reusing nonces.
  A document without the flag (written before it existed) counts as not recovered: scanning again
  is always safe, since recovery only ever moves `next_nonce` forward (`advance_to`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import struct
import threading
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from krill.worker.errors import WorkerStateError

STATE_FORMAT = "krill-worker-state/1"
HEADER_FILE = "header.json"
BUNDLE_MAGIC = b"KRILLPB1"  # magic, 4-byte big-endian index length, JSON index [[name, size], ...], the bytes


class Pending(BaseModel):
    """A contribution saved locally and not yet known to be on-chain."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_version: int = Field(ge=0, description="Learner version v: what is committed on-chain.")
    behaviour_version: int = Field(ge=0, description="Version the rollouts were sampled at.")
    nonce: int = Field(ge=0, lt=1 << 64)
    digest: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the signed header (hex).")
    files: list[str] = Field(description="Names of the files saved beside the header.")
    summary: dict = Field(default_factory=dict, description="Figures for the status line (reward, tokens, ...).")


class _Document(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: str = Field(STATE_FORMAT, pattern=r"^krill-worker-state/1$")
    run_id: str = Field(pattern=r"^[0-9a-f]{64}$")
    worker: str = Field(pattern=r"^0x[0-9a-f]{40}$")
    next_nonce: int = Field(0, ge=0, lt=1 << 64)
    pending: Pending | None = None
    recovered: bool = Field(False, description="next_nonce is past every nonce this worker committed on-chain.")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as exc:
        # The file system that refused the write may refuse this too (remounted read-only, it answers EROFS
        # even for a temporary file never made): the error to report is the write's.
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise _unwritable(path, exc) from None


def _unwritable(path: Path, exc: OSError) -> WorkerStateError:
    """A failed write of `path` (a full disk, a read-only file system) as one line that says where."""
    return WorkerStateError(f"cannot write {path}: {exc.strerror or exc}; free space there (or fix the file "
                            "system) and start the worker again: what is on disk is the state before this write")


def _bundle(parts: list[tuple[str, bytes]]) -> bytes:
    index = json.dumps([[name, len(data)] for name, data in parts], separators=(",", ":")).encode()
    return b"".join([BUNDLE_MAGIC, struct.pack(">I", len(index)), index, *(data for _, data in parts)])


def _unbundle(blob: bytes, where: Path) -> dict[str, bytes]:
    """The files of a bundle by name; a `WorkerStateError` naming `where` if it is not a whole bundle."""
    try:
        if not blob.startswith(BUNDLE_MAGIC):
            raise ValueError("not a pending bundle")
        (length,) = struct.unpack_from(">I", blob, len(BUNDLE_MAGIC))
        at = len(BUNDLE_MAGIC) + 4
        index = json.loads(blob[at:at + length])
        at += length
        out = {}
        for name, size in index:
            if at + size > len(blob):
                raise ValueError("truncated")
            out[name] = blob[at:at + size]
            at += size
        if at != len(blob):
            raise ValueError("trailing bytes")
        return out
    except (ValueError, TypeError, struct.error) as exc:
        raise WorkerStateError(f"saved contribution {where} is damaged ({exc})") from None


class WorkerState:
    """Nonce sequence, pending commit and outcome log of one worker in one run."""

    def __init__(self, directory: Path, doc: _Document, existed: bool):
        self.directory = directory
        self._doc = doc
        self.existed = existed  # False: a fresh state (no document was on disk)
        self._lock = threading.RLock()  # the document and files (held through fsyncs)
        self._nonce_lock = threading.Lock()  # the in-memory nonce counter only: never waits on a save
        self._handed_out = doc.next_nonce  # next nonce in memory; the document holds the durable one
        self._log_ends_line = False  # the outcome log is known to end with a newline (checked at the first append)

    @classmethod
    def open(cls, state_dir: Path, run_id: bytes, worker: str) -> WorkerState:
        directory = Path(state_dir) / "runs" / run_id.hex()
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = directory / "state.json"
        worker = worker.lower()
        if not path.exists():
            state = cls(directory, _Document(run_id=run_id.hex(), worker=worker), existed=False)
            state._save()
            return state
        try:
            doc = _Document.model_validate_json(path.read_bytes())
        except (OSError, ValidationError) as exc:
            raise WorkerStateError(f"worker state {path} is damaged ({exc}); move it aside to start over "
                                   "(the nonce is then recovered from the chain)") from None
        if doc.run_id != run_id.hex() or doc.worker != worker:
            raise WorkerStateError(f"worker state {path} belongs to run {doc.run_id[:16]}… / {doc.worker}, "
                                   f"not {run_id.hex()[:16]}… / {worker}")
        return cls(directory, doc, existed=True)

    @classmethod
    def peek(cls, state_dir: Path, run_id: bytes, worker: str) -> WorkerState | None:
        """The state if one was ever saved, else None; creates nothing, so a later `open` still sees a fresh
        state and recovers the nonce from the chain (status must not hide a lost state directory)."""
        if not (Path(state_dir) / "runs" / run_id.hex() / "state.json").exists():
            return None
        return cls.open(state_dir, run_id, worker)

    # ------------------------------------------------------------------ nonces
    @property
    def next_nonce(self) -> int:
        """The nonce `reserve_nonce` hands out next."""
        return max(self._handed_out, self._doc.next_nonce)

    @property
    def durable_next_nonce(self) -> int:
        """The lowest nonce a restart may hand out: one past the last saved or logged under."""
        return self._doc.next_nonce

    def reserve_nonce(self) -> int:
        """The next nonce; persisted with the contribution saved under it (see the module docstring).

        Takes only the counter's lock: the main loop reserves its next nonce while the background
        submission saves the previous contribution under the document lock (an fsync)."""
        with self._nonce_lock:
            nonce = self.next_nonce
            self._handed_out = nonce + 1
            return nonce

    def _used(self, nonce: int) -> None:
        self._doc.next_nonce = max(self._doc.next_nonce, nonce + 1)

    def advance_to(self, nonce: int) -> None:
        """Never hand out a nonce below `nonce` (after learning of commits from the chain)."""
        with self._lock, self._nonce_lock:
            if nonce > self._doc.next_nonce:
                self._doc.next_nonce = nonce
                self._save()

    @property
    def recovered(self) -> bool:
        """Whether the nonces committed on-chain were learnt (`recovered_to`); the runner does so before any
        nonce is handed out."""
        return self._doc.recovered

    def recovered_to(self, nonce: int) -> None:
        """Record the recovery from the chain: never hand out a nonce below `nonce`, and never recover again
        (one write, so a crash leaves either neither or both)."""
        with self._lock, self._nonce_lock:
            self._doc.next_nonce = max(self._doc.next_nonce, nonce)
            self._doc.recovered = True
            self._save()

    # ------------------------------------------------------------------ pending commit
    @property
    def pending(self) -> Pending | None:
        return self._doc.pending

    def _bundle_path(self, digest: str) -> Path:
        return self.directory / "pending" / f"{digest}.bundle"

    def _legacy_dir(self, digest: str) -> Path:
        return self.directory / "pending" / digest

    def save_pending(self, pending: Pending, header: bytes, files: dict[str, bytes]) -> None:
        """Make the contribution durable, then name it as pending (in that order)."""
        with self._lock:
            if self._doc.pending is not None:
                raise WorkerStateError(f"a commit is already pending (nonce {self._doc.pending.nonce})")
            if hashlib.sha256(header).hexdigest() != pending.digest or sorted(files) != sorted(pending.files):
                raise WorkerStateError("pending entry does not describe the bytes being saved")
            if HEADER_FILE in files:
                raise WorkerStateError(f"a contribution file may not be named {HEADER_FILE}")
            path = self._bundle_path(pending.digest)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise _unwritable(path.parent, exc) from None
            _write_atomic(path, _bundle([(HEADER_FILE, header), *sorted(files.items())]))
            before = self._doc.model_copy()
            self._doc.pending = pending
            self._used(pending.nonce)
            try:
                self._save()
            except WorkerStateError:
                if self._pending_on_disk() is None:  # not named on disk: neither in memory, and no orphan bundle
                    self._doc = before
                    path.unlink(missing_ok=True)
                raise

    def _pending_on_disk(self) -> Pending | str | None:
        """The pending entry state.json holds (None: none); "unknown" if the file cannot be read (a failed write
        may have replaced it and failed only at the directory's fsync, so its bundle is then kept)."""
        try:
            return _Document.model_validate_json((self.directory / "state.json").read_bytes()).pending
        except (OSError, ValidationError):
            return "unknown"

    def pending_payload(self) -> tuple[bytes, dict[str, bytes]]:
        """The saved header and files of the pending commit, checked against its digest."""
        with self._lock:
            pending = self._doc.pending
            if pending is None:
                raise WorkerStateError("no commit is pending")
            path = self._bundle_path(pending.digest)
            try:
                if path.exists():
                    saved = _unbundle(path.read_bytes(), path)
                else:  # saved by an earlier version: one file each in a folder
                    path = self._legacy_dir(pending.digest)
                    saved = {name: (path / name).read_bytes() for name in [HEADER_FILE, *pending.files]}
            except OSError as exc:
                raise WorkerStateError(f"saved contribution {path} is incomplete ({exc})") from None
            header = saved.pop(HEADER_FILE, b"")
            if hashlib.sha256(header).hexdigest() != pending.digest:
                raise WorkerStateError(f"saved header in {path} does not hash to the pending digest")
            missing = sorted(set(pending.files) - set(saved))
            if missing:
                raise WorkerStateError(f"saved contribution {path} is incomplete (missing {', '.join(missing)})")
            return header, {name: saved[name] for name in pending.files}

    def finish(self, outcome: dict) -> None:
        """Log the outcome of the pending commit, then clear it and delete its saved bytes."""
        with self._lock:
            pending = self._doc.pending
            self.log(outcome)
            self._doc.pending = None
            self._save()
            if pending is not None:
                self._bundle_path(pending.digest).unlink(missing_ok=True)
                shutil.rmtree(self._legacy_dir(pending.digest), ignore_errors=True)

    def drop(self, nonce: int, outcome: dict) -> None:
        """Log the outcome of work dropped before it was saved (stale rollouts) and persist its nonce as used."""
        with self._lock:
            self.log(outcome)
            self._used(nonce)
            self._save()

    # ------------------------------------------------------------------ outcome log
    @property
    def log_path(self) -> Path:
        return self.directory / "contributions.jsonl"

    def log(self, outcome: dict) -> None:
        line = json.dumps(outcome, sort_keys=True, separators=(",", ":")) + "\n"
        with self._lock:
            try:
                with open(self.log_path, "a+b") as fh:
                    if not self._log_ends_line and fh.seek(0, os.SEEK_END) > 0:
                        fh.seek(-1, os.SEEK_END)
                        if fh.read(1) != b"\n":  # a line torn by a crash: end it, or ours would join it
                            line = "\n" + line
                    self._log_ends_line = False  # until this line is whole on disk
                    fh.write(line.encode("utf-8"))
                    fh.flush()
                    os.fsync(fh.fileno())
                    self._log_ends_line = True
            except OSError as exc:  # a line torn here is ended by the next append (see the module docstring)
                raise _unwritable(self.log_path, exc) from None

    def history(self) -> list[dict]:
        if not self.log_path.exists():
            return []
        out = []
        for line in self.log_path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:  # a line torn by a crash mid-append; its outcome is logged again on resume
                continue
        return out

    def _save(self) -> None:
        with self._lock:
            _write_atomic(self.directory / "state.json", self._doc.model_dump_json(indent=1).encode())
