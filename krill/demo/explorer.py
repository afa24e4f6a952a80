"""The demo's explorer child: reported only once it serves.

Design decisions:
- The explorer is a convenience over the run's index, so it failing to start does not stop the
  training: the demo says so in one line (the reason, the log path and the log's last line) and
  leaves `explorer` out of the summary. A port asked for explicitly (`--explorer-port N`) is checked
  before anything starts (`check_port_free`), so a busy one fails the demo up front instead of
  after minutes of set-up; port 0 lets the explorer bind any free port itself, with no race
  between choosing and binding.
- "Serving" means the child printed its `explorer: serving http://...` line, which `krill explorer`
  prints only after it has bound and is listening. A probe of the port would not do: with the port
  held by another process, connecting succeeds while our explorer has already died.
- The index database is created (empty, `open_database`) before the explorer starts: the demo
  starts the explorer before the coordinator, which creates the index only once it runs, and an
  explorer finding no database exits at once ("no database at ...": it did so whenever it beat
  the coordinator to it). It then shows the run as the coordinator indexes it.
- The wait is bounded (`EXPLORER_WAIT_S`: imports take seconds on a loaded machine); a child that
  neither serves nor exits by then is stopped (by PID) and reported as not started.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

from krill.errors import ConfigError, KrillError

EXPLORER_WAIT_S = 60.0
EXPLORER_HOST = "127.0.0.1"  # `explorer.host`'s default, which the demo's configs keep
_SERVING = re.compile(r"explorer: serving (http://\S+)")


class ExplorerNotServing(KrillError):
    """The demo's explorer exited or did not report serving; the message is one line with its log path."""


def check_port_free(port: int, host: str = EXPLORER_HOST) -> None:
    """Raise `ConfigError` if `port` cannot be bound on `host` now (another process listens on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As the explorer's server does (allow_reuse_address), so a port in TIME_WAIT counts as free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"--explorer-port {port}: cannot listen on {host}:{port} ({exc.strerror}); choose "
                              "another port, 0 for any free one, or --no-explorer") from None


def _last_line(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def wait_for_serving(child, offset: int, wait_s: float = EXPLORER_WAIT_S, stop=None) -> str:
    """The URL `child` (a `krill explorer` process) serves, once it says so in its log past byte `offset`.
    Raises `ExplorerNotServing` if it exits first, or after `wait_s` (having called `stop(child)`)."""
    deadline = time.monotonic() + wait_s
    while True:
        exited = not child.running()  # read before the log: a line written before exiting is seen below
        try:
            with open(child.log_path, "rb") as f:
                f.seek(offset)
                found = _SERVING.search(f.read().decode(errors="replace"))
        except OSError:
            found = None
        if found and not exited:
            return found.group(1)
        if exited:
            raise ExplorerNotServing(f"explorer did not start (exit {child.popen.returncode}): "
                                     f"{_last_line(child.log_path, offset) or 'no output'} (log {child.log_path})")
        if time.monotonic() >= deadline:
            if stop is not None:
                stop(child)
            raise ExplorerNotServing(f"explorer did not start serving within {wait_s:.0f} s and was stopped: "
                                     f"{_last_line(child.log_path, offset) or 'no output'} (log {child.log_path})")
        time.sleep(0.1)


def start_explorer(procs, config_path: Path, db_url: str, port: int, audit_report: Path,
                   wait_s: float = EXPLORER_WAIT_S) -> str:
    """Create the index at `db_url` if missing, start `krill explorer` (configured by `config_path`, whose
    database is `db_url`) as the child "explorer" of `procs`, and return its URL once it serves;
    `ExplorerNotServing` (one line) if it does not."""
    from krill.db.session import open_database

    with open_database(db_url):  # the same tables (and schema versions) the coordinator creates
        pass
    log_path = procs.log_dir / "explorer.log"
    offset = log_path.stat().st_size if log_path.exists() else 0  # the log is appended to
    child = procs.krill("explorer", ["--config", str(config_path), "explorer", "--host", EXPLORER_HOST,
                                     "--port", str(port), "--quiet", "--audit-report", str(audit_report)])
    return wait_for_serving(child, offset, wait_s, stop=procs.stop)
