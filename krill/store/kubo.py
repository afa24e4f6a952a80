"""A Kubo daemon reached through its HTTP RPC API.

Design decisions:
- Plain httpx against `/api/v0/...`, every call a POST as Kubo requires. ipfshttpclient is not used:
  its last release (0.7.0, 2021) refuses any daemon newer than 0.8 by its version check and has no
  CIDv1 / raw-leaves options.
- `add` asks for `cid-version=1&raw-leaves=true` (Kubo's defaults for those flags give the same
  DAG as `krill.store.unixfs`), streams the upload as multipart with an explicit filename and
  content type, and checks the CID the daemon answers against the one computed locally: a daemon
  with another chunker or a lying proxy is caught at write time, not when a verifier reads.
- Reads stream with a byte cap: `block/get` for raw CIDs, `cat` for UnixFS files, stopping as soon
  as the cap is passed; then the content is re-hashed (a stream Kubo breaks off with an
  `X-Stream-Error` trailer, which httpx does not expose, fails this check) (sha256 for a raw block, the full UnixFS DAG
  for a file) before it is returned.
- Rebuilding a file's DAG from its bytes checks only DAGs built Krill's way (`file_cid`: CIDv1,
  raw leaves, 256 KiB chunks). Any other file DAG (CIDv0 from plain `ipfs add`, dag-pb leaves,
  another chunker or layout) cannot be checked that way, so when the rebuild does not match,
  the DAG is read block by block (`block/get`) and walked by `read_file` (`iter_file`), which checks every block
  against its CID, as the blockstore-backed stores read every file. Such DAGs cost one request a
  block; a Kubo that returned wrong bytes is caught by the walk, which refuses its blocks.
- `cat` refusing a DAG with an error of its own (HTTP 500: "this dag node is a directory", a node
  it cannot decode) sends the read to the same block walk, which names what is wrong with the
  blocks (`MalformedBlockError`): whoever signed that CID is at fault, not the store, and a plain
  `StoreError` would have read as this node's own failure (a verifier retries it until the window
  closes instead of failing the worker).
- Kubo's `timeout` option bounds how long the daemon looks for content on the network; an answer
  that it could not find it becomes `ContentNotFoundError`, an unreachable daemon
  `StoreUnavailableError`.
"""

from __future__ import annotations

import io
import json
from typing import Any

import httpx

from krill.errors import ContentNotFoundError, IntegrityError, StoreError, StoreUnavailableError
from krill.store.base import Content, ContentStore, ObjectTooLargeError, PreparedContent, _open_content
from krill.store.cid import MAX_BLOCK_SIZE, RAW, cid_parts, file_cid, normalize_cid, raw_block_cid
from krill.store.unixfs import read_file

_NOT_FOUND_MARKERS = ("not found", "no link named", "context deadline exceeded", "could not find")


