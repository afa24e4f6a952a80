"""`adopt_published` on both backends: a coordinator on a new database marks what the published versions of
its staleness window folded or named, however many commits their records name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from krill.coordinator.adopt import adopt_published
from krill.coordinator.journal import ensure_tables
from krill.db.models import Commit, Contribution, ContributionStatus, RejectionCode, Run

RUN = "ab" * 32
WORKER = "0x" + "22" * 20


def _ctx(db, window: int, records: dict[int, SimpleNamespace]):
    chain = SimpleNamespace(version_of=lambda run_id, v: SimpleNamespace(record_digest=v, settled=True))
    spec = SimpleNamespace(staleness=SimpleNamespace(max_staleness=window), chain=SimpleNamespace(max_staleness=0))
    return SimpleNamespace(db=db, run_hex=RUN, run_id=bytes.fromhex(RUN), chain=chain, store=records, spec=spec)


class _Entry(SimpleNamespace):
    def model_dump(self, mode: str = "python") -> dict:
        return dict(vars(self))


def _accepted(commit_id: int, version: int) -> _Entry:
    return _Entry(commit_id=commit_id, worker=WORKER, model_version=version - 1, weight="0.5", trust="0.5",
                  staleness=0)


def _rejected(commit_id: int) -> _Entry:
    return _Entry(commit_id=commit_id, worker=WORKER, reason_code="stale", reason="too old")


def test_adoption_of_records_naming_more_commits_than_one_query_can_bind(db, monkeypatch):
    """700 missing versions (S_max may be 1000), each record naming 100 rejections (its cap): 70 000 commit ids,
    more than PostgreSQL's 65 535 bind parameters, which the index lookup of the named commits used to bind in
    one query, so such a coordinator could not start on PostgreSQL."""
    versions = 700
    records = {v: SimpleNamespace(accepted=[_accepted(10**6 + v, v)],
                                  rejected=[_rejected(v * 1000 + i) for i in range(100)])
               for v in range(1, versions + 1)}
    monkeypatch.setattr("krill.protocol.record.load_record", lambda store, digest: store[digest])
    ensure_tables(db)
    with db.write() as s:
        s.add(Run(run_id=RUN, coordinator=WORKER, base_manifest_digest="cd" * 32, max_staleness=versions,
                  attestation_quorum=1, slash_fraction_bps=1, verifier_bounty_bps=1, check_probability_ppm=1,
                  challenge_window_blocks=1, reward_per_version=1, reward_pool=0, funded_total=0,
                  latest_version=versions, created_block=1, created_tx="0x" + "ee" * 32))
        for commit_id in (1000, versions * 1000 + 99):  # named by the first and by the last record
            s.add(Commit(commit_id=commit_id, run_id=RUN, worker=WORKER, version=0, nonce=commit_id,
                         header_digest=f"{commit_id:064x}", header_cid="bafkrei", block_number=1,
                         tx_hash="0x" + "ee" * 32, pass_count=0, fail_count=0, slashed=False))
    assert adopt_published(_ctx(db, versions, records), versions) == list(range(1, versions + 1))
    with db.session() as s:
        first, last = s.get(Contribution, 1000), s.get(Contribution, versions * 1000 + 99)
        assert (first.status, first.reason_code, first.aggregated_version) == (
            ContributionStatus.REJECTED, RejectionCode.STALE, 1)
        assert (last.status, last.aggregated_version) == (ContributionStatus.REJECTED, versions)
        accepted = s.get(Contribution, 10**6 + versions)
        assert (accepted.status, accepted.weight, accepted.aggregated_version) == (
            ContributionStatus.ACCEPTED, pytest.approx(0.5), versions)
        assert s.get(Contribution, 1001) is None  # a rejected commit the index lacks is ingested again later
