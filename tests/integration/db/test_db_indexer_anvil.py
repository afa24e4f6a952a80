"""The indexer and `krill index` against a real Anvil node: concurrent indexers, the CLI."""

from __future__ import annotations

import json
import threading

import pytest
from click.testing import CliRunner
from db_checks import assert_index_matches_chain, assert_scenario_rows
from db_scenario import play
from sqlalchemy import func, select

from krill.chain.anvil import AnvilProcess
from krill.chain.client import KrillChain
from krill.chain.deploy import TOKEN, deploy
from krill.chain.rpc import connect_http, dev_account, mine
from krill.chain.types import Role
from krill.commands.index_cmd import index
from krill.db import indexer as indexer_module
from krill.db.indexer import Indexer
from krill.db.models import INDEX_TABLES, ChainEventRow
from krill.db.session import open_database, table_rows
from krill.store.local import LocalStore


@pytest.fixture(scope="module")
def anvil_played(tmp_path_factory):
    root = tmp_path_factory.mktemp("anvil-scenario")
    store = LocalStore(root / "store")
    with AnvilProcess.start(accounts=10) as node:
        yield node, play(connect_http(node.rpc_url), store), store


def comparable(db) -> dict:
    """Index rows without the header retry counter (how often a missing header was tried varies)."""
    with db.session() as s:
        rows = table_rows(s, INDEX_TABLES)
    rows["headers"] = [h[:2] + h[3:] for h in rows["headers"]]
    return rows


def requests_sent(w3) -> list[str]:
    """The JSON-RPC methods `w3` sends from now on, in order (the list grows as they are sent)."""
    sent: list[str] = []
    original = w3.provider._make_request

    def counting(method, params):
        sent.append(method)
        return original(method, params)

    w3.provider._make_request = counting
    return sent


def test_concurrent_indexers_apply_each_event_once(db_url, anvil_played, tmp_path):
    node, sc, store = anvil_played
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with open_database(db_url) as db:
                chain = KrillChain(connect_http(node.rpc_url), sc.deployment.protocol)
                Indexer(chain, db, store, start_block=sc.deployment.block_number, batch_blocks=4,
                        fetch_batch=2).sync()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    with open_database(db_url) as db, open_database(f"sqlite:///{tmp_path / 'single.db'}") as single:
        Indexer(sc.chain(), single, store, start_block=sc.deployment.block_number).sync()
        with db.session() as s:
            assert_index_matches_chain(s, sc)
            assert_scenario_rows(s, sc)
        assert comparable(db) == comparable(single)  # also: the same rows on both backends


