"""A connection reset between a role and the node (a lossy consumer link) is retried on a role's first
contact (`connect_chain`) and on the ether-balance read of `krill worker stake` / `init`, as every other
read is: a real Anvil behind a proxy that resets the next request sent to it."""

from __future__ import annotations

import socket
import threading

import pytest

from krill.chain.anvil import AnvilProcess
from krill.chain.devnet import provision
from krill.chain.rpc import dev_account
from krill.config import KrillConfig
from krill.runtime import connect_chain


class ResetProxy:
    """Forwards TCP to Anvil; while `resets` > 0, the next data a client sends is answered by a reset (RST)."""

    def __init__(self, target_port: int):
        self.target, self.resets = target_port, 0
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        try:
            while data := src.recv(65536):
                if from_client and self.resets > 0:
                    self.resets -= 1
                    src.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")  # close = RST
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            s.close()

    def close(self) -> None:
        self._server.close()


@pytest.fixture(scope="module")
def proxied():
    with AnvilProcess.start() as node:
        deployment = provision(node.rpc_url)
        proxy = ResetProxy(int(node.rpc_url.rsplit(":", 1)[1]))
        try:
            yield proxy, KrillConfig.model_validate({"chain": {"rpc_url": proxy.url,
                                                               "protocol_address": deployment.protocol}})
        finally:
            proxy.close()


def test_a_reset_on_first_contact_is_retried(proxied):
    proxy, config = proxied
    proxy.resets = 1
    chain = connect_chain(config, dev_account(1))
    assert proxy.resets == 0  # the reset happened, and the connection was made all the same
    assert chain.stake_of(dev_account(1).address).staked == 0


def test_a_reset_on_the_ether_balance_read_is_retried(proxied):
    proxy, config = proxied
    chain = connect_chain(config, dev_account(1))
    chain.stake_of(dev_account(1).address)  # a pooled connection is open: the reset hits the next request
    proxy.resets = 1
    assert chain.ether_balance(dev_account(1).address) > 0
    assert proxy.resets == 0
