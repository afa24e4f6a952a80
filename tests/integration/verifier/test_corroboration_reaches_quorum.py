"""Corroboration on a real chain: at quorum 2 with two verifiers, a forged commit that the draw gives to
only one of them is still slashed, because the other replays what the first attested as failing."""

from __future__ import annotations

import pytest
from verifier_env import ADMIN, VERIFIER, WINDOW, WORKER_A, drive, make_loop, start_run_env

from krill.chain import errors as E
from krill.chain.deploy import TOKEN
from krill.chain.events import Slashed
from krill.chain.types import Role
from krill.protocol.evidence import load_evidence
from krill.protocol.spec import ChainSpec
from krill.store.cid import digest_to_cid
from krill.verifier import select
from krill.verifier.state import ATTESTED, CORROBORATING, SELECTED

SECOND = 5  # a second verifier account (the run env stakes VERIFIER only)
PPM = 500_000  # each commit selects each verifier with probability 1/2


@pytest.fixture(scope="module")
def quorum_env(tmp_path_factory):
    spec = ChainSpec(check_probability_ppm=PPM, challenge_window_blocks=WINDOW, attestation_quorum=2)
    env = start_run_env(tmp_path_factory, "verifier-corroborate", chain_spec=spec)
    try:
        second = env.at(SECOND)
        second.approve_stake(200 * TOKEN)
        second.stake(Role.VERIFIER, 200 * TOKEN, bytes(env.keys[SECOND].verify_key))
        yield env
    finally:
        env.anvil.stop()


def _forged_commit_drawn_by_one(env) -> tuple[int, int, int]:
    """Forge commits until the draw selects exactly one of the two verifiers (1/2 a try); returns
    (commit id, its block, the verifier drawn)."""
    admin = env.at(ADMIN)
    for _ in range(30):  # all 30 miss with probability 2^-30
        commit_id, _ = env.produce(WORKER_A, tamper="rewards")
        block = admin.commit_of(commit_id).commit_block
        env.mine(1)
        hashed = admin.block_hash(block + 1)
        drawn = [v for v in (VERIFIER, SECOND) if select.drawn(hashed, commit_id, bytes(env.keys[v].verify_key), PPM)]
        if len(drawn) == 1:
            return commit_id, block, drawn[0]
    raise AssertionError("no commit was drawn by exactly one verifier in 30 tries")


def test_a_forgery_drawn_by_one_verifier_is_slashed_at_quorum_two(quorum_env, tmp_path):
    env, admin = quorum_env, quorum_env.at(ADMIN)
    commit_id, block, drawn = _forged_commit_drawn_by_one(env)
    other = SECOND if drawn == VERIFIER else VERIFIER
    lines = {drawn: [], other: []}
    loops = {v: make_loop(env, tmp_path / f"verifier-{v}.sqlite", block, lines[v], verifier=v) for v in lines}

    drive(env, loops[drawn], [commit_id])
    first = loops[drawn].state.decision(commit_id)
    assert (first.status, first.ok, first.origin) == (ATTESTED, False, SELECTED), lines[drawn]
    assert admin.commit_of(commit_id).fail_count == 1
    with pytest.raises(E.SlashQuorumNotReached):  # one failing verdict: what a slash needed to be drawn twice
        admin.slash(commit_id)

    drive(env, loops[other], [commit_id])
    second = loops[other].state.decision(commit_id)
    assert (second.status, second.ok, second.origin) == (ATTESTED, False, CORROBORATING), lines[other]
    assert second.corroborates == env.address(drawn).lower()
    assert any("replaying it to corroborate" in line for line in lines[other]), lines[other]
    onchain = admin.attestation_of(commit_id, env.address(other))
    evidence = load_evidence(env.store, digest_to_cid(onchain.evidence_digest))
    assert (evidence.ok, evidence.reason, evidence.verifier) == (False, "rewards", env.address(other).lower())
    assert admin.commit_of(commit_id).fail_count == 2
    assert loops[other].state.counts()["corroborated"] == 1

    slashed = admin.slash(commit_id).event(Slashed)
    assert slashed.worker == env.address(WORKER_A) and slashed.amount > 0
    assert admin.stake_of(env.address(WORKER_A)).jailed
    assert admin.claimable_of(env.address(drawn)) > 0 and admin.claimable_of(env.address(other)) > 0
    for loop in loops.values():
        loop.state.close()
