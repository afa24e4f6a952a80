"""Every attack of the worker's fault enum, run by the real worker code path against a real chain.

Each attacker is a fresh staked account whose `Contributor` runs with one strategy. Then the
coordinator's ingest decides its commit, a verifier checking every commit replays it, and a
failing verdict is slashed. The claim: every attack is refused by the contract, or rejected by
the coordinator before it could be folded, or failed by the verifier at the expected check and
slashed (its author jailed, so nothing of it counts later). Honest work passes everything.
The run uses the default base model, so rewards vary within groups and gradients are non-zero.

Not here: `stale-behaviour` and `too-stale-version` need published versions to lie about (this
run stays at version 0); the detection benchmark runs them through the whole protocol.
"""

from __future__ import annotations

import time

import pytest
from nacl.signing import SigningKey
from verifier_env import ADMIN, VERIFIER, WORKER_A, drive, make_loop, start_run_env, verdict

from krill.chain.deploy import TOKEN
from krill.chain.events import Committed
from krill.chain.types import Role
from krill.db.models import ContributionStatus, RejectionCode
from krill.protocol.spec import RolloutSpec
from krill.verifier.select import unavailable_after

# strategy -> (coordinator's ingest decision, the verifier's failing check)
EXPECTED = {
    "honest": (None, None),
    "forge-rewards": (RejectionCode.WRONG_REWARDS, "rewards"),
    "cherry-pick": (RejectionCode.WRONG_ASSIGNMENT, "assignment"),
    "copycat": (RejectionCode.WRONG_ASSIGNMENT, "assignment"),
    "foreign-signature": (RejectionCode.UNKNOWN_KEY, "signature"),
    "forged-signature": (RejectionCode.BAD_SIGNATURE, "signature"),
    "withhold": (RejectionCode.UNAVAILABLE, "unavailable"),
    "fabricate-rollouts": (None, "resample"),
    "lazy": (None, "resample"),
    "sign-flip": (None, "gradient"),
    "scale": (None, "gradient"),
    "noise": (None, "gradient"),
    "alie": (None, "gradient"),
    "ipm": (None, "gradient"),
    "mimic": (None, "gradient"),
    "future-version": ("contract", None),
}
FIRST_ATTACKER = 6


@pytest.fixture(scope="module")
def attack_env(tmp_path_factory):
    from krill.model.base import ensure_base_model

    # The default base model (built once, cached): it solves some prompts, so groups have
    # advantages and honest gradients are non-zero; on an untrained model every gradient attack
    # would attack a zero gradient and change nothing.
    env = start_run_env(tmp_path_factory, "attacks", accounts=FIRST_ATTACKER + len(EXPECTED),
                        model_dir=ensure_base_model(), rollout=RolloutSpec(prompts_per_contribution=8, group_size=8))
    env.produce(WORKER_A)  # an honest commit for the copycat and the mimic to copy
    yield env
    env.anvil.stop()


def _attacker(env, index: int):
    key = SigningKey(bytes([index + 1]) * 32)
    env.keys[index] = key
    env.at(ADMIN).token.mint(env.address(index), 1_000 * TOKEN)
    chain = env.at(index)
    chain.approve_stake(200 * TOKEN)
    chain.stake(Role.WORKER, 200 * TOKEN, bytes(key.verify_key))
    return chain, key


def _contribute(env, index: int, behavior: str, tmp_path):
    from krill.protocol.work import Identity
    from krill.worker.backoff import Backoff
    from krill.worker.behaviors import get_behavior
    from krill.worker.contribute import Contributor
    from krill.worker.nonce_state import WorkerState
    from krill.worker.source import RunSource

    chain, key = _attacker(env, index)
    address = env.address(index).lower()
    lines: list[str] = []
    state = WorkerState.open(tmp_path / "worker", env.spec.run_id, address)
    who = Identity(env.w3.eth.chain_id, env.protocol, address, key)
    contributor = Contributor(chain, env.store, env.spec, RunSource(chain, env.store, env.spec), who,
                              get_behavior(behavior), [0, 1], state, Backoff(0.05, 0.5, lines.append), lines.append)
    return contributor.contribute()


def _ingest(env, commit_id: int, now: float):
    from krill.coordinator.context import RunContext
    from krill.coordinator.ingest import CommitView, examine

    admin = env.at(ADMIN)
    info = admin.commit_of(commit_id)
    key = admin.stake_of(info.worker).ed25519_public_key
    ctx = RunContext(chain=admin, store=env.store, db=None, spec=env.spec, chain_id=int(env.w3.eth.chain_id))
    block_time = int(env.w3.eth.get_block(info.commit_block)["timestamp"])
    view = CommitView(commit_id, info.worker.lower(), int(info.version), info.header_digest.hex(),
                      key.hex() if isinstance(key, bytes) else key, block_time, False, int(info.nonce))
    return examine(ctx, view, next_version=int(info.version) + 1, now=now)


@pytest.mark.parametrize("behavior", sorted(EXPECTED))
def test_each_attack_is_refused_rejected_or_slashed(attack_env, tmp_path, behavior):
    env = attack_env
    index = FIRST_ATTACKER + sorted(EXPECTED).index(behavior)
    coordinator_code, failed_check = EXPECTED[behavior]
    start = env.head()
    outcome = _contribute(env, index, behavior, tmp_path)

    if coordinator_code == "contract":
        assert outcome.status == "stale" and outcome.commit_id is None, outcome
        assert "CommitVersionFromFuture" in outcome.detail
        mine = [e for e in env.at(ADMIN).events(start, kinds=(Committed,)) if e.worker.lower() == env.address(index).lower()]
        assert mine == []  # nothing on chain: nothing to fold, nothing to check
        return
    assert outcome.status == "committed", outcome
    commit_id = outcome.commit_id

    # The coordinator's ingest: cheap checks reject before anything can be folded.
    late = time.time() + env.spec.version.deadline_s + 5 if behavior == "withhold" else time.time()
    decision = _ingest(env, commit_id, late)
    if coordinator_code is None:
        assert decision.status == ContributionStatus.ACCEPTED, decision.reason
    else:
        assert decision.status == ContributionStatus.REJECTED and decision.code == coordinator_code, decision

    # A verifier checking every commit.
    lines: list[str] = []
    loop = make_loop(env, tmp_path / "verifier.sqlite", start, lines)
    if behavior == "withhold":
        commit_block = env.at(VERIFIER).commit_of(commit_id).commit_block
        env.mine(max(0, unavailable_after(commit_block, env.spec.chain.challenge_window_blocks) - env.head()))
    drive(env, loop, [commit_id])
    evidence = verdict(env, loop, commit_id)
    if failed_check is None:
        assert evidence.ok, evidence.checks
        return
    assert not evidence.ok and evidence.reason == failed_check, (evidence.reason, evidence.checks)

    # The failing verdict is slashed on-chain and jails the author: none of its later work counts.
    env.at(ADMIN).slash(commit_id)
    assert env.at(ADMIN).stake_of(env.address(index)).jailed
