"""Checks shared by the index tests: the index must say what the contract's own views say."""

from __future__ import annotations

from db_scenario import RUN_ID, Scenario
from sqlalchemy import func, select

from krill.chain.types import ZERO32
from krill.db.models import Commit, FetchStatus, Header, Participant, Run, Slash, Verdict, Version


def assert_index_matches_chain(session, sc: Scenario) -> None:
    chain = sc.chain()
    for account in sc.workers + sc.verifiers:
        row = session.get(Participant, account.address.lower())
        info = chain.stake_of(account.address)
        assert (row.role, row.staked, row.unbonding, row.release_block, row.jailed) == (
            info.role, info.staked, info.unbonding, info.release_block, info.jailed), account.address
        assert row.ed25519_key == info.ed25519_public_key.hex()
        assert row.claimable == chain.claimable_of(account.address), account.address
    assert session.scalar(select(func.count()).select_from(Commit)) == chain.commit_count()
    for commit_id in range(1, chain.commit_count() + 1):
        row, info = session.get(Commit, commit_id), chain.commit_of(commit_id)
        assert (row.worker, row.version, row.nonce, row.header_digest, row.block_number) == (
            info.worker.lower(), info.version, info.nonce, info.header_digest.hex(), info.commit_block)
        assert (row.pass_count, row.fail_count, row.slashed) == (info.pass_count, info.fail_count, info.slashed)
        assert row.randomness == (None if info.randomness == ZERO32 else info.randomness.hex())
    run, info = session.get(Run, RUN_ID.hex()), chain.run_of(RUN_ID)
    assert (run.latest_version, run.reward_pool, run.created_block) == (
        info.latest_version, info.reward_pool, info.created_block)
    for v in range(info.latest_version + 1):
        row, vinfo = session.get(Version, (RUN_ID.hex(), v)), chain.version_of(RUN_ID, v)
        assert (row.manifest_digest, row.published_block, row.settled) == (
            vinfo.manifest_digest.hex(), vinfo.published_block, vinfo.settled)


def assert_scenario_rows(session, sc: Scenario) -> None:
    """The rows the scripted history must produce beyond what the views show."""
    status = {label: session.get(Header, cid).status for label, cid in sc.commits.items()}
    assert status == {"honest": FetchStatus.AVAILABLE, "cheat": FetchStatus.AVAILABLE,
                      "withheld": FetchStatus.UNAVAILABLE, "forged": FetchStatus.INVALID,
                      "contradicting": FetchStatus.INVALID}
    honest = session.get(Header, sc.commits["honest"])
    assert (honest.task, honest.shards, honest.sampling_seed) == ("arithmetic", [0, 1], 2**64 - 1)
    assert "signature" in session.get(Header, sc.commits["forged"]).error
    assert "header.nonce" in session.get(Header, sc.commits["contradicting"]).error
    assert session.scalar(select(func.count()).select_from(Verdict)) == 4
    slash = session.get(Slash, sc.commits["cheat"])
    assert slash.amount == slash.bounty + slash.burned > 0
    w1, w2 = (session.get(Participant, w.address.lower()) for w in sc.workers)
    assert (w1.checks_passed, w1.checks_failed, w2.checks_passed, w2.checks_failed) == (2, 0, 0, 2)
    assert w1.trust > w2.trust
    for version in (0, 1):
        row = session.get(Version, (RUN_ID.hex(), version))
        assert (row.manifest_status, row.num_shards, row.manifest_cid) == (
            FetchStatus.AVAILABLE, 2, sc.manifest_cids[version])
