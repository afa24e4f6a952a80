"""A role's own tables on a fresh database opened by several coordinators at once: `ensure_tables` runs
under the database's schema lock, so none of them fails at start-up (on PostgreSQL every opener used to
see the journal table missing, and the losers' CREATE TABLE failed on the duplicate type)."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import inspect

from krill.coordinator.journal import ensure_tables
from krill.db.session import open_database

OPENERS = 4


@pytest.mark.parametrize("trial", range(3))
def test_concurrent_openers_of_a_fresh_database_all_create_the_coordinator_tables(db_url, trial):
    barrier = threading.Barrier(OPENERS)
    failures: list[str] = []
    databases = [open_database(db_url) for _ in range(OPENERS)]  # one engine each, as separate processes have

    def opener(database) -> None:
        try:
            barrier.wait(timeout=60)
            ensure_tables(database)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            failures.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")

    threads = [threading.Thread(target=opener, args=(database,)) for database in databases]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in threads)
        assert failures == []
        with databases[0].engine.connect() as conn:
            columns = {c["name"] for c in inspect(conn).get_columns("coordinator_versions")}
        assert {"served_shards", "keep_states"} <= columns
    finally:
        for database in databases:
            database.close()
