"""The demo's children: a child already reaped is never signalled again (its PID may belong to another
process by then), and SIGTERM or SIGHUP to the demo stops its children as a Ctrl-C does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from krill.chain.anvil import stop_pid
from krill.demo.processes import ProcessGroup, interrupt_on_signals

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def _spy(monkeypatch) -> list[tuple[str, int, int]]:
    """Record every os.kill and os.killpg (and still send them)."""
    sent: list[tuple[str, int, int]] = []
    for name in ("kill", "killpg"):
        real = getattr(os, name)

        def spy(pid, sig, name=name, real=real):
            sent.append((name, pid, sig))
            return real(pid, sig)

        monkeypatch.setattr(os, name, spy)
    return sent


def test_a_reaped_child_is_never_signalled_and_a_running_one_is_stopped(tmp_path, monkeypatch):
    with ProcessGroup(tmp_path / "logs", dict(os.environ)) as procs:
        done = procs.start("done", [sys.executable, "-c", "pass"])
        done.popen.wait(30)  # reaped: the kernel may hand its PID to anyone now
        live = procs.start("live", SLEEP)
        sent = _spy(monkeypatch)
        stop_pid(done.pid, 1.0, done.popen)
        # The demo stops everyone mid-run, then again on leaving the block (and at interpreter exit).
        procs.stop_all()
        assert not live.running()
        procs.stop_all()
    # One SIGTERM, to the group of the one child that was still running; nothing after it was reaped.
    assert sent == [("killpg", live.pid, signal.SIGTERM)]


def test_the_first_signal_interrupts_later_ones_are_ignored_and_the_handlers_come_back():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    with interrupt_on_signals():
        # Checked first: with the default action, the signals below would end this test process.
        assert all(signal.getsignal(s) not in (signal.SIG_DFL, before[s]) for s in before)
        with pytest.raises(KeyboardInterrupt, match="SIGHUP"):
            signal.raise_signal(signal.SIGHUP)
        try:  # the cleanup the first one started must not be cut short
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGHUP)
        except KeyboardInterrupt:
            pytest.fail("a second signal interrupted the cleanup")
    assert {s: signal.getsignal(s) for s in before} == before


_PARENT = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path

    from krill.demo.processes import ProcessGroup, interrupt_on_signals

    try:
        with interrupt_on_signals(), ProcessGroup(Path(sys.argv[1]), dict(os.environ)) as procs:
            child = procs.start("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
            print(child.pid, flush=True)
            time.sleep(60)
    except KeyboardInterrupt as exc:
        print("interrupted", exc, signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
        sys.exit(3)
""")


def _gone(pid: int) -> bool:
    """No such process, or only a zombie waiting for a reaper that is not us."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_to_the_demo_stops_its_children(tmp_path, signum):
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(tmp_path / "logs")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    child_pid = None
    try:
        child_pid = int(parent.stdout.readline())
        assert not _gone(child_pid)
        parent.send_signal(signum)
        out, err = parent.communicate(timeout=30)
        # The orderly path: KeyboardInterrupt named for the signal, previous handler back, children stopped.
        assert parent.returncode == 3, (parent.returncode, out, err)
        assert out.split() == ["interrupted", signal.Signals(signum).name, "True"], (out, err)
        assert _gone(child_pid)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if child_pid is not None and not _gone(child_pid):
            os.kill(child_pid, signal.SIGKILL)  # only if the code under test left it running
