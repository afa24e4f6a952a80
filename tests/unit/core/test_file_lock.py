"""`krill.file_lock.taking_turns`: processes take turns; a file system without flock does not stop the step."""

from __future__ import annotations

import errno
import multiprocessing
import time
from pathlib import Path

import pytest

from krill.file_lock import taking_turns


def _hold(path: str, held, seconds: float) -> None:
    with taking_turns(Path(path)):
        held.set()
        time.sleep(seconds)


def test_a_second_process_waits_for_the_holder(tmp_path: Path) -> None:
    lock = tmp_path / "start.lock"
    ctx = multiprocessing.get_context("fork")
    held = ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(lock), held, 1.0))
    holder.start()
    try:
        assert held.wait(30)
        started = time.monotonic()
        with taking_turns(lock):
            waited = time.monotonic() - started
    finally:
        holder.join(30)
    assert waited > 0.5


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS])
def test_a_file_system_that_refuses_flock_runs_the_step_without_turns(tmp_path: Path, monkeypatch, code) -> None:
    # Some network and FUSE mounts refuse flock; the devnet's and Kubo's starts failed there with the
    # OSError, where they worked before the lock existed.
    import fcntl

    def refused(fd, op):
        raise OSError(code, "flock refused by this file system")

    monkeypatch.setattr(fcntl, "flock", refused)
    ran = []
    with taking_turns(tmp_path / "start.lock"):
        ran.append(True)
    assert ran == [True]


def test_other_flock_errors_are_raised(tmp_path: Path, monkeypatch) -> None:
    import fcntl

    def interrupted(fd, op):
        raise OSError(errno.EBADF, "bad file descriptor")

    monkeypatch.setattr(fcntl, "flock", interrupted)
    with pytest.raises(OSError, match="bad file descriptor"), taking_turns(tmp_path / "start.lock"):
        pytest.fail("the step ran although flock failed")
