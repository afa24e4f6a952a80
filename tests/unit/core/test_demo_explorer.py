"""The demo's explorer child is reported only once it says it serves: one that exits (a busy port) or
never serves is named in one line with its log, and a busy port asked for explicitly fails up front."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from krill.demo.explorer import ExplorerNotServing, check_port_free, wait_for_serving
from krill.demo.processes import ProcessGroup
from krill.errors import ConfigError

BUSY = ("import sys; print('Traceback (most recent call last):'); "
        "print('OSError: [Errno 98] Address already in use'); sys.exit(1)")
SERVES = "import time; print('explorer: serving http://127.0.0.1:4321/ (read-only; Ctrl-C stops)'); time.sleep(60)"


def test_an_explorer_that_exits_is_named_with_its_log_line_and_status(tmp_path):
    with ProcessGroup(tmp_path / "logs", dict(os.environ)) as procs:
        log = tmp_path / "logs" / "explorer.log"
        log.write_text("explorer: serving http://127.0.0.1:9/ (an earlier demo's line)\n")
        offset = log.stat().st_size
        child = procs.start("explorer", [sys.executable, "-c", BUSY])
        with pytest.raises(ExplorerNotServing) as refused:
            wait_for_serving(child, offset, wait_s=60)
    message = str(refused.value)
    assert message == (f"explorer did not start (exit 1): OSError: [Errno 98] Address already in use (log {log})")


def test_the_url_is_the_one_the_explorer_says_it_serves(tmp_path):
    with ProcessGroup(tmp_path / "logs", dict(os.environ)) as procs:
        child = procs.start("explorer", [sys.executable, "-c", SERVES])
        assert wait_for_serving(child, 0, wait_s=60) == "http://127.0.0.1:4321/"
        assert child.running()


def test_an_explorer_that_never_serves_is_stopped_after_the_wait(tmp_path):
    with ProcessGroup(tmp_path / "logs", dict(os.environ)) as procs:
        child = procs.start("explorer", [sys.executable, "-c", "import time; print('importing'); time.sleep(60)"])
        with pytest.raises(ExplorerNotServing, match=r"did not start serving within 1 s and was stopped: importing"):
            wait_for_serving(child, 0, wait_s=1.0, stop=procs.stop)
        assert not child.running()


def test_a_busy_explicit_port_is_refused_up_front():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"--explorer-port {port}: cannot listen on 127.0.0.1:{port} "
                                              r"\(Address already in use\)"):
            check_port_free(port)
    check_port_free(port)  # free again once its holder closed