class KuboStore(ContentStore):
    """Content store backed by a Kubo node's RPC API (`api_url`, e.g. http://127.0.0.1:5001)."""

    def __init__(self, api_url: str, timeout_s: float = 60.0, max_get_bytes: int = 1 << 30,
                 transport: httpx.BaseTransport | None = None):
        self.api_url = api_url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self.max_get_bytes = int(max_get_bytes)
        self._client = httpx.Client(base_url=f"{self.api_url}/api/v0",
                                    timeout=httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 10.0)),
                                    transport=transport)

    # ------------------------------------------------------------------ transport

    def _post(self, command: str, params: dict[str, Any], files: Any = None) -> httpx.Response:
        try:
            response = self._client.post(f"/{command}", params=params, files=files)
        except httpx.TimeoutException:
            raise ContentNotFoundError(f"Kubo at {self.api_url} did not answer {command} within "
                                       f"{self.timeout_s}s") from None
        except httpx.TransportError as exc:
            raise StoreUnavailableError(f"cannot reach Kubo at {self.api_url} ({exc}); is the daemon "
                                        "running and is store.api_url right?") from None
        if response.status_code != 200:
            self._raise(command, response.status_code, response.content)
        return response

    def _raise(self, command: str, status: int, body: bytes) -> None:
        try:
            message = json.loads(body).get("Message", "")
        except (ValueError, AttributeError):
            message = body[:200].decode("utf-8", "replace")
        if any(marker in message.lower() for marker in _NOT_FOUND_MARKERS):
            raise ContentNotFoundError(f"Kubo {command}: {message}")
        raise StoreError(f"Kubo {command} failed with HTTP {status}: {message or 'no message'}")

    def _json(self, response: httpx.Response) -> dict:
        lines = [line for line in response.text.splitlines() if line.strip()]
        try:
            return json.loads(lines[-1])
        except (IndexError, ValueError):
            raise StoreError(f"Kubo answered with something that is not JSON: {response.text[:200]!r}") from None

    # ------------------------------------------------------------------ writes

    def add(self, data: Content, pin: bool = False) -> str:
        with _open_content(data) as stream:
            start = stream.tell() if stream.seekable() else None
            expected = file_cid(stream)
            if start is None:
                raise StoreError("Kubo add needs bytes, a path or a seekable stream (it is read twice)")
            stream.seek(start)
            return self._upload(stream, expected, pin)

    def put_prepared(self, prepared: PreparedContent, pin: bool = False) -> str:
        """Upload what `prepare` hashed, checking Kubo's answer against the CID it computed (no second hash here)."""
        return self._upload(io.BytesIO(prepared.data), prepared.cid, pin)

    def _upload(self, stream, expected: str, pin: bool) -> str:
        """`ipfs add` the stream; Kubo's CID must be `expected` (what the content hashes to here)."""
        response = self._post("add", {"cid-version": 1, "raw-leaves": "true", "pin": _flag(pin),
                                      "chunker": "size-262144", "hash": "sha2-256", "progress": "false"},
                              files={"file": ("blob", stream, "application/octet-stream")})
        answered = self._json(response).get("Hash", "")
        if normalize_cid(answered) != expected:
            raise IntegrityError(f"Kubo stored the content as {answered} but it hashes to {expected}")
        return expected

    def _put_raw(self, cid: str, block: bytes) -> None:
        response = self._post("block/put", {"cid-codec": "raw", "mhtype": "sha2-256", "pin": "false"},
                              files={"file": ("block", block, "application/octet-stream")})
        answered = self._json(response).get("Key", "")
        if normalize_cid(answered) != cid:
            raise IntegrityError(f"Kubo stored the block as {answered} but it hashes to {cid}")

    # ------------------------------------------------------------------ reads

    def _stream(self, command: str, params: dict[str, Any], limit: int) -> bytes:
        out = bytearray()
        try:
            with self._client.stream("POST", f"/{command}", params=params) as response:
                if response.status_code != 200:
                    self._raise(command, response.status_code, response.read())
                for piece in response.iter_bytes():
                    out += piece
                    if len(out) > limit:
                        raise ObjectTooLargeError(f"{params['arg']} is larger than the limit of {limit} bytes")
        except httpx.TimeoutException:
            raise ContentNotFoundError(f"Kubo found no {params['arg']} within {self.timeout_s}s") from None
        except httpx.TransportError as exc:
            raise StoreUnavailableError(f"cannot reach Kubo at {self.api_url} ({exc})") from None
        return bytes(out)

    def _get(self, cid: str, limit: int) -> bytes:
        timeout = f"{int(self.timeout_s * 1000)}ms"
        if cid_parts(cid)[0] == RAW:
            data = self._stream("block/get", {"arg": cid, "timeout": timeout}, limit)
            if raw_block_cid(data) != cid:
                raise IntegrityError(f"Kubo returned {len(data)} bytes for {cid} that do not hash to it")
            return data
        try:
            data = self._stream("cat", {"arg": cid, "length": limit + 1, "timeout": timeout}, limit)
        except (ContentNotFoundError, StoreUnavailableError, ObjectTooLargeError):
            raise
        except StoreError:  # Kubo refused the DAG itself ("this dag node is a directory", a node it cannot
            data = None    # decode): the walk below decides, and names what is wrong with the worker's blocks
        if data is not None and file_cid(data) == cid:
            return data
        # Another DAG layout (CIDv0, dag-pb leaves, ...), or wrong bytes: walk it, checking each block.
        return read_file(lambda block: self._stream("block/get", {"arg": block, "timeout": timeout},
                                                    MAX_BLOCK_SIZE * 2), cid, limit)

    def has(self, cid: str) -> bool:
        cid = normalize_cid(cid)
        try:
            self._post("block/stat", {"arg": cid, "offline": "true"})
        except ContentNotFoundError:
            return False
        return True

    def pin(self, cid: str) -> None:
        self._post("pin/add", {"arg": normalize_cid(cid), "recursive": "true"})

    def pin_all(self, cids: list[str]) -> None:
        """One `pin/add` request for all of `cids` (the API takes `arg` repeated)."""
        if cids:
            self._post("pin/add", {"arg": [normalize_cid(c) for c in cids], "recursive": "true"})

    def unpin(self, cid: str) -> None:
        try:
            self._post("pin/rm", {"arg": normalize_cid(cid), "recursive": "true"})
        except StoreError as exc:
            if "not pinned" not in str(exc):
                raise

    def close(self) -> None:
        self._client.close()


def _flag(value: bool) -> str:
    return "true" if value else "false"
