"""`replace_file(path, text)`: replace a small file whole or not at all, through a temporary name of its own.

Design decisions:
- The temporary file is made by `mkstemp` in the target's folder, so it is on the same file system and
  the rename is atomic. Fixed temporary names (`x.tmp`, `.x.toml.tmp`) were shared by every writer of one
  path: two writers at once could rename the other's half-written file into place, or find theirs renamed
  away (`FileNotFoundError`).
- The file is created with its final mode (0600 by default, which `mkstemp` gives): configuration files
  hold secrets, and a chmod after the write would leave them readable for a moment.
- On any failure (a full disk, an interrupt) the temporary file is removed and the old file is left as it
  was: a failed write leaves nothing behind.
- No fsync: its callers write configuration and state files that a command reports when it finishes, and
  a torn temporary file never replaces the old one. The worker's nonce state, which must survive a power
  cut, keeps its own fsynced writer (`worker.nonce_state`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def replace_file(path: Path, text: str, mode: int = 0o600) -> None:
    """Write `text` (UTF-8) to `path`, replacing any file there at once; the folder is made if missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            if mode != 0o600:
                os.fchmod(out.fileno(), mode)
            out.write(text)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
