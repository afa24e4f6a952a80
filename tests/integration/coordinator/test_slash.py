"""Slashing: a quorum of failing attestations gets the commit slashed once, and the worker jailed and excluded."""

from __future__ import annotations

import hashlib

from krill.db.models import Contribution, ContributionStatus, RejectionCode


def test_failing_quorum_slashes_jails_and_excludes_the_worker(coordinator_env):
    from krill.coordinator.loop import Coordinator, LoopOptions

    env = coordinator_env()
    (honest, w_honest), (cheat, w_cheat) = env.stake(1), env.stake(2)
    verifier, _ = env.stake(10)
    commits = {}
    for name, account, who, nonce in (("honest", honest, w_honest, 0), ("bad", cheat, w_cheat, 0),
                                      ("later", cheat, w_cheat, 1)):
        header, files = env.produce(who, nonce=nonce)
        env.upload(header, files)
        commits[name] = env.commit(account, header)
    v = env.chain.as_account(verifier)
    v.attest(commits["honest"], True, hashlib.sha256(b"evidence ok").digest())
    v.attest(commits["bad"], False, hashlib.sha256(b"evidence rewards differ").digest())

    ctx, indexer = env.context()
    lines: list[str] = []
    coordinator = Coordinator(ctx, indexer, LoopOptions(eval_every=0), echo=lines.append)
    assert coordinator.step() == []  # one eligible contribution: K = 2 not reached
    assert env.chain.commit_of(commits["bad"]).slashed
    assert env.chain.stake_of(cheat.address).jailed
    assert not env.chain.stake_of(honest.address).jailed and not env.chain.commit_of(commits["honest"]).slashed
    assert env.chain.claimable_of(verifier.address) > 0  # the failing verifier's bounty
    assert any(line.startswith(f"slashed commit {commits['bad']}") for line in lines), lines

    with ctx.db.session() as s:
        rows = {name: s.get(Contribution, cid) for name, cid in commits.items()}
    assert rows["honest"].status == ContributionStatus.ACCEPTED and rows["honest"].aggregated_version is None
    for name in ("bad", "later"):
        assert (rows[name].status, rows[name].reason_code) == (ContributionStatus.REJECTED, RejectionCode.JAILED)

    # Another pass: nothing is slashed twice, nothing crashes.
    lines.clear()
    assert coordinator.step() == []
    assert not any("slash" in line for line in lines), lines
