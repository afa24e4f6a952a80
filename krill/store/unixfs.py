"""UnixFS files as Kubo builds them: fixed 256 KiB chunks, balanced DAG, dag-pb internal nodes.

Design decisions:
- `build_file_dag` reproduces `ipfs add` (balanced layout, `size-262144` chunker, at most 174 links
  per node). CIDv1 uses raw leaves (`--cid-version 1 --raw-leaves`, Krill's format); CIDv0 uses
  dag-pb leaves (plain `ipfs add`), kept so Krill can name what a stock Kubo returns. Kubo fills the
  tree top-down (`fillNodeRec`); grouping bottom-up in runs of 174, where every level above the
  leaves wraps even a lone node, yields the identical tree and lets us stream: blocks come out as
  soon as they are complete, so a 1 GiB file never sits in memory.
- dag-pb and UnixFS are tiny protobufs; we encode them here with the exact field order Go's
  encoder uses (links before data; link name always present, even empty) because the CID depends
  on every byte. The decoder is strict and bounded: it reads untrusted blocks from the network.
- `iter_file` walks a DAG through a block getter, checks every block against its CID, checks the
  UnixFS sizes for consistency and refuses files larger than `max_bytes` before fetching them.
  The walk is bounded by the root's size, not only its depth: a node may link one child many
  times, so a few KiB of hostile blocks (thousands of links to a child that links thousands more)
  used to make a read visit N**depth blocks, hours of CPU with every block genuine. A file of S
  bytes may have at most `blocks_allowed(S)` blocks below its root (twice the 256 KiB layout's
  leaves, plus one per level), and a link to a part of 0 bytes is refused: Krill reads the layout
  Kubo and Krill write, not files of much smaller chunks.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from multiformats import CID, multihash

from krill.errors import IntegrityError, StoreError
from krill.store.cid import (
    _CODEC_OF_PREFIX,
    CHUNK_SIZE,
    DAG_PB,
    MAX_BLOCK_SIZE,
    MAX_LINKS,
    RAW,
    cid_parts,
    cid_v1,
    cid_v1_bytes,
    normalize_cid,
)

UNIXFS_RAW = 0
UNIXFS_FILE = 2
MAX_DEPTH = 16
"""Deepest DAG `iter_file` follows; a 1 TiB file is depth 3."""


class ObjectTooLargeError(StoreError):
    """An object is larger than the size cap of the read that asked for it."""


class BlockMismatchError(IntegrityError):
    """A block's bytes do not hash to the CID it was fetched by; `cid` names it."""

    def __init__(self, message: str, cid: str):
        super().__init__(message)
        self.cid = cid


class MalformedBlockError(IntegrityError):
    """A dag-pb or UnixFS block does not decode, or its sizes contradict each other."""


@dataclass(frozen=True)
class Link:
    cid_bytes: bytes  # binary CID as the link carries it (CIDv1, or a bare multihash for CIDv0)
    name: str
    tsize: int

    @property
    def cid(self) -> str:
        """The canonical CIDv1 string of the linked block."""
        if self.cid_bytes[:2] == b"\x12\x20":
            return cid_v1(DAG_PB, self.cid_bytes[2:])
        return cid_v1(_CODEC_OF_PREFIX[self.cid_bytes[:4]], self.cid_bytes[4:])


@dataclass(frozen=True)
class UnixfsData:
    type: int
    data: bytes
    filesize: int | None
    blocksizes: tuple[int, ...]


# ---------------------------------------------------------------- protobuf encoding


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _bytes_field(tag: int, value: bytes) -> bytes:
    return bytes([tag]) + _varint(len(value)) + value


def encode_unixfs(type_: int, data: bytes | None, filesize: int, blocksizes: list[int]) -> bytes:
    """UnixFS `Data` message: Type, [Data], filesize, blocksizes (unpacked), in field order."""
    out = bytearray(b"\x08" + _varint(type_))
    if data is not None:
        out += _bytes_field(0x12, data)
    out += b"\x18" + _varint(filesize)
    for size in blocksizes:
        out += b"\x20" + _varint(size)
    return bytes(out)


