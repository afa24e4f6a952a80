"""`krill.bench.lag_proxy`: delay, stalls and resets as drawn from its seed, and JSON-RPC counts, against a
real TCP echo server on localhost."""

from __future__ import annotations

import json
import random
import socket
import socketserver
import threading
import time

import pytest

from krill.bench.lag_proxy import LagProxy, LinkProfile


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except OSError:
            pass


@pytest.fixture
def echo_server():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address
    server.shutdown()
    server.server_close()


def _round_trips(url_port: int, messages: int) -> list[float]:
    times = []
    with socket.create_connection(("127.0.0.1", url_port), timeout=10) as sock:
        for i in range(messages):
            payload = f"message {i}".encode()
            started = time.monotonic()
            sock.sendall(payload)
            got = b""
            while len(got) < len(payload):
                got += sock.recv(65536)
            times.append(time.monotonic() - started)
            assert got == payload
    return times


def test_each_chunk_is_delayed_one_way_by_the_seeded_draw(echo_server):
    profile = LinkProfile("100 ms", delay_s=0.1, jitter_s=0.02)
    with LagProxy(echo_server, profile, seed=3) as proxy:
        times = _round_trips(proxy.port, 4)
    up, down = random.Random("3:1:up"), random.Random("3:1:down")  # connection 1's draws, as the proxy makes them
    for rt in times:
        expected = 0.2 + up.uniform(-0.02, 0.02) + down.uniform(-0.02, 0.02)
        assert expected - 0.005 <= rt < expected + 0.5, (rt, expected)
    assert proxy.stats.chunks == 8 and proxy.stats.stalls == proxy.stats.resets == 0


def test_stalls_are_drawn_from_the_seed_and_hold_the_stream(echo_server):
    profile = LinkProfile("stalls", stall_p=0.5, stall_s=0.3)
    counts, patterns = [], []
    for _ in range(2):
        with LagProxy(echo_server, profile, seed=7) as proxy:
            times = _round_trips(proxy.port, 8)
        counts.append(proxy.stats.stalls)
        patterns.append([round(t / 0.3) for t in times])  # 0, 1 or 2 stalls per round trip
    up, down = random.Random("7:1:up"), random.Random("7:1:down")
    expected = []
    for _ in range(8):
        stalled = 0
        for rng in (up, down):
            rng.uniform(0, 0)  # the jitter draw comes first
            stalled += rng.random() < 0.5
        expected.append(stalled)
    assert patterns == [expected, expected] and counts == [sum(expected)] * 2
    assert 0 < sum(expected) < 16


def test_a_reset_aborts_the_connection_with_an_rst(echo_server):
    with LagProxy(echo_server, LinkProfile("resets", reset_p=1.0), seed=1) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
            sock.sendall(b"hello")
            with pytest.raises(ConnectionResetError):
                sock.recv(65536)
                sock.recv(65536)  # an RST can follow a first empty read on some kernels
        assert proxy.stats.resets == 1
        assert _round_trips(proxy.port, 0) == []  # the proxy still accepts new connections


def _post(body: bytes) -> bytes:
    return b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body), body)


def test_json_rpc_requests_are_counted_per_method_and_a_websocket_is_passed_through(echo_server):
    call = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_call", "params": []}).encode()
    batch = json.dumps([{"jsonrpc": "2.0", "id": 2, "method": "eth_blockNumber", "params": []},
                        {"jsonrpc": "2.0", "id": 3, "method": "eth_blockNumber", "params": []}]).encode()
    first, second = _post(call), _post(batch)
    upgrade = (b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
               + b'{"method": "eth_subscribe"}')
    with LagProxy(echo_server, LinkProfile("0 ms"), seed=1) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
            sent = first + second
            for part in (sent[:30], sent[30:len(first) + 10], sent[len(first) + 10:]):  # bodies split over chunks
                sock.sendall(part)
                time.sleep(0.05)
            got = b""
            while len(got) < len(sent):
                got += sock.recv(65536)
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
            sock.sendall(upgrade)
            got = b""
            while len(got) < len(upgrade):
                got += sock.recv(65536)
        started = time.time()
        assert proxy.stats.methods() == {"eth_blockNumber": 2, "eth_call": 1}
        assert proxy.stats.methods(start=started) == {}
    assert proxy.stats.websockets == 1 and proxy.stats.connections == 2 and proxy.stats.unparsed == 0


def test_a_profile_refuses_jitter_beyond_its_delay():
    with pytest.raises(ValueError, match="jitter"):
        LinkProfile("bad", delay_s=0.01, jitter_s=0.02)


def test_a_stream_it_cannot_read_as_json_rpc_is_passed_through_and_said_so(echo_server):
    chunked = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    garbled = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: lots\r\n\r\nhello"
    with LagProxy(echo_server, LinkProfile("0 ms"), seed=1) as proxy:
        for stream in (chunked, garbled):
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
                sock.sendall(stream)
                got = b""
                while len(got) < len(stream):
                    got += sock.recv(65536)
            assert got == stream
    assert proxy.stats.unparsed == 2 and proxy.stats.requests == []


def test_close_resets_open_connections_and_leaves_no_task_behind(echo_server, caplog):
    import asyncio

    with LagProxy(echo_server, LinkProfile("held", stall_p=1.0, stall_s=30.0), seed=1) as proxy:
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        sock.sendall(b"held for 30 s")
        deadline = time.monotonic() + 5
        while proxy.stats.stalls == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    with sock, pytest.raises(ConnectionResetError):  # not a read that waits for data that never comes
        sock.recv(100)
    assert asyncio.all_tasks(proxy._loop) == set()
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text


def test_a_profile_describes_itself_delay_first():
    assert LinkProfile("0 ms").describe() == "0 ms one way"
    assert LinkProfile("x", delay_s=0.1, jitter_s=0.02, stall_p=0.01, stall_s=8.0, reset_p=0.003).describe() == \
        "100 ± 20 ms one way, 8-s stalls (p 0.01 per chunk), resets (p 0.003 per chunk)"
