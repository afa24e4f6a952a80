"""`taking_turns(path)`: processes on one machine take turns at a step, on an exclusive flock of a file.

Design decisions:
- flock, not a POSIX record lock: a record lock is dropped by closing any descriptor of the file in the
  process, which would drop a lock another library holds on the same file (Kubo's on `repo.lock`); a
  flock belongs to its own open file and is released when it is closed or its process dies, so a killed
  holder never leaves the step locked.
- The lock file is made (mode 0600) if missing and never removed: removing it would let a newcomer lock
  a fresh file while a waiter still holds the old one.
- Where the platform has no flock (`fcntl` missing), or the file system refuses it (`ENOLCK`,
  `EOPNOTSUPP`, `ENOSYS`, `EINVAL`: some network and FUSE mounts), the step runs without taking turns, as
  it did before the lock existed, instead of failing the start it guards. Its callers: a devnet's start (`krill.chain.devnet`) and an embedded Kubo
  node's start on a repo (`krill.store.embedded_kubo`).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

# What a file system without flock answers; any other error (an interrupted wait, a bad descriptor) is raised.
_NO_FLOCK_HERE = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL})


@contextlib.contextmanager
def taking_turns(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path` (made if missing) for the block; waits for any other holder."""
    try:
        import fcntl
    except ImportError:  # no flock on this platform: the step is not serialized
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            if exc.errno not in _NO_FLOCK_HERE:
                raise
        yield
    finally:
        os.close(fd)  # releases the flock
