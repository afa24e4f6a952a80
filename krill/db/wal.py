"""Switching a SQLite file to WAL when several connections open it at the same moment.

Design decisions:
- SQLite refuses `PRAGMA journal_mode=WAL` with SQLITE_BUSY at once, without asking its busy handler,
  when another connection is switching the same new file, so processes opening a fresh file together
  failed with "database is locked". The switch is retried here for as long as the caller's busy
  timeout; any other error, or a busy past the deadline, propagates.
- Standard library only: the database layer (`krill.db.session`) and a role's private `sqlite3` state
  file (the verifier's) share it, the latter without importing SQLAlchemy.
"""

from __future__ import annotations

import sqlite3
import time


def enable_wal(cursor, timeout_s: float) -> None:
    """`PRAGMA journal_mode=WAL` on `cursor` (a DB-API cursor or connection), retried while another connection
    holds the lock it needs, for `timeout_s` at most."""
    deadline = time.monotonic() + timeout_s
    delay = 0.002
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            busy = (getattr(exc, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_BUSY  # or an extended BUSY code
            if not busy or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
