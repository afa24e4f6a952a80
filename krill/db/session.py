"""Opening the Krill database: engine, sessions, table creation and schema versions.

Design decisions:
- One URL picks the backend: SQLite (the default, `sqlite:///path`) or PostgreSQL
  (`postgresql+psycopg://...`). Everything above this module is backend-neutral.
- SQLite is shared by several processes (coordinator, verifiers, explorer, `krill index`): every
  connection turns on WAL (readers never block the writer), a 30 s busy timeout (writers queue
  instead of failing) and foreign keys. Turning on WAL is retried within that timeout by us
  (`krill.db.wal`): connections racing to switch a new file to WAL get "database is locked" at once,
  without SQLite's busy handler being asked, so processes opening a fresh database together failed.
  pysqlite's own transaction handling is switched off and we emit BEGIN ourselves, so a writer can
  ask for `BEGIN IMMEDIATE` (`Database.write()`): it takes the write lock up front, and its reads
  and writes form one serial transaction instead of failing with "database is locked" when it
  upgrades from reader to writer.
- A small `krill_schema` table records the schema version of the index tables and of the role
  state tables. Opening a database made by another schema raises `SchemaVersionError` saying what
  to do: the index can be rebuilt (`krill index rebuild`); role state cannot, so it is never
  silently migrated. No Alembic: the schema is young, and a rebuildable index needs none.
- Table creation runs under a lock (SQLite's write lock, PostgreSQL's advisory lock), so processes
  that open a fresh database at the same moment do not race on CREATE TABLE; a role creating its
  own tables takes the same lock (`Database.schema_lock`).
- A write the disk refuses (a full disk, an I/O error) inside `session()` or `write()` is one
  `DatabaseFullError` naming the database, so the coordinator and `krill index sync [--follow]`
  stop with one line instead of sqlalchemy's "(sqlite3.OperationalError) database or disk is
  full" traceback, which named neither file nor URL. The transaction is rolled back, so nothing is
  half-applied; the roles redo it on restart (the coordinator's journal, the index's cursor).
- A query over an unbounded list of keys binds them `IN_CHUNK` at a time (`in_chunks`): PostgreSQL
  refuses more than 65 535 bind parameters in one statement (SQLite 32 766).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from krill.db.errors import DatabaseError, DatabaseFullError, SchemaVersionError
from krill.db.models import INDEX_TABLES, STATE_TABLES, IndexBase, SchemaVersion, StateBase
from krill.db.wal import enable_wal

SCHEMA_VERSIONS = {"index": 1, "state": 1}
SQLITE_BUSY_TIMEOUT_S = 30.0
_PG_LOCK_KEY = 0x6B72696C6C  # "krill": advisory lock of schema changes

# A write the disk refused: SQLite's primary codes SQLITE_FULL and SQLITE_IOERR (the extended codes keep them
# in the low byte), PostgreSQL's SQLSTATE disk_full and io_error.
_SQLITE_DISK = frozenset({13, 10})
_PG_DISK = frozenset({"53100", "58030"})

IN_CHUNK = 10_000  # keys per IN (...) query: well under PostgreSQL's 65 535 bind parameters (SQLite's 32 766)


def in_chunks(keys: Sequence, size: int = IN_CHUNK) -> Iterator[Sequence]:
    """`keys` in consecutive slices of at most `size`, one IN (...) query each."""
    for i in range(0, len(keys), size):
        yield keys[i:i + size]


def make_engine(url: str, echo: bool = False) -> Engine:
    """An engine for `url`, with the SQLite settings multi-process sharing needs."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        memory = parsed.database in (None, "", ":memory:")
        if not memory:
            path = Path(parsed.database).expanduser()  # SQLite would open a folder literally named `~`
            path.parent.mkdir(parents=True, exist_ok=True)
            url = parsed.set(database=str(path))
        engine = create_engine(url, echo=echo, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S,
                                                             "check_same_thread": False},
                               poolclass=StaticPool if memory else None)
        _configure_sqlite(engine, memory)
        return engine
    if parsed.get_backend_name() == "postgresql":
        return create_engine(url, echo=echo, pool_pre_ping=True)
    raise DatabaseError(f"database.url: unsupported backend {parsed.get_backend_name()!r}; "
                        "use sqlite:///path.db or postgresql+psycopg://user@host/db")


def _configure_sqlite(engine: Engine, memory: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (see _on_begin)
        cursor = dbapi_connection.cursor()
        if not memory:
            enable_wal(cursor, SQLITE_BUSY_TIMEOUT_S)
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("krill_write") else "BEGIN")


