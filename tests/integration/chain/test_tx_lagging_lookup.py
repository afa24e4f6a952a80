"""A write whose send reply is lost, behind an endpoint whose lookups lag the node that mined it, lands once.

A small JSON-RPC proxy in front of Anvil forwards the first `eth_sendRawTransaction` but answers it with
HTTP 503 (the reply is lost; the transactor resends the same bytes), and answers the first lookups of that
transaction (`eth_getTransactionByHash`, `eth_getTransactionReceipt`) with null, as a load-balanced
endpoint whose back ends lag a block does. Anvil automines, so the resend is refused with "nonce too low":
a single lookup of the hash made the transactor sign the write again under a fresh nonce, and it was sent
twice.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from krill.chain.rpc import RetryPolicy, connect_http
from krill.chain.tx import Transactor

LOOKUPS = {"eth_getTransactionByHash", "eth_getTransactionReceipt"}


class LaggingProxy:
    """Forwards to `target`; loses the reply of the first send, hides that transaction from `hide` lookups."""

    def __init__(self, target: str, hide: int):
        self.target, self.hide = target, hide
        self.sends, self.hidden, self.first_hash = 0, 0, None
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                call = json.loads(body)
                request = urllib.request.Request(proxy.target, data=body, headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=30) as response:
                    data = response.read()
                if call.get("method") == "eth_sendRawTransaction":
                    proxy.sends += 1
                    if proxy.sends == 1:  # the node took it; its reply is lost
                        proxy.first_hash = json.loads(data).get("result")
                        self._answer(503, b"")
                        return
                if (call.get("method") in LOOKUPS and call["params"][0] == proxy.first_hash
                        and proxy.hidden < proxy.hide):
                    proxy.hidden += 1
                    data = json.dumps({"jsonrpc": "2.0", "id": call.get("id"), "result": None}).encode()
                self._answer(200, data)

            def _answer(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def test_a_mined_write_the_lookups_see_late_is_sent_once(env):
    if env.backend != "anvil":
        pytest.skip("needs a node behind HTTP")
    proxy = LaggingProxy(env.w3.provider.endpoint_uri, hide=3)
    try:
        w3 = connect_http(proxy.url)
        sender, receiver = env.accounts[env.OUTSIDER], env.addr(env.ADMIN)
        tx = Transactor(w3, sender, retry=RetryPolicy(attempts=3, initial_delay_s=0.01))
        nonce, balance = env.w3.eth.get_transaction_count(sender.address), env.w3.eth.get_balance(receiver)
        receipt = tx.send_value(receiver, 1)
        assert env.w3.eth.get_balance(receiver) == balance + 1, "the write was sent twice"
        assert env.w3.eth.get_transaction_count(sender.address) == nonce + 1
        assert proxy.sends == 2  # the first send and its resend (same bytes), no re-signed copy
        assert proxy.hidden == 3, "the proxy hid too little: the test did not exercise a lagging lookup"
        assert receipt.transaction_hash == proxy.first_hash
    finally:
        proxy.stop()
