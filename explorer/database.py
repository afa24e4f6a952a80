"""Opening the index database read-only, as the explorer must.

Design decisions:
- The explorer never writes: every connection is made read-only by the database itself, not by
  convention: SQLite connections run with `PRAGMA query_only = ON` (the file stays shared with the
  writing roles through WAL), PostgreSQL sessions with `default_transaction_read_only = on`.
  A write that slipped into the code would fail, not modify the index.
- Nothing is created: a SQLite path that does not exist, or a database without Krill's tables, is
  a clear error saying what to start first, rather than an empty database made on the spot.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import event
from sqlalchemy.engine import make_url

from krill.db.errors import DatabaseError


def open_read_only(url: str):
    """A `krill.db.session.Database` whose every connection refuses writes."""
    from krill.db.session import Database

    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise DatabaseError("the explorer reads an existing database: give a sqlite:///path.db URL, not memory")
        path = Path(parsed.database).expanduser()
        if path.is_dir():  # was told "no database at": as if a coordinator had yet to make one there
            raise DatabaseError(f"{path} is a folder, not a database file: point database.url (or --db) at the "
                                "index's file")
        if not path.is_file():
            raise DatabaseError(f"no database at {path}: start a coordinator (or `krill index sync`) first, "
                                "or point database.url at the index")
    db = Database(url)

    @event.listens_for(db.engine, "connect")
    def _read_only(dbapi_connection, _record) -> None:
        cursor = dbapi_connection.cursor()
        if backend == "sqlite":
            cursor.execute("PRAGMA query_only = ON")
        else:
            cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
        cursor.close()
        if backend != "sqlite":
            dbapi_connection.commit()

    tables = db.table_names()
    if not {"runs", "versions", "participants", "commits"} <= tables:
        db.close()
        raise DatabaseError(f"{parsed.render_as_string(hide_password=True)} holds no Krill index: start a "
                            "coordinator (or run `krill index sync`) against it first")
    return db
