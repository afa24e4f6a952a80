"""The indexer against a real in-process chain (py-evm) and a real local store, on both databases."""

from __future__ import annotations

import shutil

import pytest
from db_checks import assert_index_matches_chain, assert_scenario_rows
from db_scenario import play
from sqlalchemy import select, update

from krill.chain.rpc import connect_in_process
from krill.db import ingest
from krill.db.errors import IndexMismatchError
from krill.db.indexer import Indexer
from krill.db.models import INDEX_TABLES, FetchStatus, Header, IndexMeta, RoleCursor
from krill.db.session import open_database, table_rows
from krill.store.local import LocalStore


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    root = tmp_path_factory.mktemp("index-scenario")
    store = LocalStore(root / "store")
    return play(connect_in_process(accounts=10), store), store


def indexer(sc, db, store, **kwargs) -> Indexer:
    return Indexer(sc.chain(), db, store, start_block=sc.deployment.block_number, **kwargs)


def rows(db) -> dict:
    with db.session() as s:
        return table_rows(s, INDEX_TABLES)


def test_index_agrees_with_the_chain_and_the_store(db, played):
    sc, store = played
    report = indexer(sc, db, store).sync()
    assert report.events > 30 and report.next_block == sc.w3.eth.block_number + 1
    assert report.fetched == {"headers_available": 2, "headers_unavailable": 1, "headers_invalid": 2,
                              "manifests_available": 2}
    with db.session() as s:
        assert_index_matches_chain(s, sc)
        assert_scenario_rows(s, sc)


def test_sync_twice_or_replayed_changes_nothing(db, played):
    sc, store = played
    ix = indexer(sc, db, store, batch_blocks=7)
    ix.sync()
    first = rows(db)
    assert ix.sync().events == 0
    with db.session() as s:  # move the cursor back by hand: events are keyed, nothing doubles
        s.execute(update(IndexMeta).values(next_block=sc.deployment.block_number))
    replayed = indexer(sc, db, store, batch_blocks=7).sync()  # a new process reads the moved cursor
    assert replayed.events == 0 and replayed.batches > 1
    after = rows(db)
    assert after.pop("headers") != first.pop("headers")  # only the withheld header's retry count moved
    assert after == first


def test_a_batch_looks_its_events_up_once_and_applies_a_repeated_event_once(db, played, tmp_path):
    sc, store = played
    ix = indexer(sc, db, store)
    ix.sync()
    first = rows(db)
    events, *_ = ix._logs(sc.deployment.block_number, sc.w3.eth.block_number)
    assert len(events) > 20
    with db.write() as s:
        known = ingest.known_events(s, events)
        assert len(known) == len(events)  # every event of the chain is already recorded
        assert not any(ingest.apply_event(s, e, 0, ix.trust_prior, known) for e in events)
    fresh = open_database(f"sqlite:///{tmp_path / 'again.db'}")
    try:  # a new index: each event applies once though the batch names some twice
        with fresh.write() as s:
            known = ingest.known_events(s, events)
            assert known == set()
            applied = [ingest.apply_event(s, e, 0, ix.trust_prior, known) for e in events + events[:5]]
        assert sum(applied) == len(events) and not any(applied[len(events):])
    finally:
        fresh.close()
    assert rows(db) == first


def test_rebuild_gives_the_rows_of_an_incremental_index(db, played):
    sc, store = played
    head = sc.w3.eth.block_number
    # Incremental: small batches, in three passes as the chain "grows" (confirmation depth shrinks).
    for confirmations in (40, 15, 0):
        indexer(sc, db, store, batch_blocks=3, confirmations=confirmations).sync()
    with db.session() as s:
        s.add(RoleCursor(name="coordinator", position=9))
    incremental = rows(db)
    assert incremental["index_meta"][0][-1] == head + 1
    indexer(sc, db, store).rebuild()
    rebuilt = rows(db)
    # The withheld header was tried once per pass incrementally and once by the rebuild.
    for table in (incremental, rebuilt):
        table["headers"] = [h[:2] + h[3:] for h in table["headers"]]
    assert rebuilt == incremental
    with db.session() as s:
        assert s.get(RoleCursor, "coordinator").position == 9


def test_resumes_from_its_cursor_after_a_crash(db_url, played, monkeypatch):
    sc, store = played
    reference_db = open_database(db_url.replace("krill.db", "reference.db")) if db_url.startswith("sqlite") else None
    applied = {"n": 0}
    real_apply = ingest.apply_event

    def crash_after_20(session, event, block_time, prior, known):
        applied["n"] += 1
        if applied["n"] > 20:
            raise KeyboardInterrupt("simulated crash")
        return real_apply(session, event, block_time, prior, known)

    db = open_database(db_url)
    monkeypatch.setattr("krill.db.indexer.apply_event", crash_after_20)
    with pytest.raises(KeyboardInterrupt):
        indexer(sc, db, store, batch_blocks=10).sync()
    db.close()
    monkeypatch.setattr("krill.db.indexer.apply_event", real_apply)

    db = open_database(db_url)  # a new process, in effect
    ix = indexer(sc, db, store, batch_blocks=10)
    resumed_from = ix.next_block()
    assert sc.deployment.block_number < resumed_from < sc.w3.eth.block_number
    with db.session() as s:  # the half-applied batch left nothing behind
        assert s.scalar(select(IndexMeta.next_block)) == resumed_from
    ix.sync()
    with db.session() as s:
        assert_index_matches_chain(s, sc)
        assert_scenario_rows(s, sc)
    if reference_db is not None:
        indexer(sc, reference_db, store).sync()
        assert rows(reference_db) == rows(db)
        reference_db.close()
    db.close()


