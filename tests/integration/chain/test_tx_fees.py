"""A transactor reads the fee market at most once a second, and again after a failure or a reset; over HTTP
in the same round trip as the write's estimate."""

from __future__ import annotations

import pytest
from chain_constants import MIN_WORKER, key_of

from krill.chain import errors as E
from krill.chain.types import Role


def _count_fee_reads(w3, monkeypatch) -> list[str]:
    """Every base fee read of a transactor from now on: an `eth.get_block` call, or one in a JSON-RPC batch
    (fees read with the estimate, over HTTP)."""
    seen: list[str] = []
    original = w3.eth.get_block

    def counting(*args, **kwargs):
        seen.append("eth_getBlockByNumber")
        return original(*args, **kwargs)

    monkeypatch.setattr(w3.eth, "get_block", counting)
    if hasattr(w3.provider, "make_batch_request"):
        batch = w3.provider.make_batch_request

        def counting_batch(requests):
            seen.extend(method for method, _ in requests if method == "eth_getBlockByNumber")
            return batch(requests)

        monkeypatch.setattr(w3.provider, "make_batch_request", counting_batch)
    return seen


def test_fees_are_reused_within_a_second_and_read_again_after_a_reset_or_a_failure(env, monkeypatch):
    import krill.chain.tx

    monkeypatch.setattr(krill.chain.tx, "FEE_REUSE_S", 60.0)  # a slow machine must not expire them mid-test
    seen = _count_fee_reads(env.w3, monkeypatch)
    worker = env.at(env.WORKERS[0])
    worker.reset_nonces()  # earlier tests' transactions of this client left fees behind
    worker.stake(Role.WORKER, MIN_WORKER * 2, key_of(env.WORKERS[0]))
    worker.token.approve(env.deployment.protocol, 2**256 - 1)
    reads = seen.count("eth_getBlockByNumber")
    assert reads >= 1
    worker.stake(Role.WORKER, MIN_WORKER, key_of(env.WORKERS[0]))  # a top-up, moments later
    assert seen.count("eth_getBlockByNumber") == reads  # the fees read by the stake are reused
    worker.reset_nonces()
    worker.stake(Role.WORKER, MIN_WORKER, key_of(env.WORKERS[0]))
    assert seen.count("eth_getBlockByNumber") == reads + 1
    with pytest.raises(E.StakeRoleMismatch):  # refused at the estimate: nothing sent, fees kept
        worker.stake(Role.VERIFIER, MIN_WORKER, key_of(env.WORKERS[0]))
    assert seen.count("eth_getBlockByNumber") == reads + 1


def test_fees_due_are_read_in_the_estimates_round_trip(env):
    """Over HTTP a write whose fees are due costs one round trip before its send, not three: the base fee,
    the tip and the estimate go in one JSON-RPC batch (at 300 ms one way, 1.2 s off every commit of a
    worker), with the fees sent the fresh ones; a revert in that batch's estimate is the contract's error."""
    import itertools

    from krill.bench.lag_proxy import LagProxy, LinkProfile
    from krill.chain.client import KrillChain

    if env.backend != "anvil":
        pytest.skip("py-evm mines in process: no round trips to save")

    def round_trips(requests) -> list[tuple[str, ...]]:
        """The methods of each HTTP request the proxy counted (a batch's calls are counted at one instant)."""
        return [tuple(m for _, m in group) for _, group in itertools.groupby(requests, key=lambda r: r[0])]

    node = env.w3.provider.endpoint_uri.removeprefix("http://").split(":")
    with LagProxy((node[0], int(node[1])), LinkProfile("local")) as proxy:
        worker = KrillChain.connect(proxy.url, env.deployment.protocol, env.accounts[env.WORKERS[0]])
        worker.token.approve(env.deployment.protocol, 2**256 - 1)  # chain id and nonce read here, not below
        worker._tx.forget_fees()  # due, as for a worker's commit seconds after its last
        base = int(env.w3.eth.get_block("latest")["baseFeePerGas"])
        tip = int(env.w3.eth.max_priority_fee)
        proxy.stats.requests.clear()
        receipt = worker.stake(Role.WORKER, MIN_WORKER * 2, key_of(env.WORKERS[0]))
        trips = round_trips(proxy.stats.requests)
        assert trips[:2] == [("eth_getBlockByNumber", "eth_maxPriorityFeePerGas", "eth_estimateGas"),
                             ("eth_sendRawTransaction",)]
        sent = env.w3.eth.get_transaction(receipt.transaction_hash)
        assert (sent["maxFeePerGas"], sent["maxPriorityFeePerGas"]) == (2 * base + tip, tip)
        worker._tx.forget_fees()
        proxy.stats.requests.clear()
        with pytest.raises(E.StakeRoleMismatch):
            worker.stake(Role.VERIFIER, MIN_WORKER, key_of(env.WORKERS[0]))
        assert round_trips(proxy.stats.requests) == [("eth_getBlockByNumber", "eth_maxPriorityFeePerGas",
                                                      "eth_estimateGas")]
        proxy.stats.requests.clear()
        worker.stake(Role.WORKER, MIN_WORKER, key_of(env.WORKERS[0]))  # the fees that batch read are reused
        assert round_trips(proxy.stats.requests)[0] == ("eth_estimateGas",)


def test_a_node_that_refuses_batches_gets_the_fee_reads_and_the_estimate_one_after_another(env):
    """A node (or a gateway in front of it) that answers a JSON-RPC batch with HTTP 400 still takes the
    write, with its fees read one request at a time as before."""
    import json
    import threading
    import urllib.request
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from krill.chain.client import KrillChain

    if env.backend != "anvil":
        pytest.skip("py-evm mines in process: no batch is sent")
    node, singles = env.w3.provider.endpoint_uri, []

    class NoBatches(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if isinstance(json.loads(body), list):
                self.send_response(400)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            singles.append(json.loads(body)["method"])
            request = urllib.request.Request(node, data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as response:
                data = response.read()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), NoBatches)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        worker = KrillChain.connect(f"http://127.0.0.1:{server.server_address[1]}", env.deployment.protocol,
                                    env.accounts[env.WORKERS[0]])
        base = int(env.w3.eth.get_block("latest")["baseFeePerGas"])
        tip = int(env.w3.eth.max_priority_fee)
        receipt = worker.stake(Role.WORKER, MIN_WORKER * 2, key_of(env.WORKERS[0]))
        sent = env.w3.eth.get_transaction(receipt.transaction_hash)
        assert (sent["maxFeePerGas"], sent["maxPriorityFeePerGas"]) == (2 * base + tip, tip)
        assert singles[:singles.index("eth_sendRawTransaction")].count("eth_estimateGas") == 1
        assert {"eth_getBlockByNumber", "eth_maxPriorityFeePerGas"} <= set(singles)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
