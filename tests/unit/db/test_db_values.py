"""Value spellings, event-to-JSON, table grouping and URL handling of the database layer (no server)."""

from __future__ import annotations

import pytest

from krill.chain.events import Committed, RunCreated
from krill.chain.types import RunParams
from krill.db.errors import DatabaseError, DatabaseValueError
from krill.db.ingest import HANDLERS, RECORDED_ONLY, event_data
from krill.db.models import INDEX_TABLES, STATE_TABLES, IndexBase, StateBase
from krill.db.session import open_database
from krill.db.types import address, hex32, tx_hash

LOC = dict(block_number=5, transaction_hash="0x" + "AB" * 32, log_index=3, address="0x" + "11" * 20)


def test_spellings_are_canonical_and_errors_name_the_field():
    assert hex32(b"\x01" * 32, "d") == "01" * 32
    assert hex32("0x" + "AB" * 32, "d") == "ab" * 32
    assert address("0xAbCdEf0123456789aBcDeF0123456789AbCdEf01") == "0xabcdef0123456789abcdef0123456789abcdef01"
    assert tx_hash("CD" * 32) == "0x" + "cd" * 32
    with pytest.raises(DatabaseValueError, match="header_digest: expected 32 bytes, got 31"):
        hex32(b"\x00" * 31, "header_digest")
    with pytest.raises(DatabaseValueError, match="worker: expected an address"):
        address("0x1234", "worker")


def test_event_data_is_json_safe():
    params = RunParams(coordinator="0x" + "AA" * 20, max_staleness=2, attestation_quorum=2, slash_fraction_bps=1,
                       verifier_bounty_bps=2, check_probability_ppm=3, challenge_window_blocks=4,
                       reward_per_version=2**200)
    data = event_data(RunCreated(**LOC, run_id=b"\x02" * 32, coordinator="0x" + "BB" * 20,
                                 base_manifest_digest=b"\x03" * 32, params=params))
    assert data["run_id"] == "02" * 32 and data["coordinator"] == "0x" + "bb" * 20
    assert data["params"]["reward_per_version"] == str(2**200)  # beyond 2**53: a string
    assert data["params"]["max_staleness"] == 2
    assert "block_number" not in data
    commit = event_data(Committed(**LOC, commit_id=1, run_id=b"\x02" * 32, worker="0x" + "CC" * 20, version=0,
                                  nonce=2**64 - 1, header_digest=b"\x04" * 32))
    assert commit["nonce"] == str(2**64 - 1)


def test_every_protocol_event_has_a_handler_or_is_recorded_only():
    from krill.chain.events import EVENT_CLASSES

    assert set(EVENT_CLASSES.values()) == set(HANDLERS) | set(RECORDED_ONLY)
    assert not set(HANDLERS) & set(RECORDED_ONLY)


def test_index_and_state_tables_are_disjoint_and_have_no_cross_keys():
    assert not {t.name for t in INDEX_TABLES} & {t.name for t in STATE_TABLES}
    for table in StateBase.metadata.sorted_tables:
        assert not table.foreign_keys, table.name
    assert {"runs", "versions", "shards", "participants", "commits", "headers", "verdicts", "slashes",
            "rewards"} <= set(IndexBase.metadata.tables)
    assert {"contributions", "metrics", "evals", "role_cursors", "krill_schema"} <= set(StateBase.metadata.tables)


def test_open_database_takes_a_config_and_rejects_other_backends(tmp_path):
    from krill.config import DatabaseConfig

    with open_database(DatabaseConfig(url=f"sqlite:///{tmp_path / 'sub' / 'k.db'}")) as db:
        assert db.backend == "sqlite" and "commits" in db.table_names()
        with db.session() as s:
            assert s.connection().exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    with pytest.raises(DatabaseError, match="unsupported backend 'mysql'"):
        open_database("mysql://localhost/x")


def test_a_write_the_disk_refuses_is_one_error_naming_the_database_and_is_rolled_back(tmp_path):
    """SQLite's own full disk (the file may grow no more: `max_page_count`) under a write: one DatabaseError
    naming the database (it was sqlalchemy's "(sqlite3.OperationalError) database or disk is full" traceback,
    naming none), the failed transaction's rows are not there, the earlier ones are, and with room again
    the same write goes through."""
    from sqlalchemy import event, text

    url = f"sqlite:///{tmp_path / 'krill.db'}"
    db = open_database(url)
    try:
        with db.write() as s:
            s.execute(text("CREATE TABLE filler (n INTEGER PRIMARY KEY, x TEXT)"))
            s.execute(text("INSERT INTO filler (n, x) VALUES (0, 'kept')"))
            pages = s.execute(text("PRAGMA page_count")).scalar()
        cap = {"pages": pages}
        event.listen(db.engine, "connect", lambda conn, record: conn.execute(f"PRAGMA max_page_count = {cap['pages']}"))
        db.engine.dispose()  # new connections take the cap
        with pytest.raises(DatabaseError, match=r"cannot write the database sqlite:///.*krill\.db: database or disk is full"):
            with db.write() as s:
                for n in range(1, 100):
                    s.execute(text("INSERT INTO filler (n, x) VALUES (:n, :x)"), {"n": n, "x": "y" * 2000})
        with db.session() as s:
            assert s.execute(text("SELECT n FROM filler")).scalars().all() == [0]
        cap["pages"] = 1_000_000
        db.engine.dispose()
        with db.write() as s:
            s.execute(text("INSERT INTO filler (n, x) VALUES (1, :x)"), {"x": "y" * 2000})
        with db.session() as s:
            assert s.execute(text("SELECT n FROM filler ORDER BY n")).scalars().all() == [0, 1]
    finally:
        db.close()
