"""A TCP proxy that makes a local link look like a consumer's internet link: delay, jitter, stalls, resets.

`krill bench latency` puts one between the workers (and one between the verifiers) and the chain node,
so the roles run as they would 100-300 ms away from their node.

Design decisions:
- Delay is one-way and per chunk: every chunk read from one side is released to the other at
  `read time + delay ± jitter` (uniform), and never before the chunk ahead of it in the same
  direction, so the byte stream keeps its order (a queue per direction with release times). It
  models latency, not bandwidth: a large body costs one delay, not one per chunk. A request and
  its answer cost a round trip (two delays), as across the internet.
- A stall holds one chunk (and so everything behind it in that direction) an extra `stall_s`: a
  connection that stops moving for seconds, then recovers. A reset aborts both sides at once with
  a TCP RST (SO_LINGER 0), as a NAT or a flaky access point does to a kept-alive connection; the
  client sees ECONNRESET on its next read or write. Each is drawn per chunk, in either direction.
- Seeded randomness: each connection and direction draws from its own `random.Random` seeded with
  (seed, connection number, direction), so what happens to a connection does not depend on how the
  other connections' chunks interleave. Connections are numbered as they arrive: a single client
  sees exactly the same delays, stalls and resets run after run; a benchmark's many processes see
  the same faults in distribution, and the same ones as long as they connect in the same order.
- Requests are counted per JSON-RPC method (a batch counts each of its calls), with the time they
  arrived: the client-to-node stream of each connection is parsed as HTTP/1.1 (headers, then a
  `Content-Length` body, kept-alive requests one after another), so a body split over several
  chunks counts once. A connection that upgrades to a WebSocket (`eth_subscribe` over Anvil's
  one port) passes through from then on with the same delay and faults, counted as `websocket`
  connections: its frames are masked and not read.
- The proxy runs an asyncio loop in a daemon thread of the benchmark process, so it needs no
  process of its own to start or stop; `close()` (or leaving the `with`) stops it.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LinkProfile:
    """What a link does to the bytes crossing it (see the module docstring)."""

    name: str
    delay_s: float = 0.0  # one way
    jitter_s: float = 0.0  # uniform, plus or minus, on each chunk's delay
    stall_p: float = 0.0  # per chunk: the chance it is held an extra stall_s
    stall_s: float = 0.0
    reset_p: float = 0.0  # per chunk: the chance the connection is reset there

    def __post_init__(self) -> None:
        if not 0 <= self.jitter_s <= self.delay_s:
            raise ValueError(f"link {self.name}: jitter {self.jitter_s} s must be between 0 and the delay")
        for name in ("stall_p", "reset_p"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"link {self.name}: {name} must be a probability")
        if self.delay_s < 0 or self.stall_s < 0:
            raise ValueError(f"link {self.name}: delays cannot be negative")

    def describe(self) -> str:
        text = f"{self.delay_s * 1000:.0f}" + (f" ± {self.jitter_s * 1000:.0f}" if self.jitter_s else "") + " ms one way"
        if self.stall_p:
            text += f", {self.stall_s:g}-s stalls (p {self.stall_p:g} per chunk)"
        if self.reset_p:
            text += f", resets (p {self.reset_p:g} per chunk)"
        return text


@dataclass
class LinkStats:
    """What crossed a proxy: connections, faults drawn, and each JSON-RPC request as (time, method)."""

    connections: int = 0
    websockets: int = 0
    chunks: int = 0
    stalls: int = 0
    resets: int = 0
    unparsed: int = 0  # client streams that were neither HTTP with a Content-Length body nor a WebSocket
    requests: list[tuple[float, str]] = field(default_factory=list)  # (time.time(), method)

    def methods(self, start: float | None = None, end: float | None = None) -> dict[str, int]:
        """Requests per method, those that arrived in [start, end] (either bound None: open)."""
        out: dict[str, int] = {}
        for t, method in self.requests:
            if (start is None or t >= start) and (end is None or t <= end):
                out[method] = out.get(method, 0) + 1
        return dict(sorted(out.items()))

    def as_dict(self) -> dict:
        return {"connections": self.connections, "websockets": self.websockets, "chunks": self.chunks,
                "stalls": self.stalls, "resets": self.resets, "unparsed": self.unparsed,
                "requests": len(self.requests), "methods": self.methods()}


class _HttpRequests:
    """Counts the JSON-RPC methods of the HTTP/1.1 requests in one client-to-server stream."""

    def __init__(self, stats: LinkStats):
        self.stats, self.buffer, self.mode = stats, b"", "http"  # http | websocket | unparsed

    def feed(self, data: bytes) -> None:
        if self.mode != "http":
            return
        self.buffer += data
        while self.mode == "http":
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1").lower()
            headers = dict(line.split(":", 1) for line in head.split("\r\n")[1:] if ":" in line)
            headers = {k.strip(): v.strip() for k, v in headers.items()}
            if headers.get("upgrade") == "websocket":
                self.mode, self.buffer = "websocket", b""
                self.stats.websockets += 1
                return
            if not headers.get("content-length", "").isdigit():
                if head.startswith(("get ", "head ")):
                    self.buffer = self.buffer[end + 4:]
                    continue
                self.mode, self.buffer = "unparsed", b""
                self.stats.unparsed += 1
                return
            size = int(headers["content-length"])
            if len(self.buffer) < end + 4 + size:
                return
            body, self.buffer = self.buffer[end + 4:end + 4 + size], self.buffer[end + 4 + size:]
            self._count(body)

    def _count(self, body: bytes) -> None:
        try:
            payload = json.loads(body)
        except ValueError:
            return
        now = time.time()
        for call in payload if isinstance(payload, list) else [payload]:
            if isinstance(call, dict) and isinstance(call.get("method"), str):
                self.stats.requests.append((now, call["method"]))


class LagProxy:
    """Listens on 127.0.0.1 (a free port) and forwards to `target` through `profile` (see the module docstring)."""

    def __init__(self, target: tuple[str, int], profile: LinkProfile, seed: int = 0):
        self.target, self.profile, self.seed = target, profile, seed
        self.stats = LinkStats()
        self.port = 0
        self._writers: set = set()  # both ends of every open connection, aborted at close
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="krill-lag-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10) or self._error is not None:
            raise RuntimeError(f"the lag proxy did not start: {self._error}")

    @property
    def url(self) -> str:
        """The HTTP URL to give a role in place of the node's (its WebSocket URL follows from it)."""
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LagProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        except OSError as exc:
            self._error = exc
            self._ready.set()
            return
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    def _rng(self, connection: int, direction: str) -> random.Random:
        return random.Random(f"{self.seed}:{connection}:{direction}")

    async def _handle(self, client_reader, client_writer) -> None:
        self.stats.connections += 1
        number = self.stats.connections
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _abort(client_writer)
            return
        link = {"reset": False, "writers": (client_writer, server_writer)}
        self._writers.update(link["writers"])
        try:
            await asyncio.gather(
                self._pipe(client_reader, server_writer, link, self._rng(number, "up"), _HttpRequests(self.stats)),
                self._pipe(server_reader, client_writer, link, self._rng(number, "down"), None),
                return_exceptions=True)
        except asyncio.CancelledError:
            pass  # close(): end normally, or Python 3.11's stream callback logs the cancelled task as an error
        finally:
            for writer in link["writers"]:
                writer.close()
                self._writers.discard(writer)

    async def _pipe(self, reader, writer, link: dict, rng: random.Random, requests: _HttpRequests | None) -> None:
        p = self.profile
        queue: asyncio.Queue = asyncio.Queue()

        async def release() -> None:
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if link["reset"]:
                    return
                if data is None:  # the sender closed its side: close ours after the same delay
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(release())
        last_due = 0.0
        try:
            while not link["reset"]:
                data = await reader.read(65536)
                due = time.monotonic() + max(0.0, p.delay_s + rng.uniform(-p.jitter_s, p.jitter_s))
                if not data:
                    queue.put_nowait((max(last_due, due), None))
                    break
                self.stats.chunks += 1
                if requests is not None:
                    requests.feed(data)
                if p.reset_p and rng.random() < p.reset_p:
                    self.stats.resets += 1
                    link["reset"] = True
                    for w in link["writers"]:
                        _abort(w)
                    break
                if p.stall_p and rng.random() < p.stall_p:
                    self.stats.stalls += 1
                    due += p.stall_s
                last_due = max(last_due, due)
                queue.put_nowait((last_due, data))
            await sender
        except (OSError, asyncio.IncompleteReadError):
            link["reset"] = True
            for w in link["writers"]:
                _abort(w)
        finally:
            sender.cancel()

    def close(self) -> None:
        """Stop listening and drop every connection."""
        if not self._loop.is_running():
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._thread.join(10)

    async def _shutdown(self) -> None:
        # Stop accepting, reset every open connection, then wait for every task to end (a connection accepted
        # while the first ones ended is cancelled in the next round), so none is left pending on a closed loop.
        self._server.close()
        for writer in list(self._writers):
            _abort(writer)
        me = asyncio.current_task()
        while tasks := [t for t in asyncio.all_tasks() if t is not me and not t.done()]:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        asyncio.get_running_loop().call_soon(self._loop.stop)


def _abort(writer) -> None:
    """Close with a TCP RST, not a FIN (SO_LINGER on, 0 s)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()
