"""Waking on new blocks (Anvil's newHeads subscription) or on a run's publications (a logs
subscription), and plain sleeps where there is none."""

from __future__ import annotations

import threading
import time

import pytest

from krill.chain.anvil import AnvilProcess, free_port
from krill.chain.heads import HeadWaiter, publications_of, ws_url_of
from krill.chain.rpc import connect_http, mine


@pytest.fixture(scope="module")
def node():
    with AnvilProcess.start() as anvil:
        yield anvil


def test_ws_url_of_http_urls():
    assert ws_url_of("http://127.0.0.1:8545") == "ws://127.0.0.1:8545"
    assert ws_url_of("https://rpc.example/v1") == "wss://rpc.example/v1"
    assert ws_url_of(None) is None and ws_url_of("ipc:///tmp/x") is None


def _wait_queued(waiter: HeadWaiter, count: int, timeout_s: float = 10.0) -> None:
    """Wait until `count` messages are in the waiter's connection, read off the socket and not yet taken
    (the websockets client's reader thread queues them; a sleep instead is too short on a loaded machine)."""
    frames = waiter._ws.recv_messages.frames
    deadline = time.monotonic() + timeout_s
    while frames.qsize() < count:
        assert time.monotonic() < deadline, f"{frames.qsize()} of {count} announcements arrived in {timeout_s} s"
        time.sleep(0.01)


def test_a_block_wakes_the_waiter_at_once_and_piled_up_announcements_wake_it_once(node):
    w3 = connect_http(node.rpc_url)
    waiter = HeadWaiter(node.rpc_url)
    try:
        assert waiter.subscribed()
        started = time.monotonic()
        assert waiter.wait(0.05) is False and time.monotonic() - started < 1.0  # nothing mined: the timeout
        timer = threading.Timer(0.2, lambda: mine(w3, 1))
        started = time.monotonic()  # before the timer starts: a pause between the two cannot shorten the wait
        timer.start()
        assert waiter.wait(10.0) is True
        assert 0.15 < time.monotonic() - started < 5.0 and waiter.announced == 1
        mine(w3, 3)
        _wait_queued(waiter, 3)  # the three announcements have arrived, however slowly the client reads them
        assert waiter.wait(1.0) is True
        assert waiter.wait(0.1) is False  # drained: one wake-up for the three
    finally:
        waiter.close()


def test_without_a_websocket_the_waiter_sleeps_the_timeout_and_honours_stop():
    waiter = HeadWaiter(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    assert not waiter.subscribed()
    started = time.monotonic()
    assert waiter.wait(0.2) is False and time.monotonic() - started >= 0.19
    stop = threading.Event()
    stop.set()
    started = time.monotonic()
    assert waiter.wait(5.0, stop) is False and time.monotonic() - started < 2.5  # not the 5 s asked for
    assert HeadWaiter(None).wait(0.01) is False  # an in-process chain: no URL


def test_subscribed_to_a_runs_publications_only_a_publication_of_that_run_wakes_the_waiter(staked):
    from chain_constants import RUN_ID, digest

    env = staked
    if env.backend != "anvil":
        pytest.skip("an in-process chain has no WebSocket")
    waiter = HeadWaiter.for_chain(env.admin, publications_of(env.admin.address, RUN_ID))
    other = HeadWaiter.for_chain(env.admin, publications_of(env.admin.address, b"\x01" * 32))
    try:
        assert waiter.subscribed() and other.subscribed() and waiter.connections == 1
        env.at(2).commit(RUN_ID, 0, 0, digest("h"))  # a block with a Committed log: no publication
        assert waiter.wait(0.3) is False
        env.coordinator.publish_version(RUN_ID, 1, digest("m1"), digest("r1"))
        assert waiter.wait(5.0) is True and waiter.announced == 1
        assert other.wait(0.3) is False  # another run's waiter
    finally:
        waiter.close()
        other.close()
