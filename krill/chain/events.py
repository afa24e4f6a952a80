"""Typed contract events and their iteration from a block with a confirmation depth.

Design decisions:
- One frozen dataclass per event of KrillProtocol and KrillToken (the explorer and the roles
  rebuild their view of a run from these). Every event carries where it was found
  (`block_number`, `transaction_hash`, `log_index`, `address`); the other fields are the
  Solidity arguments in snake_case (`from` becomes `sender`, `to` `recipient`). A test checks
  that every ABI event has its class with the same fields.
- Logs are decoded by their first topic against the committed ABIs; logs of other contracts or
  unknown events are skipped, not guessed.
- `EventStream` remembers the next block to read and only reads up to head - confirmations, so
  a consumer never acts on a block that a shallow reorg could still remove; reads go in chunks
  so a long history does not ask the node for one huge range.
- The cursor never passes an event its consumer did not get. `poll` returns a list, so it moves
  the cursor only with what it returns: when a later chunk's read fails (the node still gone after
  its retries) it returns the events of the chunks read whole, with the cursor just past the last
  of them, and raises only when not even the first chunk could be read; any other error leaves the
  cursor unmoved. (Moving it chunk by chunk while the list was built lost the events of a
  multi-chunk catch-up whose later chunk failed: dropped with the exception, and the cursor,
  already past them, saved by the verifier.) `iter` yields as it reads, so it passes a chunk once
  all of it was yielded.
- A node that refuses a range (many public endpoints cap `eth_getLogs` at a few hundred or thousand
  blocks, or at some 10,000 logs per answer, and say so in an error answer or an HTTP 4xx) has the
  range halved and asked again, down to a single block, whose refusal is raised; the stream keeps the
  smaller chunk for later reads. (With a fixed chunk such a node refused every catch-up longer than its cap, on every
  poll, so the stream never moved and the verifier reading it stopped.) At most log2(chunk) extra
  requests are spent finding the size; unreachability is not a refusal and is retried as before.
  `read_within_cap` is that halving, shared with the database indexer (`krill.db.indexer`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import requests
from eth_utils import event_abi_to_log_topic
from web3 import Web3
from web3._utils.events import get_event_data
from web3.exceptions import Web3RPCError

from krill.chain.artifacts import load_artifact
from krill.chain.errors import snake_case
from krill.chain.rpc import DEFAULT_RETRY, RetryPolicy, endpoint_of, with_retries
from krill.chain.types import RunParams, from_abi
from krill.errors import ChainUnavailableError

_RENAMES = {"from": "sender", "to": "recipient"}
T = TypeVar("T")
# A node's refusal of an `eth_getLogs` query (an error answer, or a gateway's HTTP 4xx: `with_retries`
# raises only the statuses it does not retry): an answer, not unreachability.
LOG_REFUSALS = (Web3RPCError, requests.HTTPError)


@dataclass(frozen=True)
class ChainEvent:
    """Where an event was emitted; subclasses add the event's arguments."""

    block_number: int
    transaction_hash: str
    log_index: int
    address: str


@dataclass(frozen=True)
class MinimumStakeSet(ChainEvent):
    role: int
    amount: int


@dataclass(frozen=True)
class UnbondingBlocksSet(ChainEvent):
    blocks: int


@dataclass(frozen=True)
class Staked(ChainEvent):
    account: str
    role: int
    amount: int
    staked: int
    ed25519_public_key: bytes


@dataclass(frozen=True)
class UnstakeRequested(ChainEvent):
    account: str
    amount: int
    unbonding: int
    release_block: int


@dataclass(frozen=True)
class ReleaseDelayed(ChainEvent):
    account: str
    commit_id: int
    release_block: int


@dataclass(frozen=True)
class Withdrawn(ChainEvent):
    account: str
    amount: int


@dataclass(frozen=True)
class RunCreated(ChainEvent):
    run_id: bytes
    coordinator: str
    base_manifest_digest: bytes
    params: RunParams


@dataclass(frozen=True)
class RewardsFunded(ChainEvent):
    run_id: bytes
    funder: str
    amount: int
    reward_pool: int


