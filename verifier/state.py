"""The verifier's private, crash-safe memory: the event cursor and what it decided about each commit.

Design decisions:
- One SQLite file per (contract, run) in the role's state directory, written through the standard
  library's `sqlite3` in autocommit-per-statement transactions: a `kill -9` at any point leaves
  either the old row or the new one, never half of a decision. The verifier needs no shared
  database, so it keeps none. WAL is switched on with the core's retry (`krill.db.wal`): two
  processes opening a new file at once, the second's switch failed with "database is locked".
- A commit enters as `pending` together with the cursor move that discovered it (one
  transaction), so an event is never lost between "seen" and "remembered". It leaves `pending`
  exactly once, for `attested`, `skipped` (not selected), `missed` (window closed first) or
  `error` (a bug in this verifier, recorded rather than crashing the loop).
- Every value of a commit round-trips exactly. The nonce is the contract's uint64, beyond SQLite's
  signed 64-bit INTEGER, so it is stored as decimal TEXT; a file of an earlier release (nonce
  INTEGER) is copied into a table of the new shape, once, when opened. An event with a value no
  column holds (`unrecordable`: none the contract emits) enters as `error` with the event in its
  reason, and the rest of its batch and the cursor move on: one worker's nonce >= 2**63 used to roll
  back every batch that read it and stop every verifier, restart after restart.
- Corroboration (`add_events`): another verifier's failing verdict on a commit of the run marks it
  `corroborates` (that verifier and its evidence digest), in the same transaction as the cursor
  move that read the verdict, so a restart never forgets it. A commit this verifier skipped
  (not selected) goes back to `pending`; a pending one only gains the mark (a commit is never
  added twice, and the first failing verdict seen is the one recorded); one already attested,
  missed or in error, or whose challenge window has closed, is left as it is. `skipped` is thus
  the one final status that can change, and only this way. Why a replayed commit was replayed is
  recorded with its decision as `origin`: `selected` (this verifier's own draw) or
  `corroborating`.
- The file never proves the chain state: before attesting, the loop also asks the contract
  whether this verifier already attested (the crash window between a mined attest and the row
  update), so restarts never attest twice even if the file is older than the chain.
- Readers that are not the verifier (`krill verifier status`) open the file read-only
  (`open_read_only`): no schema script, migration, journal-mode change or identity row, and a busy
  wait of `READ_WAIT_S`. Opened for writing, status ran all of those on a running verifier's file
  (an older release's file was migrated under it) and its `BEGIN IMMEDIATE` waited the writer's
  30 s busy timeout behind any write transaction, then failed with "database is locked". A WAL
  reader does not wait for a writer; an older release's file is read as it is (`counts`). Status
  reads its figures in one read transaction (`snapshot`), as the running verifier moves them.
- A write the disk refuses (SQLITE_FULL, SQLITE_IOERR) is rolled back and raised as
  `VerifierStateError` naming the file, which stops the verifier with one line; nothing is lost,
  since a commit whose decision was not recorded stays pending and an attestation sent before is
  found on-chain at the restart. It was sqlite3's "database or disk is full", naming no file, as a
  traceback (with "cannot rollback - no transaction is active" chained when SQLite had already
  rolled back).
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from krill.db.wal import enable_wal
from krill.errors import ConfigError, KrillError

COMMITS_COLUMNS = """(
    commit_id INTEGER PRIMARY KEY,
    worker TEXT NOT NULL,
    version INTEGER NOT NULL,
    nonce TEXT NOT NULL,
    header_digest TEXT NOT NULL,
    commit_block INTEGER NOT NULL,
    status TEXT NOT NULL,
    ok INTEGER,
    reason TEXT,
    evidence_cid TEXT,
    tx_hash TEXT,
    updated REAL NOT NULL,
    corroborates TEXT,
    failing_evidence TEXT,
    origin TEXT
)"""
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS commits {COMMITS_COLUMNS};
CREATE INDEX IF NOT EXISTS commits_status ON commits (status, commit_id);
"""
# Columns added after the first release of the file, added in place to older files (all nullable).
ADDED_COLUMNS = (("corroborates", "TEXT"), ("failing_evidence", "TEXT"), ("origin", "TEXT"))
READ_WAIT_S = 2.0  # the most a read-only opener (status) waits on the file's locks
# The integer columns' bounds: SQLite's INTEGER is signed 64-bit; the nonce is the contract's uint64.
INT64_END, UINT64_END = 2**63, 2**64

PENDING, ATTESTED, SKIPPED, MISSED, ERROR = "pending", "attested", "skipped", "missed", "error"
FINAL = (ATTESTED, SKIPPED, MISSED, ERROR)
SELECTED, CORROBORATING = "selected", "corroborating"  # why a commit was replayed (`origin`)


