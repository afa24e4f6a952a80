"""Content identifiers exactly as Kubo computes them.

Design decisions:
- Krill names every object by an IPFS CID so that any IPFS node can serve it and anyone can check
  it. Two ways in, both matching Kubo byte for byte:
  * `raw_block_cid(data)`: one raw block, CIDv1 codec `raw`, sha2-256, base32 (`bafk...`). Because
    the CID is a fixed prefix plus the sha256 digest, `digest_to_cid(sha256(data))` gives the same
    string: a header whose digest sits on-chain can be located from the chain alone.
  * `file_cid(data)`: the root CID of `ipfs add --cid-version 1 --raw-leaves`: one raw block when
    the content fits one 256 KiB chunk, else a UnixFS balanced DAG (see `krill.store.unixfs`).
- CID and multihash encoding use the maintained `multiformats` package, not hand-rolled varints.
- Speed: `multiformats` validates every argument at run time (about 1 ms per CID), which would
  dominate header validation. The canonical form Krill writes (CIDv1, base32, sha2-256, raw or
  dag-pb) is a fixed 4-byte prefix plus the digest in RFC 4648 base32, so that one form has a fast
  path built from the standard library's base32; anything else (CIDv0, other bases) goes through
  `multiformats`, and the tests check the two agree on every case.
- Only sha2-256 CIDs with codec `raw` or `dag-pb` are accepted (`parse_cid`): those are the only
  ones Krill produces, and refusing the rest means a verifier never has to trust a hash function
  it did not choose. CIDv0 (`Qm...`) is accepted for reading because it is the same multihash.
- Every way a CID string can be wrong ends in `InvalidCIDError`, never in one of `multiformats`'
  own exception types: CID strings come from untrusted places (commit events, headers, manifests,
  a search box), and each caller turns `InvalidCIDError` into its own clear error. `multiformats`
  checks a multihash's declared digest length against its hash function only when the digest is
  first read, after `CID.decode` returned, so that read is guarded too (a sha2-256 multihash
  declaring 64 bytes escaped as `MultihashValueError`).
"""

from __future__ import annotations

import base64
import hashlib
from typing import BinaryIO

from multiformats import CID

from krill.errors import IntegrityError, StoreError

CHUNK_SIZE = 256 * 1024
"""Kubo's default fixed-size chunker (`size-262144`)."""
MAX_LINKS = 174
"""Kubo's balanced layout puts at most this many links in one UnixFS node."""
MAX_BLOCK_SIZE = 1024 * 1024
"""Largest raw block `put_block` stores: what bitswap moves in one message without complaint."""

RAW = "raw"
DAG_PB = "dag-pb"
_ACCEPTED_CODECS = (RAW, DAG_PB)


class InvalidCIDError(StoreError, ValueError):
    """A string is not a CID Krill accepts (malformed, wrong hash function or codec)."""


_PREFIX = {RAW: b"\x01\x55\x12\x20", DAG_PB: b"\x01\x70\x12\x20"}
_CODEC_OF_PREFIX = {prefix: codec for codec, prefix in _PREFIX.items()}


def cid_v1(codec: str, digest: bytes) -> str:
    """Canonical CIDv1 string (base32, sha2-256) for a codec and a 32-byte digest (fast path)."""
    return "b" + base64.b32encode(_PREFIX[codec] + digest).decode("ascii").lower().rstrip("=")


def cid_v1_bytes(codec: str, digest: bytes) -> bytes:
    """The binary form of the same CID, as dag-pb links carry it."""
    return _PREFIX[codec] + digest


def cid_parts(cid: str) -> tuple[str, bytes]:
    """(codec, sha256 digest) of an accepted CID string; canonical CIDv1 strings take the fast path."""
    if isinstance(cid, str) and len(cid) == 59 and cid[0] == "b":
        try:
            raw = base64.b32decode(cid[1:].upper() + "======")
        except ValueError:
            raw = b""
        codec = _CODEC_OF_PREFIX.get(raw[:4])
        if codec is not None and len(raw) == 36 and cid_v1(codec, raw[4:]) == cid:
            return codec, raw[4:]
    parsed = parse_cid(cid)
    return parsed.codec.name, bytes(parsed.raw_digest)


