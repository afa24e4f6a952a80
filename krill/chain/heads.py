"""Waking on new blocks: a `newHeads` subscription over the node's WebSocket, a plain sleep without one.

Design decisions:
- Roles that wait for the chain to move (the coordinator between passes, a worker's version watcher
  waiting for the next version) slept a fixed interval and read again. On the demo the coordinator
  noticed the last commit of a version 50 ms late on average (0.1 s polls), a worker the new
  version 25 ms late (50 ms polls), and every read cost CPU whether or not anything had changed.
  `HeadWaiter.wait(timeout)` returns as soon as the node announces a block (`eth_subscribe`
  `newHeads`: a push over one long-lived WebSocket), or after `timeout`.
- The WebSocket URL is the HTTP RPC URL with `ws://` (`wss://`): Anvil serves both on one port, and
  geth does when WebSocket is enabled. Where it cannot be opened, `subscribed()` is False and
  `wait` sleeps the timeout (the old polling); a new connection is tried at most every `RETRY_S`,
  so a node without WebSocket support costs a little latency and nothing else. A dropped
  connection falls back the same way until it reconnects.
- Announcements that piled up are drained at once: one wake-up per wait, however many blocks came.
  The waiter says only that the chain moved; the caller reads what it needs.
- One waiter per waiting thread: a websockets sync connection has one reader.
- A waiter can wait for some logs instead of every block (`logs`: an `eth_subscribe` `logs` filter,
  for example `publications_of`: a run's `VersionPublished`). A worker's version watcher waits
  for publications: on the demo a version came with about ten blocks (commits, seals,
  attestations, settlement), each of which had the watcher read the run from the chain for nothing.
  `connections` counts the subscriptions opened, so a caller can tell that nothing it waits for was
  announced on one connection (a dropped one may have missed some).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time

RETRY_S = 5.0  # how often a waiter without a subscription tries to open one again
CONNECT_TIMEOUT_S = 2.0


def ws_url_of(rpc_url: str | None) -> str | None:
    """The WebSocket URL of an HTTP(S) JSON-RPC URL (None for anything else)."""
    if not rpc_url:
        return None
    for http, ws in (("http://", "ws://"), ("https://", "wss://")):
        if rpc_url.startswith(http):
            return ws + rpc_url[len(http):]
    return None


class HeadWaiter:
    """Waits for the next block the node at `rpc_url` announces, or the next log matching `logs`
    (see the module docstring)."""

    def __init__(self, rpc_url: str | None, logs: dict | None = None):
        self.url = ws_url_of(rpc_url)
        self.logs = logs  # an `eth_subscribe` logs filter (address, topics); None: every new block
        self._ws = None
        self._next_try = 0.0
        self.announced = 0  # wake-ups by an announcement (for tests and figures)
        self.connections = 0  # subscriptions opened so far

    @classmethod
    def for_chain(cls, chain, logs: dict | None = None) -> HeadWaiter:
        """A waiter on the node `chain` (a KrillChain, or anything with `.w3`) talks to over HTTP."""
        return cls(getattr(chain.w3.provider, "endpoint_uri", None), logs)

    def subscribed(self) -> bool:
        """Whether announcements arrive (connecting first when due)."""
        if self._ws is None and self.url is not None and time.monotonic() >= self._next_try:
            self._connect()
        return self._ws is not None

    def wait(self, timeout_s: float, stop: threading.Event | None = None) -> bool:
        """Return True when a new block was announced within `timeout_s`, False after the timeout (or at
        once when `stop` is set); without a subscription, sleep the timeout (stop-aware)."""
        if stop is not None and stop.is_set():
            return False
        if not self.subscribed():
            if stop is not None:
                stop.wait(timeout_s)
            else:
                time.sleep(timeout_s)
            return False
        try:
            self._ws.recv(timeout=max(0.0, timeout_s))
        except TimeoutError:
            return False
        except Exception:  # noqa: BLE001 - connection closed or broken: poll until it reconnects
            self._drop()
            return False
        self._drain()
        self.announced += 1
        return True

    def _drain(self) -> None:
        while self._ws is not None:
            try:
                self._ws.recv(timeout=0)
            except TimeoutError:
                return
            except Exception:  # noqa: BLE001
                self._drop()

    def _connect(self) -> None:
        from websockets.sync.client import connect

        self._next_try = time.monotonic() + RETRY_S
        try:
            # Entered as the context manager it is (closed by `_drop`); never through an HTTP proxy
            # from the environment: the node is the one the HTTP client talks to directly.
            ws = connect(self.url, open_timeout=CONNECT_TIMEOUT_S, close_timeout=1.0, max_size=1 << 20,
                         proxy=None, compression=None).__enter__()
        except Exception:  # noqa: BLE001 - no WebSocket at this node: stay on plain sleeps
            return
        try:
            params = ["newHeads"] if self.logs is None else ["logs", self.logs]
            request = {"jsonrpc": "2.0", "id": 1, "method": "eth_subscribe", "params": params}
            ws.send(json.dumps(request))
            answer = json.loads(ws.recv(timeout=CONNECT_TIMEOUT_S))
            if not isinstance(answer, dict) or not answer.get("result"):
                raise ValueError(f"eth_subscribe answered {answer!r}")
        except Exception:  # noqa: BLE001 - a node that does not subscribe: plain sleeps
            ws.close()
            return
        self._ws = ws
        self.connections += 1

    def _drop(self) -> None:
        ws, self._ws = self._ws, None
        self._next_try = time.monotonic() + RETRY_S
        if ws is not None:
            with contextlib.suppress(Exception):  # closing a broken connection may fail: it is gone either way
                ws.close()

    def close(self) -> None:
        self._drop()


def publications_of(protocol_address: str, run_id: bytes) -> dict:
    """The logs filter of a run's `VersionPublished` events (runId is the first indexed argument)."""
    from krill.chain.events import VersionPublished, topics_of

    return {"address": protocol_address, "topics": [topics_of((VersionPublished,)), "0x" + bytes(run_id).hex()]}