@dataclass(frozen=True)
class Job:
    """A commit the verifier has seen and not yet finished with."""

    commit_id: int
    worker: str
    version: int
    nonce: int
    header_digest: bytes
    commit_block: int
    # Another verifier's failing verdict on the commit, which this verifier replays whatever its
    # draw: that verifier's address and the digest of its evidence document (None: none seen).
    corroborates: str | None = None
    failing_evidence: bytes | None = None


@dataclass(frozen=True)
class FailingVerdict:
    """Another verifier's failing attestation of a commit (an `Attested` event with ok = false)."""

    commit_id: int
    verifier: str
    evidence_digest: bytes


@dataclass(frozen=True)
class Decision:
    """How the verifier finished with a commit."""

    commit_id: int
    status: str
    ok: bool | None
    reason: str | None
    evidence_cid: str | None
    tx_hash: str | None
    origin: str | None = None  # `selected` or `corroborating` for a replayed commit; None otherwise
    corroborates: str | None = None


class VerifierState:
    """Cursor and per-commit decisions of one verifier on one run."""

    def __init__(self, path: Path | str, *, contract: str, run_id: bytes, verifier: str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), isolation_level=None, timeout=30.0)
        enable_wal(self._db, 30.0)  # processes opening a new file at once: see krill.db.wal
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)
        with self._tx():  # a file of an older release is brought up to date (once, if two processes open it)
            self._migrate()
        identity = {"contract": contract.lower(), "run_id": run_id.hex(), "verifier": verifier.lower()}
        with self._tx():
            for key, value in identity.items():
                row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
                if row is None:
                    self._db.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, value))
                elif row[0] != value:
                    raise ConfigError(f"verifier state {self.path} belongs to {key} {row[0]}, not {value}: "
                                      "point verifier.state_dir elsewhere")

    @classmethod
    def open_read_only(cls, path: Path | str, *, contract: str, run_id: bytes, verifier: str,
                       wait_s: float = READ_WAIT_S) -> VerifierState:
        """The existing state file at `path`, opened for reading only (see the module docstring): nothing is
        written to it, and a lock is waited on for `wait_s` at most (`sqlite3.OperationalError` after that).
        `ConfigError` if its identity rows name another contract, run or verifier; the writing methods fail."""
        state = cls.__new__(cls)
        state.path = Path(path)
        state._db = sqlite3.connect(f"{state.path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None,
                                    timeout=wait_s)
        try:
            identity = {"contract": contract.lower(), "run_id": run_id.hex(), "verifier": verifier.lower()}
            for key, value in state._db.execute("SELECT key, value FROM meta WHERE key IN (?, ?, ?)", tuple(identity)):
                if value != identity[key]:
                    raise ConfigError(f"verifier state {state.path} belongs to {key} {value}, not {identity[key]}: "
                                      "point verifier.state_dir elsewhere")
        except BaseException:
            state._db.close()
            raise
        return state

    @staticmethod
    def path_for(directory: Path, *, contract: str, run_id: bytes) -> Path:
        """Where the state file of `run_id` on `contract` lives inside the role's state directory."""
        return Path(directory) / f"verifier-{contract.lower()[2:12]}-{run_id.hex()[:16]}.sqlite"

    @classmethod
    def for_run(cls, directory: Path, *, contract: str, run_id: bytes, verifier: str) -> VerifierState:
        """The state file of `run_id` on `contract` inside the role's state directory."""
        return cls(cls.path_for(directory, contract=contract, run_id=run_id), contract=contract, run_id=run_id,
                   verifier=verifier)

    def _tx(self):
        return _Transaction(self._db, self.path)

    def _migrate(self) -> None:
        """Bring the commits table of an older release up to date, inside the caller's transaction."""
        present = {row[1]: row[2].upper() for row in self._db.execute("PRAGMA table_info(commits)")}
        for name, kind in ADDED_COLUMNS:
            if name not in present:
                self._db.execute(f"ALTER TABLE commits ADD COLUMN {name} {kind}")
        if present["nonce"] != "TEXT":
            # SQLite changes no column's type in place: the table is copied into one whose nonce is TEXT
            # (an INTEGER column turns a decimal above 2**63 - 1 into a lossy REAL), its index rebuilt.
            names = [row[1] for row in self._db.execute("PRAGMA table_info(commits)")]
            values = ["CAST(nonce AS TEXT)" if name == "nonce" else name for name in names]
            self._db.execute(f"CREATE TABLE commits_text_nonce {COMMITS_COLUMNS}")
            self._db.execute(f"INSERT INTO commits_text_nonce ({', '.join(names)}) SELECT {', '.join(values)} "
                             "FROM commits")
            self._db.execute("DROP TABLE commits")
            self._db.execute("ALTER TABLE commits_text_nonce RENAME TO commits")
            self._db.execute("CREATE INDEX commits_status ON commits (status, commit_id)")

    def close(self) -> None:
        self._db.close()

    def snapshot(self) -> dict[str, int | None]:
        """`counts()` and the cursor (key `cursor`) as of one moment of the file: one read transaction. Read
        statement by statement, another process's verifier attesting in between gave figures the file never
        held ("1 attested: 2 passed")."""
        self._db.execute("BEGIN")  # deferred: the read transaction starts at the first SELECT and waits on nothing
        try:
            return self.counts() | {"cursor": self.cursor()}
        finally:
            self._db.execute("COMMIT")

    # ------------------------------------------------------------------ cursor

    def cursor(self) -> int | None:
        """The next block to scan for Committed events (None: never scanned)."""
        row = self._db.execute("SELECT value FROM meta WHERE key = 'cursor'").fetchone()
        return None if row is None else int(row[0])

    def add_jobs(self, jobs: list[Job], next_block: int) -> int:
        """Remember newly seen commits and move the cursor, atomically; returns how many were new."""
        return self.add_events(jobs, [], next_block)[0]

    def add_events(self, jobs: list[Job], failing: list[FailingVerdict], next_block: int,
                   open_from_block: int = 0) -> tuple[int, list[int], list[tuple[Job, str]]]:
        """Remember newly seen commits, mark those another verifier failed (see the module docstring;
        only commits with commit_block >= `open_from_block`, whose window is still open) and move the
        cursor, atomically; returns (how many commits were new, the ids of the commits marked now, the
        events that cannot be recorded as commits with why: see `unrecordable` and `_reject`)."""
        new, marked, rejected = 0, [], []
        now = time.time()
        with self._tx():
            for job in jobs:
                problem = unrecordable(job)
                if problem is not None:
                    self._reject(job, problem, now)
                    rejected.append((job, problem))
                    continue
                cur = self._db.execute(
                    "INSERT OR IGNORE INTO commits (commit_id, worker, version, nonce, header_digest, commit_block, "
                    "status, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (job.commit_id, job.worker.lower(), job.version, str(job.nonce), job.header_digest.hex(),
                     job.commit_block, PENDING, now))
                new += cur.rowcount
            for verdict in failing:
                cur = self._db.execute(
                    "UPDATE commits SET corroborates = ?, failing_evidence = ?, status = ?, ok = NULL, reason = NULL, "
                    "updated = ? WHERE commit_id = ? AND corroborates IS NULL AND status IN (?, ?) "
                    "AND commit_block >= ?",
                    (verdict.verifier.lower(), bytes(verdict.evidence_digest).hex(), PENDING, now, verdict.commit_id,
                     PENDING, SKIPPED, int(open_from_block)))
                if cur.rowcount:
                    marked.append(verdict.commit_id)
            self._db.execute("INSERT INTO meta (key, value) VALUES ('cursor', ?) "
                             "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (str(int(next_block)),))
        return new, marked, rejected

    def _reject(self, job: Job, problem: str, now: float) -> None:
        """Keep a commit `unrecordable` refused as an `error` row, with the event as read in its reason; a value
        its column cannot hold is stored as -1 there. A commit id no row can hold leaves only the caller's log."""
        if not _in_range(job.commit_id, INT64_END):
            return
        digest = job.header_digest.hex() if isinstance(job.header_digest, bytes) else str(job.header_digest)
        self._db.execute(
            "INSERT OR IGNORE INTO commits (commit_id, worker, version, nonce, header_digest, commit_block, status, "
            "reason, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (job.commit_id, str(job.worker).lower(), job.version if _in_range(job.version, INT64_END) else -1,
             str(job.nonce), digest, job.commit_block if _in_range(job.commit_block, INT64_END) else -1, ERROR,
             f"event not recorded: {problem}; as read: {job!r}"[:1000], now))

    # ------------------------------------------------------------------ decisions

    def pending(self) -> list[Job]:
        """Commits still to decide, oldest (nearest deadline) first."""
        rows = self._db.execute("SELECT commit_id, worker, version, nonce, header_digest, commit_block, corroborates, "
                                "failing_evidence FROM commits WHERE status = ? ORDER BY commit_id",
                                (PENDING,)).fetchall()
        return [Job(r[0], r[1], r[2], int(r[3]), bytes.fromhex(r[4]), r[5], r[6], None if r[7] is None else bytes.fromhex(r[7]))
                for r in rows]

    def finish(self, commit_id: int, status: str, *, ok: bool | None = None, reason: str | None = None,
               evidence_cid: str | None = None, tx_hash: str | None = None, origin: str | None = None) -> bool:
        """Record the final decision on a pending commit; False if it was already final (nothing changes).
        `origin`: why it was replayed (`selected` or `corroborating`), for a commit that got that far."""
        if status not in FINAL:
            raise ValueError(f"status: {status!r} is not one of {FINAL}")
        if origin not in (None, SELECTED, CORROBORATING):
            raise ValueError(f"origin: {origin!r} is not one of {(SELECTED, CORROBORATING)}")
        with self._tx():
            cur = self._db.execute(
                "UPDATE commits SET status = ?, ok = ?, reason = ?, evidence_cid = ?, tx_hash = ?, origin = ?, "
                "updated = ? WHERE commit_id = ? AND status = ?",
                (status, None if ok is None else int(ok), reason, evidence_cid, tx_hash, origin, time.time(),
                 commit_id, PENDING))
            return cur.rowcount == 1

    def decision(self, commit_id: int) -> Decision | None:
        row = self._db.execute("SELECT commit_id, status, ok, reason, evidence_cid, tx_hash, origin, corroborates "
                               "FROM commits WHERE commit_id = ?", (commit_id,)).fetchone()
        if row is None:
            return None
        return Decision(row[0], row[1], None if row[2] is None else bool(row[2]), row[3], row[4], row[5], row[6],
                        row[7])

    def counts(self) -> dict[str, int]:
        """Commits per status, plus `passed` and `failed` among the attested, and `corroborated` (attested
        though not selected, after another verifier's failing verdict: `corroborated_failed` of them failed
        too) and `corroborating` (pending for that reason)."""
        out = {s: 0 for s in (PENDING, *FINAL)}
        for status, n in self._db.execute("SELECT status, COUNT(*) FROM commits GROUP BY status"):
            out[status] = n
        for ok, n in self._db.execute("SELECT ok, COUNT(*) FROM commits WHERE status = ? GROUP BY ok", (ATTESTED,)):
            out["passed" if ok else "failed"] = out.get("passed" if ok else "failed", 0) + n
        out.setdefault("passed", 0)
        out.setdefault("failed", 0)
        # An older release's file read as it is (`open_read_only`) lacks the later columns: none of its commits
        # was replayed to corroborate.
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(commits)")}
        out["corroborated"] = out["corroborated_failed"] = out["corroborating"] = 0
        if "origin" in columns:
            row = self._db.execute("SELECT COUNT(*), COALESCE(SUM(ok = 0), 0) FROM commits WHERE status = ? "
                                   "AND origin = ?", (ATTESTED, CORROBORATING)).fetchone()
            out["corroborated"], out["corroborated_failed"] = int(row[0]), int(row[1])
        if "corroborates" in columns:
            out["corroborating"] = self._db.execute("SELECT COUNT(*) FROM commits WHERE status = ? AND corroborates "
                                                    "IS NOT NULL", (PENDING,)).fetchone()[0]
        return out