def test_index_commands(anvil_played, tmp_path):
    node, sc, store = anvil_played
    db_url = f"sqlite:///{tmp_path / 'cli.db'}"
    config = tmp_path / "krill.toml"
    config.write_text(f'[chain]\nrpc_url = "{node.rpc_url}"\nprotocol_address = "{sc.deployment.protocol}"\n'
                      f'deploy_block = {sc.deployment.block_number}\n[store]\ntype = "local"\n'
                      f'path = "{store.root}"\n[database]\nurl = "{db_url}"\n')
    env = {"KRILL_CONFIG": str(config)}
    runner = CliRunner()

    def invoke(*args) -> str:
        result = runner.invoke(index, list(args), env=env, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    empty = json.loads(invoke("status", "--json"))
    assert empty["next_block"] is None and empty["rows"]["commits"] == 0
    first = json.loads(invoke("sync", "--json"))
    assert first["events"] > 30 and first["next_block"] == first["safe_head"] + 1
    assert first["fetched"]["headers_invalid"] == 2
    status = json.loads(invoke("status", "--json"))
    assert status["lag_blocks"] == 0 and status["headers"] == {"available": 2, "invalid": 2, "unavailable": 1}
    again = invoke("sync")
    assert again.startswith(f"no new confirmed block (next block {first['next_block']}, confirmed head "
                            f"{first['safe_head']}): 0 events in 0 batches"), again
    with open_database(db_url) as db:
        before = comparable(db)
    rebuilt = json.loads(invoke("rebuild", "--json"))
    assert rebuilt["events"] == first["events"]
    with open_database(db_url) as db:
        assert comparable(db) == before
    assert "blocks behind" in invoke("status")


def test_index_command_without_a_contract_says_what_to_do(tmp_path):
    result = CliRunner().invoke(index, ["sync"], env={"KRILL_DATABASE__URL": f"sqlite:///{tmp_path / 'x.db'}"})
    assert result.exit_code != 0
    assert "chain.protocol_address is not set" in str(result.exception)


def test_two_indexers_creating_the_cursor_row_at_once_both_proceed(db_url, anvil_played):
    """The second indexer's insert of the cursor row loses to the first's and carries on with its row."""
    node, sc, store = anvil_played
    with open_database(db_url) as db_a, open_database(db_url) as db_b:
        def indexer(db):
            return Indexer(KrillChain(connect_http(node.rpc_url), sc.deployment.protocol), db, store,
                           start_block=sc.deployment.block_number)

        a, b = indexer(db_a), indexer(db_b)
        seen: list[int] = []
        errors: list[BaseException] = []
        with db_a.write() as session:
            a._meta(session)  # row inserted, not yet committed

            def second() -> None:
                try:
                    seen.append(b.next_block())
                except BaseException as exc:  # reported below
                    errors.append(exc)

            thread = threading.Thread(target=second)
            thread.start()
            thread.join(timeout=1.0)  # on PostgreSQL it waits on the uncommitted row; SQLite on the lock
        thread.join(timeout=30)
        assert errors == []
        assert seen == [sc.deployment.block_number]


def test_block_times_come_from_the_logs_and_equal_the_blocks(anvil_played, tmp_path):
    """Anvil puts each log's block timestamp in the log: the indexer reads no block for it, and the
    rows equal those of an indexer that reads every event block (the path for nodes without it)."""
    node, sc, store = anvil_played
    w3 = connect_http(node.rpc_url)
    sent = requests_sent(w3)

    class BlockReading(Indexer):
        def _logs(self, start, end):
            events, _stamped, newest, hashes = super()._logs(start, end)
            return events, {}, newest, hashes

    with open_database(f"sqlite:///{tmp_path / 'logs.db'}") as from_logs, \
            open_database(f"sqlite:///{tmp_path / 'blocks.db'}") as from_blocks:
        Indexer(KrillChain(w3, sc.deployment.protocol), from_logs, store, start_block=sc.deployment.block_number).sync()
        # two block reads: the start block's hash, once per process (`IndexAnchor`), and the batch's last
        # block's (the tip the next pass checks); none for the times
        assert "eth_getLogs" in sent and sent.count("eth_getBlockByNumber") == 2
        BlockReading(KrillChain(w3, sc.deployment.protocol), from_blocks, store,
                     start_block=sc.deployment.block_number).sync()
        assert sent.count("eth_getBlockByNumber") > 2
        assert comparable(from_logs) == comparable(from_blocks)


def test_an_indexer_reading_to_latest_skips_the_head_read_and_indexes_the_same(anvil_played, tmp_path, monkeypatch):
    """`latest_logs` (the coordinator's indexer): after its first pass a pass is one `eth_getLogs` up
    to `latest`, also when no block came (Anvil refuses a range that starts past its head, so the
    query starts a block back); blocks without the contract's logs are caught up by a head read
    every `HEAD_READ_S`; the rows equal a plain indexer's."""
    node, _sc, _store = anvil_played
    w3 = connect_http(node.rpc_url)
    admin = dev_account(0)
    deployment = deploy(w3, admin)  # a deployment of its own: the scenario's chain stays as played
    chain = KrillChain(w3, deployment.protocol, admin)
    sent = requests_sent(w3)
    with open_database(f"sqlite:///{tmp_path / 'latest.db'}") as db, \
            open_database(f"sqlite:///{tmp_path / 'plain.db'}") as plain:
        ix = Indexer(chain, db, start_block=deployment.block_number, latest_logs=True)
        assert ix.sync().events > 0  # the deployment's own events; the head is read on a first pass
        assert "eth_blockNumber" in sent
        sent.clear()
        quiet = ix.sync()
        assert (quiet.events, sent) == (0, ["eth_getLogs"])
        for amount in (101, 102):
            chain.set_minimum_stake(Role.WORKER, amount * TOKEN)
            head = w3.eth.block_number
            sent.clear()
            report = ix.sync()
            assert (report.events, report.next_block, sent) == (1, head + 1, ["eth_getLogs"])
        head = mine(w3, 3)  # blocks without the contract's logs: not read before HEAD_READ_S has passed
        sent.clear()
        behind = ix.sync()
        assert (behind.next_block, sent) == (head - 2, ["eth_getLogs"])
        monkeypatch.setattr(indexer_module, "HEAD_READ_S", 0.0)
        sent.clear()
        caught_up = ix.sync()
        assert "eth_blockNumber" in sent and caught_up.next_block == head + 1
        Indexer(chain, plain, start_block=deployment.block_number).sync()
        assert comparable(db) == comparable(plain)


@pytest.mark.parametrize("latest_logs", [False, True])
def test_a_chain_that_went_back_under_the_index_is_caught_not_mixed_in(anvil_played, tmp_path, monkeypatch,
                                                                       latest_logs):
    """A reorganisation deeper than the confirmations, or a devnet restarted under a long-running indexer:
    the index's last block is gone (wait: nothing is applied) or has another hash (refused), and the
    other chain's events are never applied on top of the old rows. Anvil's snapshot and revert play it."""
    from krill.db.errors import IndexMismatchError
    from krill.errors import ChainUnavailableError

    node, _sc, _store = anvil_played
    monkeypatch.setattr(indexer_module, "HEAD_READ_S", 0.0)
    monkeypatch.setattr(indexer_module, "TIP_CHECK_S", 0.0)  # a pass with no new block checks the tip at once
    w3 = connect_http(node.rpc_url)
    admin = dev_account(0)
    deployment = deploy(w3, admin)
    chain = KrillChain(w3, deployment.protocol, admin)
    with open_database(f"sqlite:///{tmp_path / 'index.db'}") as db:
        ix = Indexer(chain, db, start_block=deployment.block_number, latest_logs=latest_logs)
        ix.sync()
        snapshot = w3.provider.make_request("evm_snapshot", [])["result"]
        chain.set_minimum_stake(Role.WORKER, 101 * TOKEN)
        assert ix.sync().events == 1
        tip = w3.eth.block_number
        assert w3.provider.make_request("evm_revert", [snapshot])["result"] is True
        chain.reset_nonces()  # the admin's last transaction went with the reverted block
        assert w3.eth.block_number == tip - 1
        with pytest.raises(ChainUnavailableError, match=f"has no block {tip}, which this index has read"):
            ix.sync()
        chain.set_minimum_stake(Role.WORKER, 102 * TOKEN)  # block `tip` again, another one
        mine(w3, 1)
        with pytest.raises(IndexMismatchError, match=f"no longer has block {tip} as indexed.*krill index rebuild"):
            ix.sync()
        with pytest.raises(IndexMismatchError):  # a new process too
            Indexer(chain, db, start_block=deployment.block_number, latest_logs=latest_logs).sync()
        with db.session() as s:
            events = s.scalar(select(func.count()).select_from(ChainEventRow))
        fresh = Indexer(chain, db, start_block=deployment.block_number, latest_logs=latest_logs)
        fresh.rebuild()
        with db.session() as s:  # the other chain's event replaces the old one; none is mixed in
            assert s.scalar(select(func.count()).select_from(ChainEventRow)) == events
        assert fresh.sync().events == 0


def test_the_tip_check_costs_one_block_read_a_pass_with_one_new_block_and_none_on_quiet_passes(anvil_played, tmp_path):
    """The head path reads each batch's last block before its logs (the next tip) and checks the tip against
    the first new block's parent hash, read with it; a pass without a new block reads the tip at most every
    `TIP_CHECK_S`."""
    node, _sc, _store = anvil_played
    w3 = connect_http(node.rpc_url)
    admin = dev_account(0)
    deployment = deploy(w3, admin)
    chain = KrillChain(w3, deployment.protocol, admin)
    with open_database(f"sqlite:///{tmp_path / 'index.db'}") as db:
        ix = Indexer(chain, db, start_block=deployment.block_number)
        ix.sync()
        sent = requests_sent(w3)
        chain.set_minimum_stake(Role.WORKER, 103 * TOKEN)
        sent.clear()
        assert ix.sync().events == 1
        assert sorted(sent) == ["eth_blockNumber", "eth_getBlockByNumber", "eth_getLogs"]
        sent.clear()
        ix.sync()
        assert sent == ["eth_blockNumber"]
        mine(w3, 3)
        sent.clear()
        ix.sync()
        assert sent.count("eth_getBlockByNumber") == 2  # the batch's first block (its parent) and its last
