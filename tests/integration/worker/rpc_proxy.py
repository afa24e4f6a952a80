"""A JSON-RPC proxy in front of Anvil that a test can take down or make refuse writes.

Modes: `up` forwards everything; `writes-down` answers HTTP 503 to the calls a transaction needs
(`eth_estimateGas`, `eth_sendRawTransaction`) and forwards reads; stopping the proxy closes its
port (connection refused), as a dead node would.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WRITE_METHODS = {"eth_estimateGas", "eth_sendRawTransaction"}


class RpcProxy:
    def __init__(self, target_url: str, port: int):
        self.target_url = target_url
        self.port = port
        self.mode = "up"
        self.refused = 0
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, mode: str = "up") -> None:
        self.mode = mode
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    calls = json.loads(body)
                except ValueError:
                    calls = {}
                methods = {c.get("method") for c in (calls if isinstance(calls, list) else [calls])}
                if proxy.mode == "writes-down" and methods & WRITE_METHODS:
                    proxy.refused += 1
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                request = urllib.request.Request(proxy.target_url, data=body,
                                                 headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=30) as response:
                    data = response.read()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
