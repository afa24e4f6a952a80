"""Event iteration from a block with a confirmation depth, on py-evm and on Anvil."""

from __future__ import annotations

from chain_constants import RUN_ID, digest

from krill.chain.events import Committed, RunCreated, Staked, Transfer, VersionPublished


def test_stream_reads_only_confirmed_blocks_and_resumes(staked):
    env = staked
    start = env.block() + 1
    stream = env.admin.event_stream(from_block=start, confirmations=2)
    commit = env.at(2).commit(RUN_ID, 0, 0, digest("h"))
    publish = env.coordinator.publish_version(RUN_ID, 1, digest("m1"), digest("r1"))
    assert stream.poll() == []  # the commit has 1 confirmation, the publication none
    env.mine(1)
    first = stream.poll()
    assert [type(e) for e in first] == [Committed]
    assert first[0].transaction_hash == commit.transaction_hash and first[0].block_number == commit.block_number
    env.mine(1)
    second = stream.poll()
    assert [type(e) for e in second] == [VersionPublished]
    assert second[0].block_number == publish.block_number
    assert stream.poll() == []


def test_events_filter_by_kind_and_include_token(staked):
    env = staked
    all_events = list(env.admin.events(0))
    assert sum(isinstance(e, RunCreated) for e in all_events) == 1
    staked_events = list(env.admin.events(0, kinds=(Staked,)))
    assert [e.account for e in staked_events] == [env.addr(i) for i in (*env.WORKERS, *env.VERIFIERS)]
    with_token = env.admin.event_stream(0, include_token=True).poll((Transfer,))
    assert any(t.recipient == env.deployment.protocol for t in with_token)
    ordered = [(e.block_number, e.log_index) for e in all_events]
    assert ordered == sorted(ordered)


def test_asked_for_some_kinds_the_node_sends_only_their_logs(staked, monkeypatch):
    """The kinds become the query's topics: the node answers with those logs alone, so a verifier
    polling for `Committed` decodes no attestation, seal or publication. A kind with no ABI event
    matches nothing (an empty topic list would match every log) and the cursor still advances."""
    from dataclasses import dataclass

    from krill.chain.events import ChainEvent

    env = staked
    eth, answered = env.admin.w3.eth, []
    real = eth.get_logs
    monkeypatch.setattr(eth, "get_logs", lambda query: answered.append(real(query)) or answered[-1])
    everything = list(env.admin.events(0))
    answered.clear()
    stream = env.admin.event_stream(0)
    wanted = stream.poll((Staked, RunCreated))
    assert wanted == [e for e in everything if isinstance(e, (Staked, RunCreated))] and wanted
    assert sum(len(logs) for logs in answered) == len(wanted) < len(everything)

    @dataclass(frozen=True)
    class NotAnEvent(ChainEvent):
        pass

    other = env.admin.event_stream(0)
    answered.clear()
    assert other.poll((NotAnEvent,)) == [] and answered == []
    assert other.next_block == stream.next_block
