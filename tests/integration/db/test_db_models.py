"""Models on both backends: round trips (uint256 exactness), schema versions, rebuild scope, write lock."""

from __future__ import annotations

import hashlib
import threading

import pytest
from sqlalchemy import select, update
from sqlalchemy.exc import StatementError

from krill.db.content import CommitFacts, fetch_header
from krill.db.errors import DatabaseValueError, SchemaVersionError
from krill.db.models import (
    INDEX_TABLES,
    STATE_TABLES,
    Commit,
    Contribution,
    ContributionStatus,
    Eval,
    FetchStatus,
    Header,
    Metric,
    Participant,
    RejectionCode,
    RoleCursor,
    Run,
    SchemaVersion,
    Version,
)
from krill.db.session import make_engine, open_database, table_rows
from krill.payload.canonical import canonical_json
from krill.store.cid import digest_to_cid, file_cid

BIG = 2**256 - 1
RUN = "ab" * 32


def _run(**overrides) -> Run:
    values = dict(run_id=RUN, coordinator="0x" + "11" * 20, base_manifest_digest="cd" * 32, max_staleness=2,
                  attestation_quorum=2, slash_fraction_bps=5000, verifier_bounty_bps=2000,
                  check_probability_ppm=1_000_000, challenge_window_blocks=10, reward_per_version=BIG,
                  reward_pool=BIG - 1, funded_total=0, latest_version=0, created_block=5, created_tx="0x" + "ee" * 32)
    return Run(**{**values, **overrides})


def test_round_trip_keeps_uint256_exact(db):
    with db.session() as s:
        s.add(_run())
        s.add(Version(run_id=RUN, version=0, manifest_digest="cd" * 32, record_digest=None, published_block=5,
                      published_tx="0x" + "ee" * 32, settled=True, manifest_cid="bafkrei", manifest_status=FetchStatus.PENDING,
                      manifest_attempts=0))
        s.add(Commit(commit_id=1, run_id=RUN, worker="0x" + "22" * 20, version=0, nonce=2**64 - 1,
                     header_digest="01" * 32, header_cid="bafkrei", worker_key="02" * 32, block_number=6,
                     tx_hash="0x" + "03" * 32, pass_count=0, fail_count=0, slashed=False))
        s.add(Header(commit_id=1, status=FetchStatus.AVAILABLE, attempts=1, sampling_seed=2**64 - 1, shards=[0, 3],
                     files={"grad-0.safetensors": {"size": 4}}))
    with db.session() as s:
        run = s.get(Run, RUN)
        assert run.reward_per_version == BIG and run.reward_pool == BIG - 1
        assert isinstance(run.reward_pool, int)
        assert s.get(Commit, 1).nonce == 2**64 - 1
        header = s.get(Header, 1)
        assert header.status is FetchStatus.AVAILABLE
        assert (header.sampling_seed, header.shards, header.files) == (2**64 - 1, [0, 3], {"grad-0.safetensors": {"size": 4}})


def test_out_of_range_amount_is_refused_naming_the_problem(db):
    with pytest.raises(StatementError) as caught, db.session() as s:
        s.add(_run(reward_pool=2**256))
        s.flush()
    assert isinstance(caught.value.orig, DatabaseValueError)
    assert "uint column" in str(caught.value.orig)


def test_role_state_round_trip(db):
    with db.session() as s:
        s.add(Contribution(commit_id=7, run_id=RUN, worker="0x" + "22" * 20, version=3,
                           status=ContributionStatus.REJECTED, reason_code=RejectionCode.BAD_SIGNATURE,
                           reason="header.signature: does not verify", weight=None, staleness=1))
        s.add(Metric(run_id=RUN, version=3, accepted=4, rejected=1, mean_reward=0.25, sampled_tokens=10**12,
                     extra={"trimmed_fraction": 0.2}))
        s.add(Eval(run_id=RUN, version=3, task="arithmetic", n=200, correct=101, accuracy=0.505))
        s.add(RoleCursor(name="coordinator:" + RUN, position=12))
    with db.session() as s:
        c = s.get(Contribution, 7)
        assert (c.status, c.reason_code) == (ContributionStatus.REJECTED, RejectionCode.BAD_SIGNATURE)
        assert c.updated_at is not None
        assert s.get(Metric, (RUN, 3)).extra == {"trimmed_fraction": 0.2}
        assert s.get(Eval, (RUN, 3, "arithmetic", "eval")).correct == 101
        assert s.get(RoleCursor, "coordinator:" + RUN).position == 12


def test_reset_index_empties_the_index_and_keeps_role_state(db):
    with db.session() as s:
        s.add(_run())
        s.add(RoleCursor(name="verifier", position=3))
    db.reset_index()
    with db.session() as s:
        assert all(rows == [] for rows in table_rows(s, INDEX_TABLES).values())
        assert s.get(RoleCursor, "verifier").position == 3
    assert {t.name for t in INDEX_TABLES + STATE_TABLES} <= db.table_names()


def test_other_schema_version_is_refused_with_advice(db, db_url):
    with db.session() as s:
        s.execute(update(SchemaVersion).where(SchemaVersion.component == "index").values(version=99))
    with pytest.raises(SchemaVersionError, match="krill index rebuild"):
        open_database(db_url)
    db.reset_index()
    open_database(db_url).close()
    with db.session() as s:
        s.execute(update(SchemaVersion).where(SchemaVersion.component == "state").values(version=0))
    with pytest.raises(SchemaVersionError, match="new database"):
        open_database(db_url)