def raw_block_cid(data: bytes) -> str:
    """CIDv1 (raw, sha2-256, base32) of one block: what `ipfs block put --cid-codec raw` returns."""
    return cid_v1(RAW, hashlib.sha256(data).digest())


def dag_pb_cid(block: bytes) -> str:
    """CIDv1 (dag-pb, sha2-256, base32) of an encoded dag-pb node."""
    return cid_v1(DAG_PB, hashlib.sha256(block).digest())


def digest_to_cid(sha256_digest: bytes) -> str:
    """The raw-block CID of content whose sha256 is `sha256_digest` (e.g. an on-chain header digest)."""
    if not isinstance(sha256_digest, bytes | bytearray) or len(sha256_digest) != 32:
        raise InvalidCIDError(f"a sha256 digest is 32 bytes, got {type(sha256_digest).__name__} "
                              f"of length {len(sha256_digest) if hasattr(sha256_digest, '__len__') else '?'}")
    return cid_v1(RAW, bytes(sha256_digest))


def parse_cid(cid: str | CID) -> CID:
    """Decode and check a CID string: v0 or v1, sha2-256 with a 32-byte digest, codec raw or dag-pb."""
    if isinstance(cid, CID):
        parsed = cid
    else:
        if not isinstance(cid, str) or not 1 <= len(cid) <= 128:
            raise InvalidCIDError(f"not a CID string: {cid!r:.80}")
        try:
            parsed = CID.decode(cid)
        except Exception as exc:  # multiformats raises a zoo of types for malformed input
            raise InvalidCIDError(f"malformed CID {cid!r:.80}: {exc}") from None
    try:  # the digest is unwrapped lazily: a declared length the hash function cannot have raises only here
        hashfun, codec = parsed.hashfun.name, parsed.codec.name
        digest_size = len(parsed.raw_digest) if hashfun == "sha2-256" else None
    except Exception as exc:
        raise InvalidCIDError(f"malformed CID {str(cid)!r:.80}: {exc}") from None
    if hashfun != "sha2-256":
        raise InvalidCIDError(f"CID {str(cid):.80} uses {hashfun}; Krill accepts only sha2-256")
    if digest_size != 32:
        raise InvalidCIDError(f"CID {str(cid):.80} has a {digest_size}-byte sha2-256 digest, not 32 bytes")
    if codec not in _ACCEPTED_CODECS:
        raise InvalidCIDError(f"CID {str(cid):.80} has codec {codec}; Krill accepts only raw and dag-pb")
    return parsed


def normalize_cid(cid: str | CID) -> str:
    """The canonical CIDv1 base32 string for `cid` (CIDv0 `Qm...` becomes its `bafy...` twin)."""
    codec, digest = cid_parts(cid) if isinstance(cid, str) else (parse_cid(cid).codec.name, bytes(cid.raw_digest))
    return cid_v1(codec, digest)


def cid_codec(cid: str | CID) -> str:
    """'raw' or 'dag-pb'."""
    return cid_parts(normalize_cid(cid))[0]


def cid_to_digest(cid: str | CID) -> bytes:
    """The sha256 digest inside a raw-block CID (inverse of `digest_to_cid`)."""
    codec, digest = cid_parts(normalize_cid(cid))
    if codec != RAW:
        raise InvalidCIDError(f"CID {cid} is a {codec} node, not a raw block: it names no "
                              "single sha256 of content")
    return digest


def verify_block(cid: str | CID, block: bytes) -> None:
    """Raise `IntegrityError` unless `block` hashes to `cid` (any accepted codec)."""
    if hashlib.sha256(block).digest() != cid_parts(normalize_cid(cid))[1]:
        raise IntegrityError(f"block of {len(block)} bytes does not hash to {cid}")


def file_cid(data: bytes | BinaryIO) -> str:
    """Root CID of `ipfs add --cid-version 1 --raw-leaves` of `data` (bytes or a binary stream)."""
    from krill.store.unixfs import build_file_dag

    cids = [cid for cid, _block in build_file_dag(data)]
    return cids[-1]
