"""`krill.atomic_file.replace_file` and the configuration writers built on it."""

from __future__ import annotations

import errno
import os
import stat
import threading
import tomllib
from pathlib import Path

import pytest

from krill import atomic_file
from krill.atomic_file import replace_file
from krill.config import KrillConfig, write_config
from krill.role_init import _write


def _all_at_once(writers: int, write) -> list[BaseException]:
    barrier = threading.Barrier(writers)
    errors: list[BaseException] = []

    def go(i: int) -> None:
        barrier.wait()
        try:
            write(i)
        except BaseException as exc:  # noqa: BLE001 - every failure is the finding
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


@pytest.mark.parametrize("writer", ["write_config", "role_init"])
def test_writers_of_one_file_at_once_all_succeed_and_leave_one_whole_file(tmp_path: Path, writer: str) -> None:
    # With one fixed temporary name per path, most rounds had a writer fail (FileExistsError or
    # FileNotFoundError): one renamed another's temporary file away, or unlinked it under it.
    config = KrillConfig()
    for round_ in range(40):
        path = tmp_path / f"c{round_}.toml"
        if writer == "write_config":
            errors = _all_at_once(6, lambda i, p=path: write_config(config, p))
        else:
            errors = _all_at_once(6, lambda i, p=path: _write({"worker": {"n": i}}, p, "header"))
        assert errors == []
        tomllib.loads(path.read_text(encoding="utf-8"))
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == []


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary_file(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "devnet.json"
    replace_file(path, "old")

    real_fdopen = os.fdopen

    class FullDisk:
        def __init__(self, handle):
            self._handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._handle.close()

        def fileno(self):
            return self._handle.fileno()

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic_file.os, "fdopen", lambda fd, *a, **k: FullDisk(real_fdopen(fd, *a, **k)))
    with pytest.raises(OSError, match="No space left"):
        replace_file(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["devnet.json"]


def test_files_get_the_mode_asked_for_from_their_creation(tmp_path: Path) -> None:
    secret, public = tmp_path / "secret.toml", tmp_path / "sub" / "public.json"
    replace_file(secret, "a")
    replace_file(public, "b", mode=0o644)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(public.stat().st_mode) == 0o644
    assert public.read_text() == "b"
