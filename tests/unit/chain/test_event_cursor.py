"""The event stream's cursor against a scripted node: it never passes an event its consumer did not get,
however a catch-up of several chunks breaks off."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import requests
from web3.exceptions import Web3RPCError

import krill.chain.events as events_module
from krill.chain.events import Committed, EventStream
from krill.chain.rpc import RetryPolicy
from krill.errors import ChainUnavailableError

ONCE = RetryPolicy(attempts=1)
PROTOCOL = "0x" + "00" * 20


def _commit(block: int, commit_id: int) -> Committed:
    return Committed(block_number=block, transaction_hash="0x" + "11" * 32, log_index=0, address=PROTOCOL,
                     commit_id=commit_id, run_id=b"\x01" * 32, worker="0x" + "ab" * 20, version=0, nonce=commit_id,
                     header_digest=bytes([commit_id % 256]) * 32)


class ScriptedNode:
    """`eth_getLogs` answers from the commits placed in its blocks; `fail` maps a chunk's first block to the
    exception its read raises."""

    def __init__(self, head: int, commits: list[Committed]):
        self.block_number = head
        self.commits = commits
        self.fail: dict[int, Exception] = {}
        self.queries: list[tuple[int, int]] = []

    def get_logs(self, query):
        self.queries.append((query["fromBlock"], query["toBlock"]))
        if query["fromBlock"] in self.fail:
            raise self.fail[query["fromBlock"]]
        return [{"blockNumber": c.block_number, "logIndex": c.log_index, "event": c} for c in self.commits
                if query["fromBlock"] <= c.block_number <= query["toBlock"]]


@pytest.fixture
def node(monkeypatch):
    monkeypatch.setattr(events_module, "decode_log", lambda w3, log: log["event"])
    return ScriptedNode(4500, [_commit(5, 1), _commit(2500, 2), _commit(4400, 3)])


def _stream(node: ScriptedNode) -> EventStream:
    w3 = SimpleNamespace(eth=node, provider=SimpleNamespace(endpoint_uri="scripted"))
    return EventStream(w3, [PROTOCOL], from_block=0, chunk_blocks=2000, retry=ONCE)


def test_a_poll_broken_off_by_an_unreachable_node_returns_what_it_read_and_stops_the_cursor_there(node):
    stream = _stream(node)
    node.fail[2000] = ConnectionError("node dropped")  # the second of three chunks
    first = stream.poll((Committed,))
    assert [e.commit_id for e in first] == [1] and stream.next_block == 2000
    node.fail.clear()
    second = stream.poll((Committed,))
    assert [e.commit_id for e in second] == [2, 3] and stream.next_block == 4501  # nothing lost


def test_a_poll_that_cannot_read_its_first_chunk_raises_with_the_cursor_unmoved(node):
    stream = _stream(node)
    node.fail[0] = ConnectionError("node down")
    with pytest.raises(ChainUnavailableError):
        stream.poll((Committed,))
    assert stream.next_block == 0
    node.fail.clear()
    assert [e.commit_id for e in stream.poll((Committed,))] == [1, 2, 3]


def test_any_other_error_leaves_the_cursor_where_the_poll_began(node):
    stream = _stream(node)
    node.fail[4000] = ValueError("the node refused the query")  # an answer, not unreachability
    with pytest.raises(ValueError):
        stream.poll()
    assert stream.next_block == 0
    node.fail.clear()
    assert [e.commit_id for e in stream.poll()] == [1, 2, 3] and stream.next_block == 4501


def test_iter_passes_a_chunk_once_all_of_it_was_yielded(node):
    stream = _stream(node)
    node.fail[2000] = ConnectionError("node dropped")
    seen = []
    with pytest.raises(ChainUnavailableError):
        for event in stream.iter((Committed,)):
            seen.append(event.commit_id)
    assert seen == [1] and stream.next_block == 2000  # the consumer got chunk 1 as it was read
    node.fail.clear()
    it = stream.iter((Committed,))
    assert next(it).commit_id == 2 and stream.next_block == 2000  # chunk 2 is not yet all yielded
    assert [e.commit_id for e in it] == [3] and stream.next_block == 4501


class CappedNode(ScriptedNode):
    """A public endpoint's caps: at most `max_blocks` blocks or `max_logs` logs per `eth_getLogs`, refused
    with an error answer otherwise (what web3 raises as `Web3RPCError`)."""

    def __init__(self, head: int, commits: list[Committed], max_blocks: int = 10**9, max_logs: int = 10**9):
        super().__init__(head, commits)
        self.max_blocks, self.max_logs = max_blocks, max_logs
        self.refused = 0

    def get_logs(self, query):
        if query["toBlock"] - query["fromBlock"] + 1 > self.max_blocks:
            self.refused += 1
            raise Web3RPCError(f"{{'code': -32600, 'message': 'exceed maximum block range: {self.max_blocks}'}}")
        logs = super().get_logs(query)
        if len(logs) > self.max_logs:
            self.refused += 1
            raise Web3RPCError(f"{{'code': -32005, 'message': 'query returned more than {self.max_logs} results'}}")
        return logs


def test_a_node_that_caps_the_block_range_is_asked_for_smaller_ranges_and_nothing_is_missed(monkeypatch):
    monkeypatch.setattr(events_module, "decode_log", lambda w3, log: log["event"])
    node = CappedNode(4500, [_commit(5, 1), _commit(2500, 2), _commit(4400, 3)], max_blocks=500)
    stream = _stream(node)
    assert [e.commit_id for e in stream.poll((Committed,))] == [1, 2, 3] and stream.next_block == 4501
    assert node.refused <= 3  # 2000 -> 1000 -> 500: found in a few tries
    node.block_number, node.commits, node.refused = 6000, [*node.commits, _commit(5900, 4)], 0
    assert [e.commit_id for e in stream.poll((Committed,))] == [4] and stream.next_block == 6001
    assert node.refused == 0  # the smaller chunk is kept


def test_a_node_that_caps_the_logs_per_answer_is_asked_for_smaller_ranges(monkeypatch):
    monkeypatch.setattr(events_module, "decode_log", lambda w3, log: log["event"])
    busy = [_commit(block, block) for block in range(100, 1100)]  # a log in each of 1000 blocks
    node = CappedNode(1500, busy, max_logs=300)
    assert [e.commit_id for e in _stream(node).iter((Committed,))] == list(range(100, 1100))


def test_a_refusal_of_a_single_block_is_raised_with_the_cursor_unmoved(monkeypatch):
    monkeypatch.setattr(events_module, "decode_log", lambda w3, log: log["event"])
    node = CappedNode(4500, [_commit(5, 1)], max_blocks=0)  # refuses every range
    stream = _stream(node)
    with pytest.raises(Web3RPCError):
        stream.poll((Committed,))
    assert stream.next_block == 0 and node.refused <= 12


def test_a_node_that_refuses_a_long_range_with_an_http_4xx_is_asked_for_smaller_ranges(monkeypatch):
    """Some gateways answer a range past their cap with an HTTP 400 rather than a JSON-RPC error."""
    monkeypatch.setattr(events_module, "decode_log", lambda w3, log: log["event"])
    node = ScriptedNode(4500, [_commit(5, 1), _commit(2500, 2), _commit(4400, 3)])
    real = node.get_logs

    def capped(query):
        if query["toBlock"] - query["fromBlock"] + 1 > 1000:
            response = requests.Response()
            response.status_code = 400
            raise requests.HTTPError("400 Client Error: block range too large", response=response)
        return real(query)

    node.get_logs = capped
    stream = _stream(node)
    assert [e.commit_id for e in stream.poll((Committed,))] == [1, 2, 3] and stream.next_block == 4501