def unrecordable(job: Job) -> str | None:
    """Why `job` cannot be stored as a pending commit (a value its column cannot hold), or None."""
    for name, end in (("commit_id", INT64_END), ("version", INT64_END), ("nonce", UINT64_END),
                      ("commit_block", INT64_END)):
        value = getattr(job, name)
        if not _in_range(value, end):
            return f"{name} {value!r} is not an integer in [0, {end})"
    if not isinstance(job.worker, str) or not isinstance(job.header_digest, bytes):
        return f"worker {job.worker!r} is not a string or header digest {job.header_digest!r} not bytes"
    return None


def _in_range(value, end: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < end


class VerifierStateError(KrillError):
    """The state file cannot be written (a full disk, an I/O error): the verifier stops, nothing recorded."""


# SQLite's primary result codes for a write the disk refused (the extended codes keep them in the low byte).
# Not SQLITE_READONLY: a read-only opener's writes (`open_read_only`) fail as sqlite3 reports them.
_UNWRITABLE = frozenset({13, 10})  # SQLITE_FULL, SQLITE_IOERR


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error) on an autocommit connection.

    A write the disk refuses, in a statement or at the COMMIT, is rolled back (unless SQLite already did)
    and raised as `VerifierStateError` naming the file: it was sqlite3's "database or disk is full", naming
    none, as a traceback."""

    def __init__(self, db: sqlite3.Connection, path: Path):
        self._db, self._path = db, path

    def __enter__(self):
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            self._raise_unwritable(exc)
            raise
        return self._db

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            try:
                self._db.execute("COMMIT")
                return
            except sqlite3.Error as exc:
                value = exc
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")
        if isinstance(value, sqlite3.Error):
            self._raise_unwritable(value)
            if kind is None:
                raise value

    def _raise_unwritable(self, exc: sqlite3.Error) -> None:
        if (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF in _UNWRITABLE:
            raise VerifierStateError(f"cannot write the verifier state {self._path}: {exc}; free space there (or "
                                     "fix the file system) and start the verifier again: nothing is lost, each "
                                     "commit not recorded is looked at again, and an attestation already sent is "
                                     "found on-chain") from None