def test_writers_in_several_connections_serialise_without_lost_updates(db, db_url):
    with db.session() as s:
        s.add(Participant(address="0x" + "33" * 20, role=1, staked=0, unbonding=0, release_block=0, jailed=False,
                          slashed_total=0, first_block=0, commits=0, checks_passed=0, checks_failed=0,
                          trust_alpha=1.0, trust_beta=3.0, rewards_credited=0, bounties_credited=0, claimed=0))
    others = [open_database(db_url) for _ in range(3)]
    errors: list[BaseException] = []

    def bump(database, times: int) -> None:
        try:
            for _ in range(times):
                with database.write() as s:
                    row = s.execute(select(Participant).with_for_update()).scalar_one()
                    row.commits += 1
        except BaseException as exc:  # reported below; a thread cannot fail the test itself
            errors.append(exc)

    threads = [threading.Thread(target=bump, args=(d, 25)) for d in others]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for d in others:
        d.close()
    assert errors == []
    with db.session() as s:
        assert s.execute(select(Participant.commits)).scalar_one() == 75



def test_connections_opening_a_new_sqlite_file_together_all_open(tmp_path):
    """Connections switching a new file to WAL at once got "database is locked" without SQLite's busy
    handler (about one round in ten of four); the switch is retried within the busy timeout."""
    errors: list[BaseException] = []

    def connect(engine, start: threading.Barrier) -> None:
        try:
            start.wait()
            with engine.connect():
                pass
        except BaseException as exc:  # reported below
            errors.append(exc)

    for i in range(150):
        engines = [make_engine(f"sqlite:///{tmp_path / f'new{i}.db'}") for _ in range(4)]
        start = threading.Barrier(len(engines))
        threads = [threading.Thread(target=connect, args=(e, start)) for e in engines]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        for e in engines:
            e.dispose()
        assert errors == [], f"round {i}"

def _nul_named_header() -> tuple[bytes, CommitFacts]:
    """A signed-looking header whose file name holds NUL (JSON \\u0000): its fetch ends INVALID with an error
    that quotes the name."""
    key = "02" * 32
    files = {"x\x00y": {"cid": file_cid(b"r"), "sha256": "00" * 32, "size": 1}}
    raw = dict(protocol=1, run_id=RUN, chain_id=31337, contract="0x" + "cc" * 20, worker="0x" + "22" * 20,
               ed25519_key=key, model_version=0, behaviour_version=0, manifest_cid=file_cid(b"m"), task="arith",
               prompt_seed=1, nonce=0, engine="hf-torch", signature="00" * 64, files=files,
               sampling=dict(temperature_milli=1000, top_p_milli=1000, top_k=0, max_new_tokens=5, seed=1))
    data = canonical_json(raw)
    facts = CommitFacts(commit_id=1, header_cid=digest_to_cid(hashlib.sha256(data).digest()), run_id=RUN,
                        worker="0x" + "22" * 20, version=0, nonce=0, worker_key=key, chain_id=31337,
                        contract="0x" + "cc" * 20)
    return data, facts


def test_messages_quoting_nul_or_lone_surrogates_are_stored_escaped(db):
    """A hostile header (a file name with NUL) made the index's header error unstorable on PostgreSQL, and a
    gradient's tensor name with a lone surrogate made the coordinator's rejection reason unstorable on both
    backends: the write transaction failed on every pass. Messages are stored with those characters escaped."""
    data, facts = _nul_named_header()
    fetched = fetch_header(type("Store", (), {"get": lambda self, cid, max_bytes=None: data})(), facts)
    assert fetched.status is FetchStatus.INVALID and "\x00" in fetched.error
    with db.write() as s:
        s.add(_run())
        s.add(Version(run_id=RUN, version=0, manifest_digest="cd" * 32, record_digest=None, published_block=5,
                      published_tx="0x" + "ee" * 32, settled=True, manifest_cid="bafkrei",
                      manifest_status=FetchStatus.INVALID, manifest_attempts=1, manifest_error="m\x00\ud800"))
        s.add(Commit(commit_id=1, run_id=RUN, worker="0x" + "22" * 20, version=0, nonce=0, header_digest="01" * 32,
                     header_cid=facts.header_cid, worker_key="02" * 32, block_number=6, tx_hash="0x" + "03" * 32,
                     pass_count=0, fail_count=0, slashed=False))
        s.add(Header(commit_id=1, status=fetched.status, attempts=1, error=fetched.error))
        s.add(Contribution(commit_id=1, run_id=RUN, worker="0x" + "22" * 20, version=0,
                           status=ContributionStatus.REJECTED, reason_code=RejectionCode.MALFORMED_PAYLOAD,
                           reason="DtypeError: grad-0.safetensors.w\ud800\x00x: unsupported dtype 'NOPE'"))
    with db.session() as s:
        assert s.get(Header, 1).error == fetched.error.replace("\x00", "\\x00")
        assert "header.files.x\\x00y" in s.get(Header, 1).error
        assert s.get(Version, (RUN, 0)).manifest_error == "m\\x00\\ud800"
        assert s.get(Contribution, 1).reason == "DtypeError: grad-0.safetensors.w\\ud800\\x00x: unsupported dtype 'NOPE'"