@dataclass(frozen=True)
class Committed(ChainEvent):
    commit_id: int
    run_id: bytes
    worker: str
    version: int
    nonce: int
    header_digest: bytes


@dataclass(frozen=True)
class RandomnessSealed(ChainEvent):
    commit_id: int
    randomness: bytes


@dataclass(frozen=True)
class Attested(ChainEvent):
    commit_id: int
    verifier: str
    ok: bool
    evidence_digest: bytes
    pass_count: int
    fail_count: int


@dataclass(frozen=True)
class Slashed(ChainEvent):
    commit_id: int
    worker: str
    amount: int
    bounty: int
    burned: int


@dataclass(frozen=True)
class WorkerJailed(ChainEvent):
    worker: str
    commit_id: int


@dataclass(frozen=True)
class BountyCredited(ChainEvent):
    verifier: str
    commit_id: int
    amount: int


@dataclass(frozen=True)
class VersionPublished(ChainEvent):
    run_id: bytes
    version: int
    manifest_digest: bytes
    record_digest: bytes


@dataclass(frozen=True)
class RewardCredited(ChainEvent):
    run_id: bytes
    version: int
    account: str
    amount: int


@dataclass(frozen=True)
class VersionSettled(ChainEvent):
    run_id: bytes
    version: int
    accounts: int
    total: int


@dataclass(frozen=True)
class Claimed(ChainEvent):
    account: str
    amount: int


@dataclass(frozen=True)
class RoleGranted(ChainEvent):
    role: bytes
    account: str
    sender: str


@dataclass(frozen=True)
class RoleRevoked(ChainEvent):
    role: bytes
    account: str
    sender: str


@dataclass(frozen=True)
class RoleAdminChanged(ChainEvent):
    role: bytes
    previous_admin_role: bytes
    new_admin_role: bytes


@dataclass(frozen=True)
class Transfer(ChainEvent):
    sender: str
    recipient: str
    value: int


@dataclass(frozen=True)
class Approval(ChainEvent):
    owner: str
    spender: str
    value: int


EVENT_CLASSES: dict[str, type[ChainEvent]] = {
    cls.__name__: cls for cls in ChainEvent.__subclasses__()
}


def field_name(abi_name: str) -> str:
    """The dataclass field of an ABI event argument."""
    return _RENAMES.get(abi_name, snake_case(abi_name))


def _event_table() -> dict[bytes, tuple[dict, type[ChainEvent]]]:
    table: dict[bytes, tuple[dict, type[ChainEvent]]] = {}
    for contract in ("KrillProtocol", "KrillToken"):
        for entry in load_artifact(contract).events():
            cls = EVENT_CLASSES.get(entry["name"])
            if cls is not None:
                table[event_abi_to_log_topic(entry)] = (entry, cls)
    return table


_TABLE = _event_table()


def topics_of(kinds: tuple[type[ChainEvent], ...]) -> list[str]:
    """The first topics (event signature hashes, 0x-hex) of the Krill events of `kinds`."""
    return ["0x" + topic.hex() for topic, (_, cls) in _TABLE.items() if issubclass(cls, kinds)]


def decode_log(w3: Web3, log: Any) -> ChainEvent | None:
    """The typed event of a raw log, or None if it is no Krill event."""
    topics = log["topics"]
    if not topics:
        return None
    found = _TABLE.get(bytes(topics[0]))
    if found is None:
        return None
    entry, cls = found
    data = get_event_data(w3.codec, entry, log)
    values: dict[str, Any] = {}
    hints = {f.name: f.type for f in dataclasses.fields(cls)}
    for name, value in data["args"].items():
        key = field_name(name)
        if key == "params":
            value = from_abi(RunParams, value)
        elif hints[key] in ("bytes", bytes):
            value = bytes(value)
        values[key] = value
    return cls(block_number=data["blockNumber"], transaction_hash="0x" + bytes(data["transactionHash"]).hex(),
               log_index=data["logIndex"], address=data["address"], **values)


