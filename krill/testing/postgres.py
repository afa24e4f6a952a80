"""A throwaway PostgreSQL server for tests: `with postgres_server() as url: ...`.

Design decisions:
- The server is the distribution's own (`/usr/lib/postgresql/<major>/bin`, else `initdb` on PATH),
  initialised on a fresh temporary directory with trust authentication, `fsync=off` and no
  durability work: it exists for one test session and is thrown away.
- `initdb` refuses to run as root, so when we are root the data directory is handed to the
  `postgres` system user and every server command runs as that user through `runuser`. As any
  other user the commands run as ourselves.
- It listens on 127.0.0.1 only, on a port that was free a moment ago, with its Unix socket inside
  the data directory (never the system's /var/run/postgresql).
- It is stopped by the PID it wrote (`pg_ctl stop -m immediate`, then SIGKILL of that PID if it
  is still alive), so a test run never leaks a server and never touches one it did not start.
- Missing binaries (or root without a `postgres` user) raise `PostgresUnavailableError` with what
  to install; test fixtures turn it into a skip naming the reason.
- `create_database(url, name)` gives each test its own empty database on the shared server:
  cheaper than a server per test, and as isolated.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from krill.errors import KrillError

__all__ = ["PostgresUnavailableError", "create_database", "find_postgres_bin", "postgres_server"]

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class PostgresUnavailableError(KrillError, RuntimeError):
    """No PostgreSQL server can be started here (binaries or the `postgres` user are missing)."""


def find_postgres_bin() -> Path:
    """The directory holding initdb, pg_ctl and postgres (the newest Debian major first, then PATH)."""
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
                        reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path))
    for initdb in candidates:
        if (initdb.parent / "pg_ctl").exists() and (initdb.parent / "postgres").exists():
            return initdb.parent
    raise PostgresUnavailableError(
        "PostgreSQL server binaries (initdb, pg_ctl) not found; install the `postgresql` package "
        "(scripts/test-services.sh does it when run as root)")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_server_user() -> list[str]:
    """The command prefix that runs a server binary as a non-root user."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresUnavailableError("running as root, and there is no `postgres` user to run "
                                       "initdb as (install the `postgresql` package)") from None
    runuser = shutil.which("runuser")
    if runuser is None:
        raise PostgresUnavailableError("running as root without `runuser` to drop to the postgres user")
    return [runuser, "-u", "postgres", "--"]


def _run(cmd: list[str], what: str, timeout: float) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise PostgresUnavailableError(f"{what} failed (exit {done.returncode}): "
                                       f"{(done.stderr or done.stdout).strip()[-800:]}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _server_pid(data: Path) -> int | None:
    try:
        first = (data / "postmaster.pid").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    return int(first) if first.strip().isdigit() else None


def _stop(bindir: Path, prefix: list[str], data: Path, pid: int | None) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired, OSError):
        subprocess.run([*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                       capture_output=True, timeout=20, check=False)
    if pid is not None and _pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)


@contextlib.contextmanager
def postgres_server(start_timeout_s: float = 30.0) -> Iterator[str]:
    """Start a private PostgreSQL server and yield its SQLAlchemy URL (database `postgres`)."""
    bindir = find_postgres_bin()
    prefix = _as_server_user()
    root = Path(tempfile.mkdtemp(prefix="krill-pg-"))
    data = root / "data"
    pid: int | None = None
    try:
        data.mkdir(mode=0o700)
        if prefix:
            owner = pwd.getpwnam("postgres")
            for path in (root, data):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        _run([*prefix, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync",
              "-E", "UTF8", "--locale=C"], "initdb", timeout=120)
        port = _free_port()
        options = (f"-c listen_addresses=127.0.0.1 -p {port} -k {data} -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=100")
        _run([*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(data / "server.log"),
              "-w", "-t", str(int(start_timeout_s)), "start"], "pg_ctl start", timeout=start_timeout_s + 10)
        pid = _server_pid(data)
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        _stop(bindir, prefix, data, pid if pid is not None else _server_pid(data))
        shutil.rmtree(root, ignore_errors=True)


def create_database(server_url: str, name: str) -> str:
    """Create the empty database `name` on the server at `server_url`; return its URL."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    if not _NAME.match(name):
        raise ValueError(f"database name {name!r}: use lowercase letters, digits and _ (at most 63)")
    engine = create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        engine.dispose()
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)
