"""Reading a UnixFS DAG is bounded by the file's size: every layout Kubo writes reads back, and a DAG that
links one child many times (a few KiB that used to cost N**depth block reads) is refused early."""

from __future__ import annotations

import hashlib

import pytest

import krill.store.unixfs as unixfs
from krill.store.cid import cid_parts, cid_v1_bytes, dag_pb_cid, normalize_cid, raw_block_cid
from krill.store.unixfs import (
    UNIXFS_FILE,
    Link,
    MalformedBlockError,
    build_file_dag,
    encode_dag_pb,
    encode_unixfs,
    read_file,
)


@pytest.mark.parametrize("cid_version", [0, 1])
def test_every_layout_kubo_writes_reads_back_within_the_budget(monkeypatch, cid_version):
    """Kubo's balanced layout at up to four levels (fan-out and chunk shrunk so it stays small)."""
    monkeypatch.setattr(unixfs, "MAX_LINKS", 3)
    monkeypatch.setattr(unixfs, "CHUNK_SIZE", 4)
    for n_bytes in [0, 1, 4, 5, *range(8, 4 * 90, 13)]:
        data = bytes(i % 251 for i in range(n_bytes))
        blocks = {normalize_cid(cid): block for cid, block in build_file_dag(data, cid_version)}
        root = list(blocks)[-1]
        visited = []
        assert read_file(lambda cid, b=blocks, v=visited: v.append(cid) or b[cid], root, n_bytes) == data
        assert len(visited) - 1 <= unixfs.blocks_allowed(n_bytes)


def _fan(child: str, n: int, part: int) -> str:
    """A dag-pb file node linking `child` (of `part` bytes) `n` times; returns its CID."""
    codec, digest = cid_parts(child)
    block = encode_dag_pb([Link(cid_v1_bytes(codec, digest), "", part)] * n,
                          encode_unixfs(UNIXFS_FILE, None, n * part, [part] * n))
    cid = dag_pb_cid(block)
    BLOCKS[cid] = block
    return cid


BLOCKS: dict[str, bytes] = {}


def _get(cid: str) -> bytes:
    READS.append(cid)
    return BLOCKS[cid]


READS: list[str] = []


@pytest.fixture(autouse=True)
def _fresh():
    BLOCKS.clear()
    READS.clear()


def test_links_to_parts_of_zero_bytes_are_refused():
    """2000 links to 2000 links to an empty leaf: 4 million reads of nothing, under any size cap."""
    empty = raw_block_cid(b"")
    BLOCKS[empty] = b""
    root = _fan(_fan(empty, 2000, 0), 2000, 0)
    with pytest.raises(MalformedBlockError, match="part of 0 bytes"):
        read_file(_get, root, 0)
    assert len(READS) <= 2


def test_a_dag_of_many_more_blocks_than_its_size_needs_is_refused_early():
    """One 1-byte leaf linked 174 times per level: 5.3 MB from 4 stored blocks, 5.3 million leaf reads
    (about 8 minutes), where the 256 KiB layout needs 21 leaves."""
    leaf = raw_block_cid(b"x")
    BLOCKS[leaf] = b"x"
    root = _fan(_fan(_fan(leaf, 174, 1), 174, 174), 174, 174 * 174)
    size = 174 ** 3
    with pytest.raises(MalformedBlockError, match="more blocks than a file of its size needs"):
        read_file(_get, root, size)
    assert len(READS) <= unixfs.blocks_allowed(size) + 2
    assert hashlib.sha256(BLOCKS[root]).digest() == cid_parts(root)[1]  # genuine blocks, every one
