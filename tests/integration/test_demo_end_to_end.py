"""The whole protocol as separate processes (the demo's orchestrator) on a tiny model.

Anvil, the local store, SQLite, a coordinator, three workers (one forging its rewards) and a
verifier checking every commit: the forger is detected, slashed and jailed; no honest worker is
ever slashed or failed; versions are published and audited; a release is stored.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from krill.db.models import Commit, Slash, Verdict
from krill.db.session import open_database
from krill.demo.orchestrate import DemoConfig, run_demo
from krill.model.build import TinyModelSpec, build_tiny_model

pytestmark = pytest.mark.timeout(420)


def test_forger_is_caught_and_honest_work_is_folded(tmp_path):
    model_dir = tmp_path / "tiny"
    build_tiny_model(seed=1, spec=TinyModelSpec(hidden=32, layers=2, heads=2, intermediate=64), directory=model_dir)
    config = DemoConfig(workers=3, adversaries=1, verifiers=1, minutes=1.0, versions=200, shards=2, eval_every=5,
                        model_dir=model_dir, release_eval_n=50, audit_last=1000,
                        spec_overrides={"chain": {"check_probability_ppm": 1_000_000, "attestation_quorum": 1},
                                        "version": {"contributions": 2, "deadline_s": 5.0}, "eval_n": 50})
    lines: list[str] = []
    pages: dict[str, str] = {}

    def fetch_explorer(summary: dict) -> None:  # the explorer still serves the finished run here
        import urllib.request

        for path in ("", "api/participants"):
            with urllib.request.urlopen(summary["explorer"] + path, timeout=10) as response:
                pages[path] = response.read().decode()

    summary = run_demo(config, tmp_path / "demo", echo=lines.append, on_summary=fetch_explorer)

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

    with open_database(f"sqlite:///{tmp_path / 'demo' / 'krill.db'}") as db, db.session() as s:
        failed_workers = set(s.scalars(select(Commit.worker).join(Verdict, Verdict.commit_id == Commit.commit_id)
                                       .where(Verdict.ok.is_(False))))
        slashed_workers = set(s.scalars(select(Slash.worker)))
    assert failed_workers == {forger["address"]} and slashed_workers == {forger["address"]}

    # The demo audits every version from chain + store (audit_last covers them all) before its chain stops.
    assert summary["audit"]["ok"] is True, summary["audit"]
    assert summary["audit"]["versions"] == list(range(1, summary["versions"] + 1))
