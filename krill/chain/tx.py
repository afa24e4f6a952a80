"""Sending transactions: local signing, nonce management, receipts and revert decoding.

Design decisions:
- Transactions are signed locally by a `LocalAccount` and sent raw, so any JSON-RPC node works
  (no unlocked node accounts).
- Every write is first estimated against the pending block (on py-evm, whose estimator re-runs
  the call a dozen times, a single call and a fixed limit instead): a revert surfaces there,
  before a nonce is spent, and is raised as the Python class of its Solidity custom error. If a mined transaction still fails
  (state changed in between) it is replayed as a call against its block's parent to recover the
  error, and, when that does not revert, against its block itself: what beat it usually landed in
  the same block, ahead of it (a front-runner's copy seen in the mempool, a `publishVersion` that
  made a commit stale), so only the block's own state holds it. Either replay names a likely cause,
  not a proof (a block's later transactions are in its state too); callers that must be sure look
  the state up. A failure that neither replay explains is a `TransactionFailed`.
- A failed transaction that used all its gas while neither replay reverts ran out of gas: the state
  it ran on grew after the estimate (a slash loops over the commit's failing verifiers, and more
  verdicts landed in the block ahead of it). It had no effect but its fee, so it is estimated again
  against the pending block and sent once more with a new nonce (`TransactionOutOfGas` if that runs
  out too). The estimate's margin covers a state that grows a little; on a real chain a slash sent
  at quorum while three more failing verdicts landed ahead of it failed, stopping the coordinator.
- Nonces are tracked per sender by a `NonceBook` shared by all clients on the same chain
  connection: the first send reads the pending count, later sends increment locally (no
  round-trip, no collisions between clients of one account in this process). Any failure after
  a nonce was taken, and `reset()` (for example after a devnet snapshot revert), makes the next
  send read it from the chain again. The books are held weakly by their Web3 object, so a book
  goes with its connection and a new connection starts empty.
- Fees follow EIP-1559: maxFee = 2 x base fee + priority fee (the node's suggestion), read at
  most once a second per transactor (forgotten after a failed send and a devnet revert). Over
  HTTP, fees due are read in one JSON-RPC batch with the write's estimate: one round trip where
  there were three. A worker 300 ms from its node commits every few seconds, past the fees'
  second, and its commits paid 1.2 s each for the two reads (`krill bench latency`); batching
  keeps the fees as fresh as before, where reusing them longer would price a write on a base
  fee up to a few blocks old. A node that refuses batches gets the three one after another.
- A transaction still pending while the base fee outgrew its maxFee (or after `FeeBumpPolicy.after_s`
  pending: its tip is too low) is replaced under the same nonce with raised fees: at least 12.5% more
  on both maxFee and tip (geth refuses a replacement under +10%, "replacement transaction
  underpriced") and at least the fresh 2 x next base fee + tip, never above the policy's cap (a
  multiple of the first maxFee, or a fixed wei amount), so a fee spike cannot drain the account; once
  the cap leaves no room for a valid replacement it waits until `ReceiptTimeout`. Without it a
  transaction priced before a rise of the base fee sat in the pool for ever (Anvil even drops it), the
  wait ended in `ReceiptTimeout` and every retry of the roles found the same stuck nonce. The wait
  then looks for the receipt of each hash sent (the replaced one may still land on a node that never
  saw its replacement) and decodes whichever is mined. A refused replacement ("nonce too low": one of
  them landed; "underpriced", "insufficient funds"; Anvil's "less than block base fee" for one held
  at the cap) is no error: the wait goes on with the hashes sent, and a later replacement must still
  outbid the refused one, so the cap ends the attempts. Replacing makes the transactor read fees
  afresh for its next write. Before a replacement, the write's call is run at the latest block: when
  the chain now refuses it (a commit whose version went stale while it was pending, an attestation
  whose window closed: a laptop asleep with the write in the pool) and none of its hashes is pending
  or mined any more (the pool dropped it), nothing is sent and the wait ends with that revert, as a
  fresh estimate would (within `LOOKUP_GRACE_S` per hash). Replaced, a worker's commit evicted from
  the pool while it slept landed as a revert after the run moved on (37k gas spent). One still
  pending is replaced all the same: it holds its nonce, and a node that keeps it in the pool under
  the base fee (geth does) would hold every later write of the account behind it; landed as a
  revert, it frees the nonce. The nonce book is untouched (same nonce). The base fee is looked at
  only after `FeeBumpPolicy.check_s` without a receipt, and never in process: py-evm mines on
  arrival.
- Views and gas estimates go straight through the provider as JSON-RPC requests (`raw_call`):
  web3's request middleware cost more CPU than the request; reverts decode the same way.
- Resending after a transient fault is safe: the signed bytes and hence the hash are the same.
  A first send whose reply was lost (a read timeout) may already be in the pool or mined when it
  is resent, and the node refuses the resend in its own words ("already known" on geth,
  "transaction already imported" on Anvil with a pending pool, "nonce too low" once mined,
  py-evm's "invalid transaction nonce"); whatever the words, the transaction is then looked up by
  its hash and counts as sent if the node has it. If it does not, a refusal for the nonce is
  handled as below (another transaction took it) and any other is raised.
- A send refused because its nonce is taken ("nonce too low", "replacement transaction underpriced",
  py-evm's "invalid transaction nonce") by a transaction that is not this one was never accepted, so
  it is signed again with the next nonce read from the chain and sent (at most `NONCE_RETAKES`
  times). Another process or client on the same key (an operator funding rewards with the
  coordinator's key while it runs) takes nonces this book does not see; the write was lost and a raw
  node error stopped the role. The transaction is first looked up by its hash, so a resend of one the
  node already has still counts as sent and is never sent twice under two nonces.
- A resend (after a lost reply) that the node refuses is looked up by hash and receipt for up to
  `LOOKUP_GRACE_S` before it counts as not sent: behind a load-balanced endpoint the back end that
  refused it for "nonce too low" has mined it while the one answering the lookup lags a block behind,
  and a single lookup made the transactor sign the write again under a fresh nonce: sent twice. A
  first send refused for its nonce waits for nothing (no node can have these bytes from us).
- A receipt that does not come within `receipt_timeout_s` raises `ReceiptTimeout`, a `ChainError`
  that is also web3's `TimeExhausted` (as `ChainUnavailableError` is a `ConnectionError`). web3's own
  class is no `KrillError`: the CLIs printed it as a traceback, and a role could not name it among
  Krill's faults (the coordinator's loop stopped on it). Handlers of `TimeExhausted` (the worker's
  back-off, the verifier's passing faults) keep matching it. It is deliberately not a
  `ChainUnavailableError`: the node answered, and the transaction may still land, which callers
  settle their own way (the verifier retries that one commit and looks for its attestation first,
  while an outage aborts its whole pass).
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, TypeVar

from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.exceptions import TimeExhausted, Web3Exception

from krill.chain.errors import revert_from_exception, revert_from_rpc_error
from krill.chain.events import ChainEvent, decode_receipt
from krill.chain.rpc import DEFAULT_RETRY, RetryPolicy, endpoint_of, is_in_process, is_transient, with_retries
from krill.errors import ChainError, ChainUnavailableError, ContractRevert
from krill.phases import phase

E = TypeVar("E", bound=ChainEvent)
IN_PROCESS_GAS_LIMIT = 10_000_000
FEE_REUSE_S = 1.0  # how long a transactor reuses the fees it read (`Transactor._fees`)
NONCE_RETAKES = 3  # how often a send refused for a taken nonce is signed again with a fresh one
LOOKUP_GRACE_S = 5.0  # how long a refused resend is looked up before it counts as not sent (`_landed`)
BUMP_NUMERATOR, BUMP_DENOMINATOR = 9, 8  # a replacement's least fee rise, +12.5% (geth needs +10%)
# A node's words for "this nonce is used by another transaction of the sender" (geth, Anvil, Erigon,
# Besu, Nethermind, py-evm), lower case.
_NONCE_TAKEN = ("nonce too low", "nonce_too_low", "oldnonce", "invalid transaction nonce",
                "replacement transaction underpriced", "nonce has already been used")


class ReceiptTimeout(ChainError, TimeExhausted):
    """A sent transaction is not in the chain after the receipt timeout; it may still be mined
    (`Transactor._wait_receipt`). `transaction_hash` names it."""

    def __init__(self, message: str, transaction_hash: str):
        super().__init__(message)
        self.transaction_hash = transaction_hash


class TransactionFailed(ContractRevert):
    """A mined transaction failed (status 0) and no replay of it reverted (`Transactor._failure`)."""

    def __init__(self, message: str, transaction_hash: str, block_number: int):
        super().__init__(message)
        self.transaction_hash, self.block_number = transaction_hash, block_number


class TransactionOutOfGas(TransactionFailed):
    """A mined transaction used all its gas and failed, and no replay of it reverted: the state it ran on
    grew after its estimate (`Transactor._send` sends such a write once more, estimated again)."""


@dataclass(frozen=True)
class FeeBumpPolicy:
    """When and how far a pending transaction's fees are raised (`Transactor._replace`)."""

    check_s: float = 2.0  # how long without a receipt before (and between) looks at the base fee
    after_s: float = 30.0  # pending this long since its last send, it is replaced even above the base fee
    cap_factor: float = 4.0  # a replacement's maxFee stays under this multiple of the first maxFee...
    cap_wei: int | None = None  # ...or under this fixed maxFee per gas, when set