def test_unavailable_content_is_retried_and_never_stops_ingest(db, played, tmp_path):
    sc, store = played
    no_store = indexer(sc, db, None)
    no_store.sync()
    with db.session() as s:
        assert {h.status for h in s.scalars(select(Header))} == {FetchStatus.PENDING}
    private = LocalStore(shutil.copytree(store.root, tmp_path / "store"))
    ix = indexer(sc, db, private, max_fetch_attempts=2)
    ix.sync()
    withheld = sc.commits["withheld"]
    with db.session() as s:
        row = s.get(Header, withheld)
        assert (row.status, row.attempts) == (FetchStatus.UNAVAILABLE, 1)
        assert "not in the local store" in row.error
    private.put_block(sc.withheld["withheld"])
    ix.sync()
    with db.session() as s:
        row = s.get(Header, withheld)
        assert (row.status, row.attempts, row.error, row.prompt_seed) == (FetchStatus.AVAILABLE, 2, None, 1001)
    status = ix.status()
    assert status.lag_blocks == 0 and status.headers == {"available": 3, "invalid": 2}


def test_content_is_fetched_when_due_and_outside_the_passes_when_asked(db, played, tmp_path):
    from sqlalchemy import event

    from krill.db.indexer import SyncReport

    sc, store = played
    private = LocalStore(shutil.copytree(store.root, tmp_path / "store"))
    ix = indexer(sc, db, private, content_in_sync=False)  # the coordinator's: passes index events only
    assert ix.sync().fetched == {}
    with db.session() as s:
        assert {h.status for h in s.scalars(select(Header))} == {FetchStatus.PENDING}
    report = SyncReport(0, 0, 0)
    assert ix.fetch_due_content(report)
    assert report.fetched == {"headers_available": 2, "headers_unavailable": 1, "headers_invalid": 2,
                              "manifests_available": 2}
    private.put_block(sc.withheld["withheld"])
    report = SyncReport(0, 0, 0)
    assert ix.fetch_due_content(report)  # the unavailable header is retried
    assert report.fetched == {"headers_available": 1}
    statements: list[str] = []
    event.listen(db.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    # nothing pending: neither a pass nor a fetch asks the database for pending rows
    assert not ix.fetch_due_content() and ix.sync().events == 0
    plain = indexer(sc, db, private)
    plain.sync()  # a new process's first pass fetches (rows may be pending), then only when due
    statements.clear()
    assert plain.sync().fetched == {} and not plain.fetch_due_content()
    assert statements == []


def test_a_header_the_store_holds_does_not_hold_the_pass(db, played, tmp_path):
    """On a networked store a header nobody has waits out the store's timeout: its fetch holds one
    fetch thread (and its worker's lane), the pass records the other workers' headers, and a later
    pass records the miss."""
    import threading

    from krill.db.indexer import SyncReport
    from krill.db.models import Commit
    from krill.errors import ContentNotFoundError

    sc, store = played
    private = LocalStore(shutil.copytree(store.root, tmp_path / "store"))
    ix = indexer(sc, db, private, content_in_sync=False)
    ix.sync()
    withheld = sc.commits["withheld"]
    with db.session() as s:
        missing = s.get(Commit, withheld).header_cid
    release, started, get = threading.Event(), [], private.get

    def networked_get(cid, **kwargs):
        if cid == missing:
            started.append(cid)
            release.wait(8)
            raise ContentNotFoundError(f"the store found no {cid} within its timeout")
        return get(cid, **kwargs)

    private.get = networked_get
    try:
        report = SyncReport(0, 0, 0)
        assert ix.fetch_due_content(report)
        # the worker's commit after the withheld one waits in its lane; the other worker's are recorded
        assert report.fetched == {"headers_available": 2, "headers_invalid": 1, "manifests_available": 2}
        with db.session() as s:
            for commit_id in (withheld, sc.commits["contradicting"]):
                assert (s.get(Header, commit_id).status, s.get(Header, commit_id).attempts) == (FetchStatus.PENDING, 0)
        report = SyncReport(0, 0, 0)
        assert ix.fetch_due_content(report)  # still due while its fetch runs, and not fetched twice
        assert report.fetched == {} and started == [missing]
    finally:
        release.set()
    ix._fetcher.wait([withheld, sc.commits["contradicting"]], 10)
    report = SyncReport(0, 0, 0)
    assert ix.fetch_due_content(report)
    assert report.fetched == {"headers_unavailable": 1, "headers_invalid": 1}
    with db.session() as s:
        row = s.get(Header, withheld)
        assert (row.status, row.attempts) == (FetchStatus.UNAVAILABLE, 1) and "within its timeout" in row.error


def test_fetch_attempts_are_capped(db, played):
    sc, store = played
    ix = indexer(sc, db, store, max_fetch_attempts=2)
    for _ in range(3):
        ix.sync()
    with db.session() as s:
        assert s.get(Header, sc.commits["withheld"]).attempts == 2


def test_an_index_refuses_another_deployment(db, played):
    sc, store = played
    indexer(sc, db, store).sync()
    from krill.chain.client import KrillChain

    with pytest.raises(IndexMismatchError, match="krill index rebuild"):
        Indexer(KrillChain(sc.w3, "0x" + "12" * 20), db).sync()


def test_an_index_of_a_chain_since_restarted_is_refused(db, played):
    """Same chain id, same contract address (a devnet restarted and deployed the same way): only the start
    block's hash tells the chains apart. The old index kept its rows and a cursor past the new head."""
    from krill.db.models import IndexAnchor

    sc, store = played
    indexer(sc, db, store).sync()
    with db.session() as s:
        anchor = s.get(IndexAnchor, 1)
        assert (anchor.block_number, anchor.block_hash) == (
            sc.deployment.block_number, bytes(sc.w3.eth.get_block(sc.deployment.block_number)["hash"]).hex())
    assert indexer(sc, db, store).sync().events == 0  # the same chain, a new process: fine
    with db.session() as s:
        s.execute(update(IndexAnchor).values(block_hash="ab" * 32))  # the chain the index was built from
    with pytest.raises(IndexMismatchError, match="indexes another chain.*krill index rebuild"):
        indexer(sc, db, store).sync()
    fresh = indexer(sc, db, store)
    fresh.rebuild()
    assert fresh.sync().events == 0 and rows(db)["index_anchor"]


def _cap_get_logs(monkeypatch, w3, max_blocks: int, http: bool = False) -> dict:
    """Make the node refuse an `eth_getLogs` of more than `max_blocks` blocks, as many public endpoints
    do: with a JSON-RPC error answer (web3's `Web3RPCError`), or (`http`) a gateway's HTTP 400."""
    import requests
    from web3.exceptions import Web3RPCError

    real, seen = w3.eth.get_logs, {"refused": 0, "ranges": []}

    def capped(query):
        start, end = query["fromBlock"], query["toBlock"]
        end = w3.eth.block_number if end == "latest" else end
        seen["ranges"].append(end - start + 1)
        if end - start + 1 > max_blocks:
            seen["refused"] += 1
            if http:
                response = requests.Response()
                response.status_code = 400
                raise requests.HTTPError("400 Client Error: block range too large", response=response)
            raise Web3RPCError(f"{{'code': -32600, 'message': 'exceed maximum block range: {max_blocks}'}}")
        return real(query)

    monkeypatch.setattr(w3.eth, "get_logs", capped)
    return seen


@pytest.mark.parametrize("http", [False, True], ids=["rpc-error", "http-400"])
def test_a_node_that_caps_the_log_range_is_asked_for_smaller_batches_and_nothing_is_missed(
        db, played, monkeypatch, http):
    """With a fixed batch such a node refused every catch-up longer than its cap, on every pass, forever."""
    sc, store = played
    ix = indexer(sc, db, store)  # batches of 500 blocks, against a cap of 8
    assert sc.w3.eth.block_number - sc.deployment.block_number > 8  # the catch-up is longer than the cap
    seen = _cap_get_logs(monkeypatch, ix.chain.w3, 8, http)
    report = ix.sync()
    assert report.next_block == sc.w3.eth.block_number + 1
    with db.session() as s:
        assert_index_matches_chain(s, sc)
        assert_scenario_rows(s, sc)
    assert seen["refused"] <= 7 and max(size for size in seen["ranges"][-3:]) <= 8  # 500 -> 250 -> ... -> 7
    refused = seen["refused"]
    with db.session() as s:  # move the cursor back by hand: the smaller batch is kept for later passes
        s.execute(update(IndexMeta).values(next_block=sc.deployment.block_number))
    ix._cursor = None
    assert ix.sync().next_block == sc.w3.eth.block_number + 1 and seen["refused"] == refused


def test_a_node_that_refuses_every_range_raises_its_refusal_with_the_cursor_unmoved(db, played, monkeypatch):
    from web3.exceptions import Web3RPCError

    sc, store = played
    ix = indexer(sc, db, store)
    seen = _cap_get_logs(monkeypatch, ix.chain.w3, 0)
    with pytest.raises(Web3RPCError):
        ix.sync()
    assert ix.next_block() == sc.deployment.block_number and seen["refused"] <= 10
