"""Connections to a chain, retries on transient RPC faults, and devnet-only node controls.

Design decisions:
- Two backends, one interface: `connect_http(url)` for any JSON-RPC node (Anvil, a real
  network) and `connect_in_process()` for py-evm through web3's EthereumTesterProvider. Both
  return a plain `Web3`; everything above works on either.
- Retries are ours, not web3's (its HTTP retry is switched off), so every RPC call has one policy:
  exponential back-off on connection errors, timeouts and HTTP 429/5xx, then
  `ChainUnavailableError` naming the endpoint. Reverts and other answers are never retried.
- Accounts are local keys (eth_account `LocalAccount`): transactions are signed here, so any RPC
  works. Devnet accounts derive from Anvil's public mnemonic; the in-process chain funds the
  same accounts, so tests address both backends alike.
- `mine`, `snapshot` and `revert` are for devnets and tests only (Anvil and eth-tester methods);
  a revert the node did not make (Anvil answers `false` for a snapshot it no longer holds) raises.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TypeVar

import requests
from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.exceptions import ProviderConnectionError
from web3.types import RPCEndpoint

from krill.chain.anvil import DEV_MNEMONIC
from krill.errors import ChainUnavailableError, DevnetError

T = TypeVar("T")

DEV_BALANCE_WEI = 10_000 * 10**18
_TRANSIENT_STATUS = {429, 500, 502, 503, 504}


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry a transient RPC failure."""

    attempts: int = 5
    initial_delay_s: float = 0.1
    max_delay_s: float = 3.0

    def delays(self):
        delay = self.initial_delay_s
        for _ in range(self.attempts - 1):
            yield delay
            delay = min(delay * 2, self.max_delay_s)


DEFAULT_RETRY = RetryPolicy()


def is_transient(exc: BaseException) -> bool:
    """Whether `exc` is a connectivity fault worth retrying (not an answer from the node)."""
    if isinstance(exc, requests.HTTPError):
        return exc.response is not None and exc.response.status_code in _TRANSIENT_STATUS
    return isinstance(exc, requests.ConnectionError | requests.Timeout | ProviderConnectionError
                      | ConnectionError | TimeoutError)


def with_retries(fn: Callable[[], T], what: str, policy: RetryPolicy = DEFAULT_RETRY, endpoint: str = "") -> T:
    """Call `fn`, retrying transient faults with back-off; ChainUnavailableError after the last."""
    delays = policy.delays()
    while True:
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc):
                raise
            delay = next(delays, None)
            if delay is None:
                where = f" at {endpoint}" if endpoint else ""
                raise ChainUnavailableError(
                    f"{what}: the chain RPC{where} did not answer after {policy.attempts} attempts ({exc}); "
                    "check that the node is running and the URL is right") from exc
            time.sleep(delay)


def endpoint_of(w3: Web3) -> str:
    """A printable name of the provider's endpoint."""
    return getattr(w3.provider, "endpoint_uri", None) or type(w3.provider).__name__


def connect_http(url: str, timeout_s: float = 10.0) -> Web3:
    """A Web3 over HTTP JSON-RPC with our retry policy (web3's own retry disabled).

    `eth_chainId` is cached per thread: web3's validation middleware asks for it before and
    after every `eth_call` and `eth_estimateGas`, three round trips where one does (5% of a
    coordinator's CPU in a demo profile). A node does not change its chain id under a URL; the
    roles check it once at connect (`chain.chain_id`)."""
    provider = Web3.HTTPProvider(url, request_kwargs={"timeout": timeout_s}, exception_retry_configuration=None,
                                 cache_allowed_requests=True, cacheable_requests={RPCEndpoint("eth_chainId")},
                                 request_cache_validation_threshold=None)
    return Web3(provider)


def connect_in_process(accounts: int = 20, balance_wei: int = DEV_BALANCE_WEI) -> Web3:
    """A fresh in-process py-evm chain whose first `accounts` dev accounts hold `balance_wei`."""
    from eth_tester import EthereumTester, PyEVMBackend
    from web3 import EthereumTesterProvider

    backend = PyEVMBackend.from_mnemonic(DEV_MNEMONIC, hd_path="m/44'/60'/0'/0", num_accounts=accounts,
                                         genesis_state_overrides={"balance": balance_wei})
    return Web3(EthereumTesterProvider(EthereumTester(backend)))


def is_in_process(w3: Web3) -> bool:
    return type(w3.provider).__name__ == "EthereumTesterProvider"


@cache
def dev_account(index: int, mnemonic: str = DEV_MNEMONIC) -> LocalAccount:
    """Dev account `index` of the mnemonic (path m/44'/60'/0'/0/index, as Anvil funds them); cached,
    since HD derivation costs about 0.2 s."""
    Account.enable_unaudited_hdwallet_features()
    return Account.from_mnemonic(mnemonic, account_path=f"m/44'/60'/0'/0/{index}")


def dev_accounts(count: int, mnemonic: str = DEV_MNEMONIC) -> list[LocalAccount]:
    """The first `count` dev accounts."""
    return [dev_account(i, mnemonic) for i in range(count)]


def _rpc(w3: Web3, method: str, params: list) -> object:
    response = with_retries(lambda: w3.provider.make_request(method, params), method, endpoint=endpoint_of(w3))
    if "error" in response:
        raise ChainUnavailableError(f"{method} failed at {endpoint_of(w3)}: {response['error']}")
    return response["result"]


def mine(w3: Web3, blocks: int = 1) -> int:
    """Mine `blocks` empty blocks (devnets/tests only); returns the new block number."""
    if blocks > 0:
        if is_in_process(w3):
            _rpc(w3, "evm_mine", [blocks])
        else:
            _rpc(w3, "anvil_mine", [hex(blocks)])
    return with_retries(lambda: w3.eth.block_number, "eth_blockNumber", endpoint=endpoint_of(w3))


def snapshot(w3: Web3) -> object:
    """Snapshot the devnet state; pass the id to `revert`."""
    return _rpc(w3, "evm_snapshot", [])


def revert(w3: Web3, snapshot_id: object) -> None:
    """Return the devnet to `snapshot_id` (consumed on Anvil: take a new one to revert again).

    Anvil answers `false` to a snapshot it does not hold (one already reverted to) and reverts
    nothing: a DevnetError, since the caller (a test's isolation) counted on the state being back."""
    if _rpc(w3, "evm_revert", [snapshot_id]) is False:
        raise DevnetError(f"evm_revert: the node at {endpoint_of(w3)} holds no snapshot {snapshot_id!r} and "
                          "reverted nothing (Anvil consumes a snapshot when it reverts to it: take a new one)")
