"""The whole protocol as separate processes (the demo's orchestrator) on a tiny model.

Anvil, the local store, SQLite, a coordinator, three workers (one forging its rewards) and a
verifier checking every commit: the forger is detected, slashed and jailed; no honest worker is
ever slashed or failed; versions are published and audited; a release is stored. The run is the
session's `short_demo` (tests/integration/conftest.py), which the explorer's browser tests walk too.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from krill.db.models import Commit, Slash, Verdict
from krill.db.session import open_database

pytestmark = pytest.mark.timeout(420)


def test_forger_is_caught_and_honest_work_is_folded(short_demo):
    summary, lines, pages = short_demo.summary, short_demo.lines, short_demo.pages

    assert summary["versions"] >= 2, lines
    by_behavior = {w["behavior"]: [] for w in summary["workers"]}
    for w in summary["workers"]:
        by_behavior[w["behavior"]].append(w)
    (forger,) = by_behavior["forge-rewards"]
    assert forger["slashed"] >= 1 and forger["jailed"]
    for honest in by_behavior["honest"]:
        assert honest["slashed"] == 0 and not honest["jailed"] and honest["accepted"] > 0
    assert summary["release_cid"].startswith("baf")
    assert "<svg" in pages[""] and forger["address"] in pages["api/participants"]
    assert summary["verifications"]["failed"] >= 1

    with open_database(f"sqlite:///{short_demo.workdir / 'krill.db'}") as db, db.session() as s:
        failed_workers = set(s.scalars(select(Commit.worker).join(Verdict, Verdict.commit_id == Commit.commit_id)
                                       .where(Verdict.ok.is_(False))))
        slashed_workers = set(s.scalars(select(Slash.worker)))
    assert failed_workers == {forger["address"]} and slashed_workers == {forger["address"]}

    # The demo audits every version from chain + store (audit_last covers them all) before its chain stops.
    assert summary["audit"]["ok"] is True, summary["audit"]
    assert summary["audit"]["versions"] == list(range(1, summary["versions"] + 1))