DEFAULT_BUMP = FeeBumpPolicy()


@dataclass(frozen=True)
class SendPolicy:
    """How one account's writes are sent: one object per role (`chain.*` in its config, `krill.runtime`)."""

    receipt_timeout_s: float = 120.0  # no receipt after this long (replacements included): `ReceiptTimeout`
    gas_margin: float = 1.2  # the gas limit is the estimate times this, plus 10,000
    bump: FeeBumpPolicy = DEFAULT_BUMP


DEFAULT_SEND = SendPolicy()


def _raised(fee: int) -> int:
    """`fee` raised by the least a replacement needs (rounded up)."""
    return -(-fee * BUMP_NUMERATOR // BUMP_DENOMINATOR)


@dataclass(frozen=True)
class Receipt:
    """A mined, successful transaction and the Krill events it emitted."""

    transaction_hash: str
    block_number: int
    gas_used: int
    events: tuple[ChainEvent, ...]
    contract_address: str | None = None

    def events_of(self, kind: type[E]) -> list[E]:
        """The events of one type, in log order."""
        return [e for e in self.events if isinstance(e, kind)]

    def event(self, kind: type[E]) -> E:
        """The single event of type `kind` (ChainError if there is not exactly one)."""
        found = self.events_of(kind)
        if len(found) != 1:
            raise ChainError(f"transaction {self.transaction_hash} emitted {len(found)} {kind.__name__} events, "
                             "expected exactly one")
        return found[0]


class NonceBook:
    """Next nonce per sender address for one chain connection (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: dict[str, int] = {}

    def take(self, w3: Web3, address: str, retry: RetryPolicy) -> int:
        with self._lock:
            if address not in self._next:
                self._next[address] = with_retries(
                    lambda: w3.eth.get_transaction_count(address, "pending"), "eth_getTransactionCount",
                    retry, endpoint_of(w3))
            nonce = self._next[address]
            self._next[address] = nonce + 1
            return nonce

    def forget(self, address: str) -> None:
        with self._lock:
            self._next.pop(address, None)

    def reset(self) -> None:
        with self._lock:
            self._next.clear()


# Keyed by the Web3 object itself, weakly: a book goes with its connection. Keyed by `id(w3)`, a
# new connection allocated where a collected one had been inherited its nonces, so its first
# transaction to a fresh node carried a nonce the node was not at and was never mined.
_BOOKS: weakref.WeakKeyDictionary[Web3, NonceBook] = weakref.WeakKeyDictionary()
_BOOKS_LOCK = threading.Lock()


def call_error(error: Any, what: str, method: str = "eth_call") -> Exception:
    """The exception for a JSON-RPC error answer to `method`: its ContractRevert
    (`errors.revert_from_rpc_error`), else a ChainError naming the node's message."""
    revert = revert_from_rpc_error(error, what)
    if revert is not None:
        return revert
    message = str(error.get("message", error)) if isinstance(error, dict) else str(error)
    return ChainError(f"{what}: the node refused {method}: {message}")


def _nonce_taken(exc: BaseException) -> bool:
    """Whether a refused send says its nonce is used by another transaction of the sender."""
    text = str(exc).lower()
    return any(words in text for words in _NONCE_TAKEN)


def nonce_book(w3: Web3) -> NonceBook:
    """The NonceBook shared by every client of this Web3 instance."""
    with _BOOKS_LOCK:
        return _BOOKS.setdefault(w3, NonceBook())


class Transactor:
    """Sends transactions and calls for one account on one chain connection."""

    def __init__(self, w3: Web3, account: LocalAccount | None, retry: RetryPolicy = DEFAULT_RETRY,
                 policy: SendPolicy = DEFAULT_SEND):
        self.w3 = w3
        self.account = account
        self.retry = retry
        self.policy = policy
        self.receipt_timeout_s = policy.receipt_timeout_s
        self.gas_margin = policy.gas_margin
        self.bump = policy.bump
        self.nonces = nonce_book(w3)
        self._endpoint = endpoint_of(w3)
        self._in_process = is_in_process(w3)
        self._fee_cache: tuple[float, dict[str, int]] | None = None  # (monotonic time read, fees)

    @property
    def address(self) -> str:
        if self.account is None:
            raise ChainError("this client has no account: pass one to send transactions")
        return self.account.address

    def _rpc(self, fn, what: str):
        return with_retries(fn, what, self.retry, self._endpoint)

    def call(self, read, what: str) -> Any:
        """Run `read(sender)`, an `eth_call` of some form (sender: {"from": account} or {}); reverts
        become their ContractRevert subclass."""
        sender = {"from": self.account.address} if self.account is not None else {}
        try:
            return self._rpc(lambda: read(sender), what)
        except ContractRevert:
            raise
        except Exception as exc:
            revert = revert_from_exception(exc, what)
            if revert is None:
                raise
            raise revert from exc

    def call_view(self, to: str, codec, args: tuple, what: str) -> Any:
        """A contract view through `krill.chain.view_codec` (what web3's contract call returns, a
        third of its CPU), sent as a bare JSON-RPC `eth_call` over HTTP (`raw_call`). An answer that
        does not decode (an address without code answers nothing) is a ChainError naming the address."""
        from eth_abi.exceptions import DecodingError

        data = codec.calldata(args)
        if self._in_process:
            raw = self.call(lambda sender: self.w3.eth.call({"to": to, "data": data, **sender}), what)
        else:
            raw = self.raw_call({"to": to, "data": data}, what)
        try:
            return codec.result(raw)
        except DecodingError as exc:  # eth_abi's own error named no contract, address or view
            hint = (" (an empty answer: no contract at this address on this chain, or the chain was restarted)"
                    if not raw else "")
            raise ChainError(f"{what}: the answer of {to} ({len(raw)} bytes) does not decode as "
                             f"({','.join(codec.outputs)}){hint}: {exc}") from exc

    def raw_call(self, params: dict, what: str) -> bytes:
        """`eth_call` of `params` at the latest block straight through the provider: web3's request
        middleware (validation, formatting, ENS) cost more CPU than the request itself, about 0.9 of
        1.6 ms per call, and views are most of every role's chain traffic (a worker's version watcher
        reads one every 50 ms while it waits). Reverts become their ContractRevert subclass, as in `call`."""
        if self.account is not None:
            params = {**params, "from": self.account.address}
        return bytes.fromhex(self._request("eth_call", [params, "latest"], what)[2:])

    def _request(self, method: str, params: list, what: str, label: str | None = None) -> str:
        """The hex result of JSON-RPC `method` sent straight through the provider (retried as `label`,
        default `what`); an error answer raises `call_error`'s exception."""
        response = self._rpc(lambda: self.w3.provider.make_request(method, params), label or what)
        error = response.get("error")
        if error is not None:
            raise call_error(error, what, method)
        result = response.get("result")
        if not isinstance(result, str) or not result.startswith("0x"):
            raise ChainError(f"{what}: the node answered {method} with {result!r}, not hex data")
        return result

    def _fees(self) -> dict[str, int]:
        """EIP-1559 fees, read at most once per `FEE_REUSE_S` (two requests, a third of a transaction's
        CPU): the base fee moves at most 12.5% a block, which the doubled base fee in maxFee covers."""
        if not self._fees_due():
            return dict(self._fee_cache[1])
        block = self._rpc(lambda: self.w3.eth.get_block("latest"), "eth_getBlockByNumber")
        return self._keep_fees(int(block.get("baseFeePerGas") or 0), self._tip())

    def _keep_fees(self, base: int, priority: int) -> dict[str, int]:
        """The fees of a base fee and tip just read (maxFee = 2 x base fee + tip), kept for `_fees`."""
        fees = {"maxFeePerGas": 2 * base + priority, "maxPriorityFeePerGas": priority}
        self._fee_cache = (time.monotonic(), fees)
        return dict(fees)

    def _tip(self) -> int:
        """The node's suggested priority fee; 1 gwei from nodes without `eth_maxPriorityFeePerGas`."""
        try:
            return int(self._rpc(lambda: self.w3.eth.max_priority_fee, "eth_maxPriorityFeePerGas"))
        except ContractRevert:
            raise
        except Exception:  # noqa: BLE001 - nodes without the method get a fixed 1 gwei tip
            return 10**9

    def _next_base_fee(self) -> int:
        """The base fee of the next block (the last of `eth_feeHistory`'s, which names it), else the latest
        block's from nodes without the method."""
        response = self._rpc(lambda: self.w3.provider.make_request("eth_feeHistory", ["0x1", "latest", []]),
                             "eth_feeHistory")
        result = response.get("result")
        fees = result.get("baseFeePerGas") if isinstance(result, dict) else None
        if fees and isinstance(fees[-1], str):
            return int(fees[-1], 16)
        block = self._rpc(lambda: self.w3.eth.get_block("latest"), "eth_getBlockByNumber")
        return int(block.get("baseFeePerGas") or 0)

    def forget_fees(self) -> None:
        """Read the fees again at the next transaction (after a failure, or a devnet snapshot revert)."""
        self._fee_cache = None

    def transact(self, to: str, data: str, what: str) -> Receipt:
        """Estimate, sign, send and wait for a call of contract `to` with calldata `data` (see
        `krill.chain.view_codec`); decode its events."""
        return self._send(lambda params: {**params, "to": to, "data": data, "value": 0}, what)

    def deploy(self, contract_factory: Any, args: tuple, what: str) -> Receipt:
        """Deploy a contract (web3 contract factory with bytecode); `contract_address` is set."""
        return self._send(lambda params: contract_factory.constructor(*args).build_transaction(params), what)

    def _send(self, build, what: str) -> Receipt:
        sender = self.address
        # `gas` is given so web3 does not estimate on its own against "latest": we estimate against
        # "pending", the block the transaction lands in, so block.number-dependent checks agree.
        # Placeholder fees: the estimate does not depend on them, and fees due are read in its round trip.
        tx = dict(build({"from": sender, "chainId": self._chain_id(), "maxFeePerGas": 0,
                         "maxPriorityFeePerGas": 0, "gas": 1}))
        probe = {k: tx[k] for k in ("from", "to", "data", "value") if k in tx}
        tx["gas"] = self._estimate(probe, what)
        tx.update(self._fees())
        tx["nonce"] = self.nonces.take(self.w3, sender, self.retry)
        try:
            return self._sign_send_wait(tx, what)
        except TransactionOutOfGas:
            pass  # no effect but its fee: once more, on the state that outgrew its estimate (module docstring)
        # With fees read afresh: the first send may have been replaced with raised fees as the base fee
        # rose (`_replace`), and the fees it was built with may be under the base fee by now.
        self.forget_fees()
        tx["gas"] = self._estimate(probe, what)
        tx.update(self._fees())
        tx["nonce"] = self.nonces.take(self.w3, sender, self.retry)
        return self._sign_send_wait(tx, what)

    def _fees_due(self) -> bool:
        cached = self._fee_cache
        return cached is None or time.monotonic() - cached[0] >= FEE_REUSE_S

    def _estimate_with_fees(self, params: dict, what: str) -> int | None:
        """The estimate of `params` (hex) with the fees read in the same round trip (one JSON-RPC batch, kept
        for `_fees`); None from a node that refuses batches (an HTTP 400, a non-list answer) or answers
        without a block."""
        batch = [("eth_getBlockByNumber", ["latest", False]), ("eth_maxPriorityFeePerGas", []),
                 ("eth_estimateGas", [params, "pending"])]
        try:
            answers = self._rpc(lambda: self.w3.provider.make_batch_request(batch), f"{what} (fees and estimate)")
        except ChainUnavailableError:
            raise
        except Exception:  # noqa: BLE001 - a node that refuses batches its own way: one request at a time
            return None
        if not isinstance(answers, list) or len(answers) != len(batch) or not isinstance(answers[0], dict) \
                or not isinstance(answers[0].get("result"), dict):
            return None
        block, tip, estimate = answers
        base = int(block["result"].get("baseFeePerGas") or "0x0", 16)
        priority = int(tip["result"], 16) if isinstance(tip.get("result"), str) else self._tip()
        self._keep_fees(base, priority)
        if estimate.get("error") is not None:
            raise call_error(estimate["error"], what, "eth_estimateGas")
        result = estimate.get("result")
        if not isinstance(result, str) or not result.startswith("0x"):
            raise ChainError(f"{what}: the node answered eth_estimateGas with {result!r}, not hex data")
        return int(result, 16)

    @staticmethod
    def _hex_params(probe: dict) -> dict:
        """`probe`'s fields as JSON-RPC wants them (hex quantities and data; a deployment has no `to`)."""
        return {k: hex(v) if isinstance(v, int) else "0x" + bytes(v).hex() if isinstance(v, bytes) else v
                for k, v in probe.items() if not (k == "to" and not v)}

    def _estimate(self, probe: dict, what: str) -> int:
        """The gas limit of `probe` (`_gas_limit`); a revert raises its ContractRevert class."""
        try:
            with phase("chain_estimate"):
                return self._gas_limit(probe, what)
        except ContractRevert:
            raise
        except Exception as exc:
            revert = revert_from_exception(exc, what)
            if revert is None:
                raise
            raise revert from exc

    def _sign_send_wait(self, tx: dict, what: str) -> Receipt:
        sender = tx["from"]
        try:
            with phase("chain_send"):
                tx_hash, tx = self._send_signed(tx, what)
            with phase("chain_confirm"):
                receipt = self._wait_receipt(tx_hash, what, tx)
        except Exception:
            self.nonces.forget(sender)
            self.forget_fees()
            raise
        if receipt["status"] != 1:
            raise self._failure(tx, receipt, what)
        return Receipt(
            transaction_hash="0x" + bytes(receipt["transactionHash"]).hex(),
            block_number=receipt["blockNumber"],
            gas_used=receipt["gasUsed"],
            events=decode_receipt(self.w3, receipt),
            contract_address=receipt.get("contractAddress"),
        )

    def _send_signed(self, tx: dict, what: str) -> tuple[bytes, dict]:
        """Sign and send `tx`: its hash and the fields sent. A refusal for a nonce another transaction took
        signs it again with the next nonce from the chain (see the module docstring)."""
        retakes = 0
        while True:
            raw = self.account.sign_transaction(tx).raw_transaction
            try:
                return self._send_raw(raw, what), tx
            except Exception as exc:
                if retakes == NONCE_RETAKES or not _nonce_taken(exc):
                    raise
                tx_hash = Web3.keccak(raw)
                if self._rpc(lambda h=tx_hash: self._known(h), f"{what} (lookup)"):
                    return tx_hash, tx  # this very transaction holds the nonce: sent
            retakes += 1
            self.nonces.forget(tx["from"])
            tx = {**tx, "nonce": self.nonces.take(self.w3, tx["from"], self.retry)}

    def _wait_receipt(self, tx_hash, what: str, tx: dict | None = None):
        """The receipt of `tx_hash`, looked for at once, then after 2, 4, 8, ... ms and then every 50 ms.
        Given the fields `tx` it was sent with, a transaction the base fee outgrew is replaced with raised
        fees (`_replace`), and the receipt is that of whichever of the hashes sent is mined.

        An automining node has usually mined the transaction by the first look, but not always on a
        loaded machine; a fixed 50 ms poll (web3's `wait_for_transaction_receipt`) then cost a
        contribution 50 ms for nothing. A public chain's blocks take seconds, where the 50 ms cap
        keeps the polling cheap.
        """
        from web3.exceptions import TransactionIndexingInProgress, TransactionNotFound

        started = time.monotonic()
        deadline = started + self.receipt_timeout_s
        # py-evm mines each transaction as it arrives; every write here is EIP-1559 (`_fees`)
        bumping = tx is not None and "maxFeePerGas" in tx and not self._in_process
        next_check, last_sent = started + self.bump.check_s, started
        sent, latest = [tx_hash], tx  # every hash sent under this nonce; the fields last signed (maybe refused)
        delay = 0.002
        while True:
            for h in reversed(sent):  # the newest first: the one most likely mined
                try:
                    receipt = self._rpc(lambda h=h: self.w3.eth.get_transaction_receipt(h), f"{what} (receipt)")
                except (TransactionNotFound, TransactionIndexingInProgress):
                    continue  # not mined yet, or the node is still indexing (as web3's own wait treats both)
                return receipt
            now = time.monotonic()
            if now >= deadline:
                shown = Web3.to_hex(sent[-1])
                others = f" (replacing {', '.join(Web3.to_hex(h) for h in sent[:-1])})" if len(sent) > 1 else ""
                raise ReceiptTimeout(f"{what}: transaction {shown}{others} is not in the chain after "
                                     f"{self.receipt_timeout_s:g} seconds", shown) from None
            if bumping and now >= next_check:
                next_check = now + self.bump.check_s
                replaced = self._replace(latest, tx["maxFeePerGas"], now - last_sent >= self.bump.after_s, what,
                                         sent)
                if replaced is not None:
                    new_hash, latest = replaced  # a refused one too: the next must outbid it, or the cap ends it
                    if new_hash is not None:
                        sent.append(new_hash)
                        last_sent, delay = time.monotonic(), 0.002
            time.sleep(delay)
            delay = min(2 * delay, 0.05 * len(sent))  # each look asks for every hash sent

    def _replace(self, tx: dict, first_fee: int, stale: bool, what: str,
                 sent: list[bytes]) -> tuple[bytes | None, dict] | None:
        """Send `tx` again under its nonce with raised fees if the next block's base fee outgrew its maxFee
        or it is `stale` (see the module docstring): the fields signed and their hash (None if the node
        refused them), or None when no replacement is due or the cap leaves no room for one. Raises the
        revert of its call at the latest block, sending nothing, when the chain now refuses it and none of
        the hashes `sent` under its nonce is pending or mined."""
        base = self._next_base_fee()
        if tx["maxFeePerGas"] >= base and not stale:
            return None
        tip = max(_raised(tx["maxPriorityFeePerGas"]), self._tip())
        cap = self.bump.cap_wei if self.bump.cap_wei is not None else int(first_fee * self.bump.cap_factor)
        fee = min(max(_raised(tx["maxFeePerGas"]), 2 * base + tip), cap)
        if fee < _raised(tx["maxFeePerGas"]) or fee < _raised(tx["maxPriorityFeePerGas"]):
            return None  # the cap leaves no room for a replacement the nodes accept
        refused = self._refused_now(tx, what)
        if refused is not None and not any(self._landed(h) for h in sent):
            raise refused  # nothing of it can land any more; one still pending is replaced (module docstring)
        fields = {**tx, "maxFeePerGas": fee, "maxPriorityFeePerGas": min(tip, fee)}
        self.forget_fees()  # priced under the base fee now: the next write reads them again
        try:
            tx_hash = self._send_raw(self.account.sign_transaction(fields).raw_transaction, f"{what} (fee bump)")
        except Web3Exception:  # refused: one of those sent landed ("nonce too low"), or no funds for the new fee
            return None, fields  # (an unreachable node raises `ChainUnavailableError`, no refusal)
        return tx_hash, fields

    def _refused_now(self, tx: dict, what: str) -> ContractRevert | None:
        """The revert of `tx`'s call at the latest block (where it is not mined yet), or None if it passes.
        Not at the pending block: the transaction itself may sit there (a commit then reverts as its own
        duplicate)."""
        params = {k: hex(v) if isinstance(v, int) else "0x" + bytes(v).hex() if isinstance(v, bytes) else v
                  for k, v in tx.items() if k in ("from", "to", "data", "value") and not (k == "to" and not v)}
        try:
            self._request("eth_call", [params, "latest"], f"{what} (check before a fee bump)")
        except ContractRevert as exc:
            return exc
        return None

    def _gas_limit(self, probe: dict, what: str) -> int:
        if self._in_process:
            # py-evm estimates by a binary search (a dozen executions); one call finds a revert just
            # as well, and an in-process chain has no fee market to protect with a tight limit.
            self._rpc(lambda: self.w3.eth.call(probe, "pending"), f"{what} (call)")
            return IN_PROCESS_GAS_LIMIT
        params = self._hex_params(probe)
        gas = self._estimate_with_fees(params, what) if self._fees_due() else None
        if gas is None:
            # Straight through the provider, as `raw_call`: web3's middleware doubled the request's CPU.
            gas = int(self._request("eth_estimateGas", [params, "pending"], what, f"{what} (estimate)"), 16)
        return int(gas * self.gas_margin) + 10_000

    def send_value(self, to: str, wei: int) -> Receipt:
        """Send plain ether (devnets: fund a fresh account's gas)."""
        sender = self.address
        tx = {"from": sender, "to": to, "value": wei, "gas": 21_000, "chainId": self._chain_id(), **self._fees(),
              "nonce": self.nonces.take(self.w3, sender, self.retry)}
        return self._sign_send_wait(tx, f"send {wei} wei")

    def _chain_id(self) -> int:
        if not hasattr(self, "_cached_chain_id"):
            self._cached_chain_id = self._rpc(lambda: self.w3.eth.chain_id, "eth_chainId")
        return self._cached_chain_id

    def _send_raw(self, raw: bytes, what: str) -> bytes:
        tx_hash = Web3.keccak(raw)
        attempt = 0

        def send() -> bytes:
            nonlocal attempt
            attempt += 1
            try:
                return self.w3.eth.send_raw_transaction(raw)
            except Exception as exc:
                if attempt > 1 and (self._known(tx_hash) if is_transient(exc) else self._landed(tx_hash)):
                    return tx_hash  # the earlier send reached the node (pending or mined); only its reply was lost
                raise

        return self._rpc(send, f"{what} (send)")

    def _landed(self, tx_hash: bytes) -> bool:
        """Whether the node has `tx_hash` (`_known`, or its receipt), looked up over `LOOKUP_GRACE_S`: a
        load-balanced endpoint's lookups may lag the back end that refused a resend (module docstring)."""
        from web3.exceptions import TransactionIndexingInProgress, TransactionNotFound

        def seen() -> bool:
            if self._known(tx_hash):
                return True
            try:
                self.w3.eth.get_transaction_receipt(tx_hash)
            except (TransactionNotFound, TransactionIndexingInProgress):
                return False
            return True

        # Not through `_rpc`: called inside `_send_raw`'s retries, a transient fault resends the same bytes.
        deadline, delay = time.monotonic() + LOOKUP_GRACE_S, 0.05
        while not seen():
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(2 * delay, 0.5)
        return True

    def _known(self, tx_hash: bytes) -> bool:
        """Whether the node has transaction `tx_hash` (mined or pending)."""
        from web3.exceptions import TransactionNotFound

        try:
            self.w3.eth.get_transaction(tx_hash)
        except TransactionNotFound:
            return False
        return True

    def _failure(self, tx: dict, receipt: Any, what: str) -> ChainError:
        """The error of a mined, failed transaction: the revert of its replay against its block's parent,
        else against the block itself (see the module docstring), else a `TransactionFailed`."""
        call = {k: tx[k] for k in ("from", "to", "data", "value") if k in tx}
        call["from"] = self.address
        block = receipt["blockNumber"]
        for at in (block - 1, block):
            try:
                self._rpc(lambda at=at: self.w3.eth.call(call, at), f"{what} (replay)")
            except Exception as exc:  # noqa: BLE001 - the replay exists only to recover the revert
                revert = revert_from_exception(exc, what)
                if revert is not None:
                    return revert
        tx_hash = "0x" + bytes(receipt["transactionHash"]).hex()
        if receipt["gasUsed"] >= tx["gas"]:
            return TransactionOutOfGas(f"{what}: transaction {tx_hash} ran out of gas in block {block} (all of its "
                                       f"{tx['gas']} used; no replay of it reverted): the state it ran on grew "
                                       "after its estimate", tx_hash, block)
        return TransactionFailed(f"{what}: transaction {tx_hash} failed on chain (status 0) in block {block} and "
                                 "no replay of it reverted (before or after its block)", tx_hash, block)
