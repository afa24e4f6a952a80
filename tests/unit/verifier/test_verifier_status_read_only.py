"""`krill verifier status` reads the verifier's state file read-only (`VerifierState.open_read_only`): it neither
waits behind a running verifier's write transaction nor writes to the file (schema, migration, identity rows)."""

from __future__ import annotations

import hashlib
import sqlite3
import time

import pytest

from krill.config import KrillConfig
from krill.errors import ConfigError
from krill.verifier.state import READ_WAIT_S, VerifierState
from krill.verifier.state import Job as StateJob
from krill.verifier.status import _local

CONTRACT, RUN, ME = "0x" + "44" * 20, b"\xab" * 32, "0x" + "cd" * 20


def _config(state_dir) -> KrillConfig:
    return KrillConfig.model_validate({"chain": {"protocol_address": CONTRACT}, "verifier": {"state_dir": str(state_dir)}})


def _job(commit_id: int) -> StateJob:
    return StateJob(commit_id, "0x" + "11" * 20, 0, commit_id, bytes([commit_id]) * 32, 10 + commit_id)


def test_status_reads_while_the_verifier_holds_a_write_transaction(tmp_path):
    """Before: status's own `BEGIN IMMEDIATE` waited the 30 s busy timeout, then raised "database is locked"."""
    state = VerifierState.for_run(tmp_path, contract=CONTRACT, run_id=RUN, verifier=ME)
    state.add_jobs([_job(1), _job(2)], 20)
    state.finish(1, "attested", ok=True, origin="selected")
    writer = sqlite3.connect(str(state.path), isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")  # the running verifier, mid-write
        writer.execute("UPDATE meta SET value = '99' WHERE key = 'cursor'")
        started = time.monotonic()
        local = _local(_config(tmp_path), ME, RUN)
        assert time.monotonic() - started < READ_WAIT_S
        assert (local["attested"], local["passed"], local["pending"], local["cursor"]) == (1, 1, 1, 20)
        writer.execute("COMMIT")
    finally:
        writer.close()
        state.close()


def test_status_leaves_an_older_release_file_as_it_is(tmp_path):
    """Before: status migrated the file (nonce to TEXT, three columns added), set WAL and wrote its identity rows."""
    path = VerifierState.path_for(tmp_path, contract=CONTRACT, run_id=RUN)
    db = sqlite3.connect(str(path))
    db.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE commits (commit_id INTEGER PRIMARY KEY, worker TEXT NOT NULL, version INTEGER NOT NULL,
            nonce INTEGER NOT NULL, header_digest TEXT NOT NULL, commit_block INTEGER NOT NULL, status TEXT NOT NULL,
            ok INTEGER, reason TEXT, evidence_cid TEXT, tx_hash TEXT, updated REAL NOT NULL);
        INSERT INTO meta VALUES ('cursor', '31');
        INSERT INTO commits VALUES (1, 'w', 0, 5, 'aa', 10, 'attested', 0, 'bad rewards', NULL, NULL, 0);
        INSERT INTO commits VALUES (2, 'w', 0, 6, 'bb', 11, 'missed', NULL, NULL, NULL, NULL, 0);
    """)
    db.commit()
    db.close()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    local = _local(_config(tmp_path), ME, RUN)
    assert (local["attested"], local["failed"], local["missed"], local["cursor"]) == (1, 1, 1, 31)
    assert (local["corroborated"], local["corroborating"]) == (0, 0)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    db = sqlite3.connect(str(path))
    try:
        assert "origin" not in {row[1] for row in db.execute("PRAGMA table_info(commits)")}
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert db.execute("SELECT key FROM meta").fetchall() == [("cursor",)]
    finally:
        db.close()


def test_a_lock_status_cannot_get_soon_reads_as_unreadable_not_a_failure(tmp_path):
    """A rollback-journal file (an older release's) whose writer holds its exclusive lock: status gives up after
    `READ_WAIT_S` and says why, instead of raising sqlite's error after 30 s."""
    path = VerifierState.path_for(tmp_path, contract=CONTRACT, run_id=RUN)
    writer = sqlite3.connect(str(path), isolation_level=None)
    try:
        writer.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        writer.execute("BEGIN EXCLUSIVE")
        started = time.monotonic()
        local = _local(_config(tmp_path), ME, RUN)
        assert time.monotonic() - started < READ_WAIT_S + 3
        assert local == {"state": str(path), "unreadable": "OperationalError: database is locked"}
    finally:
        writer.close()


def test_the_read_only_state_refuses_another_verifiers_file_and_writes(tmp_path):
    state = VerifierState.for_run(tmp_path, contract=CONTRACT, run_id=RUN, verifier=ME)
    state.close()
    with pytest.raises(ConfigError, match="belongs to verifier"):
        VerifierState.open_read_only(state.path, contract=CONTRACT, run_id=RUN, verifier="0x" + "ee" * 20)
    reader = VerifierState.open_read_only(state.path, contract=CONTRACT, run_id=RUN, verifier=ME)
    try:
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            reader.add_jobs([_job(1)], 5)
    finally:
        reader.close()


def test_status_figures_are_read_in_one_snapshot(tmp_path, monkeypatch):
    """The verifier attests a commit and moves its cursor while status reads: before, each figure was its own
    statement, so status showed '1 attested: 2 passed' and a cursor newer than its counts."""
    state = VerifierState.for_run(tmp_path, contract=CONTRACT, run_id=RUN, verifier=ME)
    state.add_jobs([_job(1), _job(2)], 20)
    state.finish(1, "attested", ok=True, origin="selected")
    opened = VerifierState.open_read_only.__func__
    statements: list[str] = []

    def hooked(cls, *args, **kwargs):
        reader = opened(cls, *args, **kwargs)

        def between(sql: str) -> None:  # the running verifier writes as status starts its second read
            if not sql.startswith(("BEGIN", "COMMIT")):
                statements.append(sql)
                if len(statements) == 2:
                    state.finish(2, "attested", ok=True, origin="selected")
                    state.add_jobs([], 30)

        reader._db.set_trace_callback(between)
        return reader

    monkeypatch.setattr(VerifierState, "open_read_only", classmethod(hooked))
    try:
        local = _local(_config(tmp_path), ME, RUN)
        assert state.counts()["attested"] == 2  # the write did happen while status read
        assert (local["attested"], local["pending"], local["passed"], local["cursor"]) == (1, 1, 1, 20)
    finally:
        state.close()