class Database:
    """An open Krill database: `session()` to read and write, `write()` for serialised writers."""

    def __init__(self, url: str, echo: bool = False):
        self.url = url
        self.engine = make_engine(url, echo)
        self.sessions: sessionmaker[Session] = sessionmaker(self.engine, expire_on_commit=False)
        self.write_sessions: sessionmaker[Session] = sessionmaker(
            self.engine.execution_options(krill_write=True), expire_on_commit=False)

    @property
    def backend(self) -> str:
        """'sqlite' or 'postgresql'."""
        return self.engine.dialect.name

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """A session whose transaction commits when the block ends (rolls back on an exception)."""
        with self._disk_errors(), self.sessions.begin() as session:
            yield session

    @contextlib.contextmanager
    def write(self) -> Iterator[Session]:
        """Like `session()`, but holding the database's write lock from the start on SQLite."""
        with self._disk_errors(), self.write_sessions.begin() as session:
            yield session

    @contextlib.contextmanager
    def _disk_errors(self) -> Iterator[None]:
        """A write the disk refused (module docstring) as one `DatabaseFullError` naming the database."""
        from sqlalchemy.exc import DBAPIError

        try:
            yield
        except DBAPIError as exc:
            orig = exc.orig
            if (getattr(orig, "sqlite_errorcode", 0) or 0) & 0xFF in _SQLITE_DISK or \
                    getattr(orig, "sqlstate", None) in _PG_DISK:
                shown = make_url(self.url).render_as_string(hide_password=True)
                raise DatabaseFullError(f"cannot write the database {shown}: {str(orig).strip().splitlines()[0]}; "
                                        "free space there (or fix the file system) and start again: the write was "
                                        "rolled back, and what it was part of is done again") from None
            raise

    # ------------------------------------------------------------------ schema

    @contextlib.contextmanager
    def schema_lock(self) -> Iterator[Any]:
        """A connection in a transaction that holds the schema lock (SQLite's write lock, PostgreSQL's
        advisory lock) until it commits: for creating or altering tables, the core's or a role's."""
        with self.engine.execution_options(krill_write=True).begin() as conn:
            if self.backend == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
            yield conn

    def create_all(self) -> None:
        """Create missing tables and check the schema versions (`SchemaVersionError` on a mismatch)."""
        with self.schema_lock() as conn:
            StateBase.metadata.create_all(conn)
            IndexBase.metadata.create_all(conn)
            with Session(conn) as session:
                found = {row.component: row.version for row in session.scalars(select(SchemaVersion))}
                for component, version in SCHEMA_VERSIONS.items():
                    if component not in found:
                        session.add(SchemaVersion(component=component, version=version))
                    elif found[component] != version:
                        raise SchemaVersionError(_mismatch(component, found[component], version, self.url))
                session.flush()

    def reset_index(self) -> None:
        """Drop every index table and create them empty (role state is kept)."""
        with self.schema_lock() as conn:
            IndexBase.metadata.drop_all(conn)
            IndexBase.metadata.create_all(conn)
            with Session(conn) as session:
                row = session.get(SchemaVersion, "index")
                if row is None:
                    session.add(SchemaVersion(component="index", version=SCHEMA_VERSIONS["index"]))
                else:
                    row.version = SCHEMA_VERSIONS["index"]
                session.flush()

    def table_names(self) -> set[str]:
        return set(inspect(self.engine).get_table_names())

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _mismatch(component: str, found: int, expected: int, url: str) -> str:
    where = f"the {component} tables of {_masked(url)} have schema version {found}; this Krill uses {expected}"
    if component == "index":
        return where + ": run `krill index rebuild` to rebuild the index from the chain"
    return where + ": use a new database (role state is never migrated silently)"


def _masked(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def open_database(url_or_config: Any, create: bool = True, echo: bool = False) -> Database:
    """Open the database of a URL, a `DatabaseConfig` or a `KrillConfig`; create tables unless told not to."""
    url = url_or_config
    if hasattr(url, "database"):
        url = url.database
    if hasattr(url, "url"):
        url = url.url
    if not isinstance(url, str):
        raise DatabaseError(f"database.url: expected a URL string, got {type(url_or_config).__name__}")
    db = Database(url, echo)
    if create:
        try:
            db.create_all()
        except Exception:
            db.close()
            raise
    return db


def table_rows(session: Session, tables=INDEX_TABLES) -> dict[str, list[tuple]]:
    """Every row of `tables` as tuples in primary-key order: a comparable picture of the index."""
    out: dict[str, list[tuple]] = {}
    for table in tables:
        order = list(table.primary_key.columns)
        out[table.name] = [tuple(row) for row in session.execute(select(table).order_by(*order))]
    return out


__all__ = ["INDEX_TABLES", "SCHEMA_VERSIONS", "STATE_TABLES", "Database", "make_engine", "open_database",
           "table_rows"]