def encode_dag_pb(links: list[Link], data: bytes | None) -> bytes:
    """A dag-pb PBNode: every link (Hash, Name, Tsize) first, then Data, as go-codec-dagpb writes it."""
    out = bytearray()
    for link in links:
        body = _bytes_field(0x0A, link.cid_bytes) + _bytes_field(0x12, link.name.encode()) + b"\x18" + _varint(link.tsize)
        out += _bytes_field(0x12, body)
    if data is not None:
        out += _bytes_field(0x0A, data)
    return bytes(out)


# ---------------------------------------------------------------- protobuf decoding (strict)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise MalformedBlockError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise MalformedBlockError("varint longer than 64 bits")


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of a protobuf message; only varint and length-delimited."""
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 2:
            length, pos = _read_varint(buf, pos)
            if pos + length > len(buf):
                raise MalformedBlockError("length-delimited field runs past the block")
            value, pos = buf[pos:pos + length], pos + length
        else:
            raise MalformedBlockError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value


def decode_dag_pb(block: bytes) -> tuple[list[Link], bytes | None]:
    """Links and data of a dag-pb node; raises `MalformedBlockError` on anything unexpected."""
    links: list[Link] = []
    data: bytes | None = None
    for number, wire, value in _fields(block):
        if number == 2 and wire == 2:
            links.append(_decode_link(value))
        elif number == 1 and wire == 2 and data is None:
            data = bytes(value)
        else:
            raise MalformedBlockError(f"unexpected dag-pb field {number} (wire type {wire})")
    return links, data


def _decode_link(buf: bytes) -> Link:
    cid = name = tsize = None
    for number, wire, value in _fields(buf):
        if number == 1 and wire == 2 and cid is None:
            value = bytes(value)
            if not ((len(value) == 34 and value[:2] == b"\x12\x20")
                    or (len(value) == 36 and value[:4] in _CODEC_OF_PREFIX)):
                raise MalformedBlockError("dag-pb link hash is not a sha2-256 CID (raw or dag-pb)")
            cid = value
        elif number == 2 and wire == 2 and name is None:
            try:
                name = bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                raise MalformedBlockError("dag-pb link name is not UTF-8") from None
        elif number == 3 and wire == 0 and tsize is None:
            tsize = value
        else:
            raise MalformedBlockError(f"unexpected dag-pb link field {number}")
    if cid is None:
        raise MalformedBlockError("dag-pb link without a hash")
    return Link(cid, name or "", tsize or 0)


def decode_unixfs(buf: bytes) -> UnixfsData:
    type_ = None
    data = b""
    filesize = None
    blocksizes: list[int] = []
    for number, wire, value in _fields(buf):
        if number == 1 and wire == 0 and type_ is None:
            type_ = value
        elif number == 2 and wire == 2:
            data = bytes(value)
        elif number == 3 and wire == 0:
            filesize = value
        elif number == 4 and wire == 0:
            blocksizes.append(value)
        elif number == 4 and wire == 2:  # packed encoding, legal protobuf even if Go never writes it
            pos = 0
            while pos < len(value):
                size, pos = _read_varint(value, pos)
                blocksizes.append(size)
        elif number in (5, 6, 7, 8):  # hashType, fanout, mode, mtime: metadata that does not change bytes
            continue
        else:
            raise MalformedBlockError(f"unexpected UnixFS field {number}")
    if type_ is None:
        raise MalformedBlockError("UnixFS node without a type")
    return UnixfsData(type_, data, filesize, tuple(blocksizes))


# ---------------------------------------------------------------- building


def _chunks(data: bytes | BinaryIO) -> Iterator[bytes]:
    if isinstance(data, bytes | bytearray | memoryview):
        view = bytes(data)
        if not view:
            yield b""
        for start in range(0, len(view), CHUNK_SIZE):
            yield view[start:start + CHUNK_SIZE]
        return
    stream: BinaryIO = data
    first = True
    while True:
        buf = io.BytesIO()
        while buf.tell() < CHUNK_SIZE:
            piece = stream.read(CHUNK_SIZE - buf.tell())
            if not piece:
                break
            buf.write(piece)
        chunk = buf.getvalue()
        if not chunk and not first:
            return
        first = False
        yield chunk
        if len(chunk) < CHUNK_SIZE:
            return


def _cid_for(codec: str, block: bytes, version: int) -> tuple[bytes, str]:
    """(binary CID for links, CID string) of a block."""
    digest = hashlib.sha256(block).digest()
    if version == 0:
        return b"\x12\x20" + digest, str(CID("base58btc", 0, DAG_PB, multihash.wrap(digest, "sha2-256")))
    return cid_v1_bytes(codec, digest), cid_v1(codec, digest)


@dataclass(frozen=True)
class _Child:
    cid: tuple[bytes, str]
    tsize: int      # bytes of every block under this child, as dag-pb link Tsize counts them
    filesize: int   # bytes of file content under this child


def _leaf(chunk: bytes, version: int) -> tuple[_Child, bytes]:
    if version == 1:
        return _Child(_cid_for(RAW, chunk, 1), len(chunk), len(chunk)), chunk
    # Go leaves the Data field out when it is empty, not `12 00`: the empty file is the block
    # `0a0408021800`, QmbFMke1KXqnYyBBWxB74N4c5SBnJMVAiMNRcGu6x1AwQH, as `ipfs add` names it.
    block = encode_dag_pb([], encode_unixfs(UNIXFS_FILE, chunk or None, len(chunk), []))
    return _Child(_cid_for(DAG_PB, block, 0), len(block), len(chunk)), block


def _internal(children: list[_Child], version: int) -> tuple[_Child, bytes]:
    filesize = sum(c.filesize for c in children)
    data = encode_unixfs(UNIXFS_FILE, None, filesize, [c.filesize for c in children])
    block = encode_dag_pb([Link(c.cid[0], "", c.tsize) for c in children], data)
    tsize = len(block) + sum(c.tsize for c in children)
    return _Child(_cid_for(DAG_PB, block, version), tsize, filesize), block


def build_file_dag(data: bytes | BinaryIO, cid_version: int = 1) -> Iterator[tuple[str, bytes]]:
    """Yield (CID, block) for every block of the file, children before parents, root last.

    `cid_version=1` is `ipfs add --cid-version 1 --raw-leaves`; `0` is plain `ipfs add`.
    """
    if cid_version not in (0, 1):
        raise StoreError(f"cid_version must be 0 or 1, got {cid_version}")
    levels: list[list[_Child]] = [[]]
    for chunk in _chunks(data):
        child, block = _leaf(chunk, cid_version)
        yield child.cid[1], block
        levels[0].append(child)
        level = 0
        while len(levels[level]) == MAX_LINKS:  # a full node is final whatever follows
            node, block = _internal(levels[level], cid_version)
            yield node.cid[1], block
            levels[level] = []
            if level + 1 == len(levels):
                levels.append([])
            levels[level + 1].append(node)
            level += 1
    for level in range(len(levels)):
        above = any(levels[higher] for higher in range(level + 1, len(levels)))
        pending = levels[level]
        if not pending:
            continue
        if len(pending) == 1 and not above:
            return  # the lone node at the top is the root, already yielded
        node, block = _internal(pending, cid_version)
        yield node.cid[1], block
        if level + 1 == len(levels):
            levels.append([])
        levels[level + 1].append(node)


# ---------------------------------------------------------------- reading


def blocks_allowed(size: int) -> int:
    """Most blocks below the root `iter_file` visits for a file of `size` bytes: twice the leaves of the
    256 KiB layout, plus one per level. Kubo's layout needs the leaves plus one node per 174 of them."""
    return 2 * max(1, -(-size // CHUNK_SIZE)) + MAX_DEPTH


class _Budget:
    """Blocks a walk may still visit below its root (`blocks_allowed` of the root's size)."""

    def __init__(self):
        self.left: int | None = None

    def spend(self, cid: str) -> None:
        if self.left is not None:
            if self.left <= 0:
                raise MalformedBlockError(f"the DAG has more blocks than a file of its size needs (at {cid}): "
                                          "not the 256 KiB layout")
            self.left -= 1


def iter_file(get_block: Callable[[str], bytes], cid: str, max_bytes: int) -> Iterator[bytes]:
    """Yield the content of the file `cid` in order, verifying every block and every size."""
    yield from _walk(get_block, normalize_cid(cid), max_bytes, expected_size=None, depth=0, budget=_Budget())


def read_file(get_block: Callable[[str], bytes], cid: str, max_bytes: int) -> bytes:
    """The whole content of the file `cid` (`iter_file`), ObjectTooLargeError past `max_bytes`."""
    out = bytearray()
    for piece in iter_file(get_block, cid, max_bytes):
        out += piece
        if len(out) > max_bytes:
            raise ObjectTooLargeError(f"object {cid} is larger than the limit of {max_bytes} bytes")
    return bytes(out)


def _fetch(get_block: Callable[[str], bytes], cid: str, limit: int) -> bytes:
    block = get_block(cid)
    if len(block) > limit:
        raise ObjectTooLargeError(f"block {cid} is {len(block)} bytes, over the limit of {limit}")
    if hashlib.sha256(block).digest() != cid_parts(cid)[1]:
        raise BlockMismatchError(f"block of {len(block)} bytes does not hash to {cid}", cid)
    return block


def _walk(get_block, cid: str, max_bytes: int, expected_size: int | None, depth: int,
          budget: _Budget) -> Iterator[bytes]:
    if depth > MAX_DEPTH:
        raise MalformedBlockError(f"DAG under {cid} is deeper than {MAX_DEPTH} levels")
    if depth:
        budget.spend(cid)
    if cid_parts(cid)[0] == RAW:
        block = _fetch(get_block, cid, min(max_bytes, MAX_BLOCK_SIZE * 2))
        if expected_size is not None and len(block) != expected_size:
            raise MalformedBlockError(f"leaf {cid} holds {len(block)} bytes, its parent says {expected_size}")
        yield block
        return
    block = _fetch(get_block, cid, MAX_BLOCK_SIZE * 2)
    links, data = decode_dag_pb(block)
    if data is None:
        raise MalformedBlockError(f"dag-pb node {cid} has no UnixFS data")
    node = decode_unixfs(data)
    if node.type not in (UNIXFS_FILE, UNIXFS_RAW):
        raise MalformedBlockError(f"dag-pb node {cid} is UnixFS type {node.type}, not a file")
    if len(node.blocksizes) != len(links):
        raise MalformedBlockError(f"node {cid} has {len(links)} links but {len(node.blocksizes)} block sizes")
    total = len(node.data) + sum(node.blocksizes)
    if node.filesize is not None and node.filesize != total:
        raise MalformedBlockError(f"node {cid} claims {node.filesize} bytes but its parts add up to {total}")
    if expected_size is not None and total != expected_size:
        raise MalformedBlockError(f"node {cid} holds {total} bytes, its parent says {expected_size}")
    if total > max_bytes:
        raise ObjectTooLargeError(f"object {cid} is {total} bytes, over the limit of {max_bytes}")
    if 0 in node.blocksizes:
        raise MalformedBlockError(f"node {cid} links a part of 0 bytes (Kubo never writes one)")
    if depth == 0:
        budget.left = blocks_allowed(total)
    if node.data:
        yield node.data
    for link, size in zip(links, node.blocksizes, strict=True):
        yield from _walk(get_block, link.cid, max_bytes, size, depth + 1, budget)
