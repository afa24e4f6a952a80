"""Child processes of the demo: started with their own logs, always stopped by PID.

Design decisions:
- Each role runs as a separate OS process (`python -m krill.cli <role> ...`), exactly as a real
  deployment runs it; the demo only starts, watches and stops them.
- Children get their own process group, so a Ctrl-C in the terminal reaches the demo alone; the
  demo then stops every child it started (SIGTERM, then SIGKILL after a grace period) and nothing
  else. `ProcessGroup` is a context manager, and an atexit hook covers interpreter exit.
- A child is signalled only while its Popen has not reaped it: once reaped, its PID (and the
  process group named after it) may belong to an unrelated process. `stop_all` runs more than
  once (mid-run, on exit, at interpreter exit) and covers children finished long ago.
- SIGTERM and SIGHUP (`kill`, a job timeout, a closed terminal) would end Python without running
  `__exit__` or atexit, and the children, in their own sessions, would run on. For the demo's
  lifetime `interrupt_on_signals` turns them into the KeyboardInterrupt a Ctrl-C raises, so an
  interrupted demo stops and writes exactly what it does on Ctrl-C. A repeated signal is ignored
  while that cleanup runs, since cutting it short would leave children behind.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from krill.chain.anvil import stop_pid


@dataclass
class Child:
    name: str
    popen: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class ProcessGroup:
    """The children of one demo run."""

    def __init__(self, log_dir: Path, env: dict[str, str]):
        self.log_dir = log_dir
        self.env = env
        self.children: list[Child] = []
        log_dir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop_all)

    def krill(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Child:
        """Start `krill <args>` as a child named `name` (log in log_dir/name.log)."""
        return self.start(name, [sys.executable, "-m", "krill.cli", *args], env)

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        """Start `argv` as a child named `name`, in its own session (log in log_dir/name.log)."""
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env={**self.env, **(env or {}), "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        child = Child(name, popen, log_path)
        self.children.append(child)
        return child

    def run(self, name: str, args: list[str], env: dict[str, str] | None = None, timeout: float = 600,
            ok_exit: tuple[int, ...] = (0,)) -> str:
        """Run `krill <args>` to completion; returns its output or raises with the log's tail.

        `ok_exit`: exit statuses that are answers rather than failures (`krill audit` exits 1 on a mismatch).
        """
        from krill.errors import KrillError

        child = self.krill(name, args, env)
        try:
            child.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            stop_pid(child.pid, 5.0, child.popen)
            raise KrillError(f"`krill {' '.join(args)}` did not finish in {timeout:.0f}s; see {child.log_path}") from None
        if child.popen.returncode not in ok_exit:
            raise KrillError(f"`krill {' '.join(args)}` failed (exit {child.popen.returncode}):\n{child.tail()}")
        return child.log_path.read_text(errors="replace")

    def stop(self, child: Child, grace: float = 10.0) -> None:
        # running() polls: only a leader not yet reaped (a zombie at worst) still holds its PID and group id.
        if child.running():
            try:
                os.killpg(child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + grace
            while child.running() and time.monotonic() < deadline:
                time.sleep(0.05)
        stop_pid(child.pid, 1.0, child.popen)

    def stop_all(self, keep: tuple[str, ...] = ()) -> None:
        """Stop every child (newest first) except those named in `keep`."""
        for child in reversed(self.children):
            if child.name not in keep:
                self.stop(child, grace=5.0)

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()
        atexit.unregister(self.stop_all)


@contextmanager
def interrupt_on_signals(signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Within the block, the first of `signums` raises KeyboardInterrupt (as a Ctrl-C does) and later ones
    are ignored, so the cleanup it starts runs to the end; the previous handlers come back on leaving.

    Python delivers signals to the main thread only; from any other thread this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = False

    def interrupt(signum: int, frame) -> None:
        nonlocal fired
        if not fired:
            fired = True
            raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {signum: signal.signal(signum, interrupt) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            # None: a handler not installed from Python; the default is the nearest we can restore.
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
