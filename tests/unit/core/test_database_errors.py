"""A database that cannot be opened is one line naming the URL (password hidden), from every command."""

from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner

from krill.cli import cli
from krill.config import load_config
from krill.db.errors import DatabaseError
from krill.errors import ConfigError


@pytest.fixture
def refused_url():
    """A PostgreSQL URL whose port is bound and never listening: a connection to it is refused."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        yield f"postgresql+psycopg://alice:s3cret-pw@127.0.0.1:{closed.getsockname()[1]}/index"


def test_open_configured_database_names_the_url_without_its_password(refused_url, tmp_path, monkeypatch):
    """Before: sqlalchemy's OperationalError (and, for SQLite, FileNotFoundError / NotADirectoryError) escaped
    `krill index sync|status|rebuild` and `krill coordinator run` as a traceback."""
    from krill.runtime import open_configured_database

    monkeypatch.setenv("KRILL_HOME", str(tmp_path / "home"))
    with pytest.raises(DatabaseError) as refused:
        open_configured_database(load_config(None, [f"database.url={refused_url}"], environ={}))
    text = str(refused.value)
    assert text.startswith("cannot open the database postgresql+psycopg://alice:***@127.0.0.1:") and "refused" in text
    assert "s3cret-pw" not in text and "\n" not in text
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(DatabaseError, match=r"cannot open the database sqlite:///.*/file/sub/x\.db: Not a directory"):
        open_configured_database(load_config(None, [f"database.url=sqlite:///{a_file}/sub/x.db"], environ={}))



def test_a_sqlite_file_that_cannot_be_opened_is_not_blamed_on_a_server(tmp_path, monkeypatch):
    """Before: a SQLite URL naming a folder (or a database on a full disk) was told to check 'that its server
    is running'; SQLite has none."""
    from krill.runtime import open_configured_database

    monkeypatch.setenv("KRILL_HOME", str(tmp_path / "home"))
    (tmp_path / "a-folder.db").mkdir()
    with pytest.raises(DatabaseError) as refused:
        open_configured_database(load_config(None, [f"database.url=sqlite:///{tmp_path}/a-folder.db"], environ={}))
    assert str(refused.value) == (f"cannot open the database sqlite:///{tmp_path}/a-folder.db: unable to open "
                                  "database file; check database.url: it must name a database file (not a folder) in a "
                                  "writable folder, on a disk with room")


def test_index_status_with_a_database_that_cannot_be_opened_is_one_line(refused_url, tmp_path, monkeypatch):
    import krill.runtime

    monkeypatch.setattr(krill.runtime, "connect_chain", lambda config: object())  # the chain is not the point
    result = CliRunner().invoke(cli, ["--set", f"database.url={refused_url}", "index", "status"],
                                env={"KRILL_HOME": str(tmp_path / "home"), "KRILL_CONFIG": None})
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    assert result.output.startswith("error: cannot open the database postgresql+psycopg://alice:***@"), result.output
    assert result.output.count("\n") == 1 and "s3cret-pw" not in result.output


def test_database_url_drivers_are_checked_at_load_and_the_password_is_not_echoed():
    """Before: `postgresql+pyscopg://...` (a typo) or `postgresql+asyncpg://...` passed validation and failed at
    first use with NoSuchModuleError / ModuleNotFoundError tracebacks; a refused URL was echoed with its password."""
    for url in ("postgresql+pyscopg://u:pw-1@h/db", "postgresql+asyncpg://u:pw-1@h/db", "sqlite+foo:///x.db",
                "mysql://u:pw-1@h/db"):
        with pytest.raises(ConfigError, match=r"database\.url: expected a sqlite:///path\.db") as refused:
            load_config(None, [f"database.url={url}"], environ={})
        assert "pw-1" not in str(refused.value)
    for url in ("sqlite+pysqlite:///k.db", "postgresql+psycopg2://u@h/db"):
        assert load_config(None, [f"database.url={url}"], environ={}).database.url == url


def test_explorer_checks_its_db_flag_as_database_url(tmp_path):
    result = CliRunner().invoke(cli, ["explorer", "--port", "0", "--db", "postgresql+asyncpg://u:pw-2@127.0.0.1/x"],
                                env={"KRILL_HOME": str(tmp_path / "home"), "KRILL_CONFIG": None})
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    assert result.output.startswith("error: --db: expected a sqlite:///path.db"), result.output
    assert "pw-2" not in result.output and result.output.count("\n") == 1


@pytest.mark.parametrize("content", [b"notes, not a database\n", b"SQLite format 3\x00" + b"garbage" * 600],
                         ids=["text-file", "damaged-database"])
def test_a_sqlite_url_naming_a_file_that_is_not_a_database_is_one_line_and_the_file_is_kept(content, tmp_path):
    """Before: sqlalchemy's DatabaseError ('file is not a database') escaped `krill explorer`, `krill index ...`
    and `krill coordinator run` as a traceback."""
    not_a_db = tmp_path / "notes.txt"
    not_a_db.write_bytes(content)
    result = CliRunner().invoke(cli, ["explorer", "--port", "0", "--db", f"sqlite:///{not_a_db}"],
                                env={"KRILL_HOME": str(tmp_path / "home"), "KRILL_CONFIG": None})
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    assert result.output == (f"error: cannot open the index database sqlite:///{not_a_db}: file is not a database; "
                             "check database.url (or --db): it names a file that is not a SQLite database, or a "
                             "damaged one (left untouched)\n"), result.output
    assert not_a_db.read_bytes() == content
    assert not list(tmp_path.glob("notes.txt-*"))  # no -wal / -shm journal beside it either
