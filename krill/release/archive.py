"""The release as one deterministic object: a tar archive with fixed metadata.

Design decisions:
- One object, one CID: the model directory's files go into a POSIX ustar archive under one
  top-level folder, in sorted name order, with mtime 0, uid/gid 0, empty owner names, mode 0644
  (0755 for the folder). The same files always give the same bytes, hence the same CID, on any
  machine; nothing about the host or the clock leaks in.
- A plain tar rather than the krill file bundle: the bundle deliberately refuses weight files,
  and anyone can unpack a tar (`ipfs cat CID | tar x`) without Krill.
- Reading back (`read_archive`) accepts only what `write_archive` writes: regular files directly
  under the one folder, with safe names and a size cap, so unpacking an untrusted release cannot
  write outside its directory.
"""

from __future__ import annotations

import io
import re
import tarfile

from krill.errors import PayloadError

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
MAX_ARCHIVE_FILE_BYTES = 64 << 30


def _info(name: str, size: int, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.uid, info.gid, info.uname, info.gname = size, 0, 0, 0, "", ""
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = 0o755 if directory else 0o644
    return info


def write_archive(folder: str, files: dict[str, bytes]) -> bytes:
    """A deterministic ustar archive of `files` under `folder/`."""
    for name in [folder, *files]:
        if not _SAFE_NAME.match(name):
            raise PayloadError(f"name {name!r} is not allowed in a release archive", field="release.files")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        tar.addfile(_info(folder, 0, directory=True))
        for name in sorted(files):
            tar.addfile(_info(f"{folder}/{name}", len(files[name])), io.BytesIO(files[name]))
    return buffer.getvalue()


def read_archive(data: bytes) -> tuple[str, dict[str, bytes]]:
    """(folder, files) of a release archive, refusing anything `write_archive` would not write."""
    files: dict[str, bytes] = {}
    folder = None
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for member in tar:
                if member.isdir() and folder is None and _SAFE_NAME.match(member.name):
                    folder = member.name
                    continue
                head, _, name = member.name.partition("/")
                if (not member.isreg() or head != folder or not _SAFE_NAME.match(name) or name in files
                        or member.size > MAX_ARCHIVE_FILE_BYTES):
                    raise PayloadError(f"unexpected member {member.name!r}", field="release.archive")
                files[name] = tar.extractfile(member).read()
    except tarfile.TarError as exc:
        raise PayloadError(f"not a tar archive: {exc}", field="release.archive") from None
    if folder is None:
        raise PayloadError("archive has no top-level folder", field="release.archive")
    return folder, files
