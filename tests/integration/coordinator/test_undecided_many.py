"""`undecided_commits` on both backends for a run with more commits than one query can bind.

A coordinator on a new database (the old one lost: `krill.coordinator.adopt`) of a run with more than
65 535 commits has every one of them undecided on its first pass; their commit times were read with
every id in one IN (...), which PostgreSQL refuses (65 535 bind parameters), so every pass failed.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from sqlalchemy import insert

from krill.coordinator.ingest import undecided_commits
from krill.db.models import ChainEventRow, Commit, Participant, Run
from krill.db.session import open_database

RUN = "ab" * 32
WORKER = "0x" + "22" * 20
COMMITS = 70_000
_names = itertools.count()


@pytest.fixture(scope="module")
def postgres_url():
    from krill.testing.postgres import PostgresUnavailableError, postgres_server

    try:
        server = postgres_server()
        url = server.__enter__()
    except PostgresUnavailableError as exc:
        pytest.skip(f"PostgreSQL unavailable: {exc}")
    try:
        yield url
    finally:
        server.__exit__(None, None, None)


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'krill.db'}"
    else:
        from krill.testing.postgres import create_database

        url = create_database(request.getfixturevalue("postgres_url"), f"krill_undecided_{next(_names)}")
    database = open_database(url)
    yield database
    database.close()


def test_undecided_commits_of_a_run_with_more_commits_than_one_query_can_bind(db):
    tx = "0x" + "ee" * 32
    with db.write() as s:
        s.add(Run(run_id=RUN, coordinator=WORKER, base_manifest_digest="cd" * 32, max_staleness=1,
                  attestation_quorum=1, slash_fraction_bps=1, verifier_bounty_bps=1, check_probability_ppm=1,
                  challenge_window_blocks=1, reward_per_version=1, reward_pool=0, funded_total=0, latest_version=0,
                  created_block=1, created_tx=tx))
        s.add(Participant(address=WORKER, role=1, staked=0, unbonding=0, release_block=0, jailed=False,
                          slashed_total=0, first_block=0, commits=0, checks_passed=0, checks_failed=0,
                          trust_alpha=1.0, trust_beta=1.0, rewards_credited=0, bounties_credited=0, claimed=0))
        s.flush()
        s.execute(insert(Commit), [dict(commit_id=i, run_id=RUN, worker=WORKER, version=0, nonce=i % 50_000,
                                        header_digest=f"{i:064x}", header_cid="bafkrei", block_number=1, tx_hash=tx,
                                        pass_count=0, fail_count=0, slashed=False) for i in range(1, COMMITS + 1)])
        s.execute(insert(ChainEventRow), [dict(tx_hash=f"0x{i:064x}", log_index=0, block_number=1, block_time=1000 + i,
                                               kind="Committed", run_id=RUN, commit_id=i, account=WORKER, data={})
                                          for i in range(1, COMMITS + 1)])
    views = undecided_commits(SimpleNamespace(db=db, run_hex=RUN))
    assert [v.commit_id for v in views] == list(range(1, COMMITS + 1))
    assert views[0].block_time == 1001 and views[-1].block_time == 1000 + COMMITS  # the last chunk's times too
    assert views[-1].nonce_first_commit == COMMITS - 50_000  # nonce 20 000 was first committed by commit 20 000
    assert views[0].nonce_first_commit == 1
