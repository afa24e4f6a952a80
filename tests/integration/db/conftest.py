"""Database fixtures: every database test runs on SQLite and on a private PostgreSQL server.

The PostgreSQL server is started once per test session (`krill.testing.postgres`) and stopped by
PID at the end; each test gets its own empty database on it. Without the server binaries the
PostgreSQL half skips, naming what to install.
"""

from __future__ import annotations

import itertools

import pytest

from krill.db.session import open_database

_names = itertools.count()


@pytest.fixture(scope="session")
def postgres_url():
    from krill.testing.postgres import PostgresUnavailableError, postgres_server

    try:
        server = postgres_server()
        url = server.__enter__()
    except PostgresUnavailableError as exc:
        pytest.skip(f"PostgreSQL unavailable: {exc}")
    try:
        yield url
    finally:
        server.__exit__(None, None, None)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """The URL of a fresh, empty database on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'krill.db'}"
    from krill.testing.postgres import create_database

    return create_database(request.getfixturevalue("postgres_url"), f"krill_test_{next(_names)}")


@pytest.fixture
def db(db_url):
    database = open_database(db_url)
    yield database
    database.close()