def decode_receipt(w3: Web3, receipt: Any) -> tuple[ChainEvent, ...]:
    """The Krill events of a transaction receipt, in log order."""
    return tuple(e for e in (decode_log(w3, log) for log in receipt["logs"]) if e is not None)


def read_within_cap(read: Callable[[int, int], T], start: int, end: int) -> tuple[int, T]:
    """(last block read, `read(start, last)`): blocks start..end, or, where the node refuses the range
    (`LOG_REFUSALS`, a cap on its length or on the logs per answer), the first half of it, halved
    again down to a single block, whose refusal is raised. A caller keeps `last - start + 1` as its
    range for later reads (see the module docstring)."""
    while True:
        try:
            return end, read(start, end)
        except LOG_REFUSALS:
            if end == start:
                raise  # not even one block: the refusal is not about the range
            end = start + (end - start + 1) // 2 - 1


class EventStream:
    """Reads the events of some contracts block range by block range, confirmed blocks only."""

    def __init__(self, w3: Web3, addresses: list[str], from_block: int = 0, confirmations: int = 0,
                 chunk_blocks: int = 2_000, retry: RetryPolicy = DEFAULT_RETRY):
        self._w3 = w3
        self._addresses = list(addresses)
        self.next_block = from_block
        self.confirmations = confirmations
        self._chunk = chunk_blocks
        self._retry = retry

    def safe_head(self) -> int:
        """The newest block with at least `confirmations` blocks on top of it (-1 if none yet)."""
        head = with_retries(lambda: self._w3.eth.block_number, "eth_blockNumber", self._retry,
                            endpoint_of(self._w3))
        return head - self.confirmations

    def poll(self, kinds: tuple[type[ChainEvent], ...] | None = None) -> list[ChainEvent]:
        """Events of newly confirmed blocks since the last poll (oldest first); the cursor moves past
        exactly the blocks whose events are returned (see the module docstring)."""
        events: list[ChainEvent] = []
        reached: int | None = None  # one past the last chunk read whole
        try:
            for end, chunk in self._chunks(kinds):
                events.extend(chunk)
                reached = end + 1
        except ChainUnavailableError:
            if reached is None:
                raise
        # Any other error propagated above with the cursor unmoved: nothing read is lost either way.
        if reached is not None:
            self.next_block = max(self.next_block, reached)
        return events

    def iter(self, kinds: tuple[type[ChainEvent], ...] | None = None) -> Iterator[ChainEvent]:
        """Yield events up to the current safe head; the cursor passes a chunk once all of it was yielded."""
        for end, chunk in self._chunks(kinds):
            yield from chunk
            self.next_block = max(self.next_block, end + 1)

    def _chunks(self, kinds: tuple[type[ChainEvent], ...] | None) -> Iterator[tuple[int, list[ChainEvent]]]:
        """(last block, its events) per chunk from the cursor up to the current safe head; moves no cursor."""
        last = self.safe_head()
        # Asked for some kinds, the node sends only theirs (a verifier wants `Committed` of a stream
        # that is mostly attestations, seals and publications): decoding the rest was most of its poll.
        topics = None if kinds is None else [topics_of(kinds)]
        if topics == [[]]:  # no Krill event is of these kinds (an empty list would match every log)
            yield last, []
            return

        def read(first: int, end: int) -> list:
            query = {"fromBlock": first, "toBlock": end, "address": self._addresses}
            if topics is not None:
                query["topics"] = topics
            return with_retries(lambda: self._w3.eth.get_logs(query), "eth_getLogs", self._retry,
                                endpoint_of(self._w3))

        start = self.next_block
        while start <= last:
            asked = min(last, start + self._chunk - 1)
            end, logs = read_within_cap(read, start, asked)
            if end < asked:  # a node's range or answer-size cap: ask for less from now on
                self._chunk = end - start + 1
            ordered = sorted(logs, key=lambda lg: (lg["blockNumber"], lg["logIndex"]))
            events = [decode_log(self._w3, log) for log in ordered]
            yield end, [e for e in events if e is not None and (kinds is None or isinstance(e, kinds))]
            start = end + 1
