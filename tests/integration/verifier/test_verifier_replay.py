"""The verifier loop against a real chain and store: honest work passes, each forgery fails at its check."""

from __future__ import annotations

import hashlib
import time

import pytest
from verifier_env import VERIFIER, WINDOW, WORKER_A, WORKER_B, drive, make_loop, verdict

from krill.chain.events import Committed
from krill.verifier.attest import Who
from krill.verifier.loop import LoopSettings, VerifierLoop
from krill.verifier.select import unavailable_after
from krill.verifier.state import ATTESTED, PENDING, SKIPPED, VerifierState

CHECKS = ["signature", "payload", "assignment", "rewards", "resample", "gradient"]


def test_honest_contributions_pass_every_check(run_env, tmp_path):
    env, lines = run_env, []
    start = env.head()
    ids = [env.produce(worker)[0] for worker in (WORKER_A, WORKER_A, WORKER_B)]
    loop = make_loop(env, tmp_path / "state.sqlite", start, lines)
    drive(env, loop, ids)
    for commit_id in ids:
        evidence = verdict(env, loop, commit_id)
        assert evidence.ok and evidence.reason == "passed", evidence.checks
        assert [c.name for c in evidence.checks] == CHECKS
        assert evidence.gradient_shard in (0, 1)
        resample = next(c for c in evidence.checks if c.name == "resample")
        assert resample.figures["token_mismatches"] == 0
    assert sum("PASS" in line for line in lines) == 3, lines
    assert loop.replayer.policies.loads == 1  # one model for version 0, reused for every replay
    loaded = [c.name for i in ids for c in verdict(env, loop, i).checks if "model_load_ms" in c.figures]
    assert loaded == ["resample"]  # the first replay's resample loaded it, and said so in its evidence


def test_a_warmed_up_verifier_loads_no_model_during_its_checks(run_env, tmp_path):
    """`Replayer.warm_up` builds the latest version's model (and loads tokenizer, task and masks)
    before any commit is drawn, so the first check does not pay for it on the cores a run's
    workers share; the check then says no model load in its evidence."""
    env, lines = run_env, []
    start = env.head()
    loop = make_loop(env, tmp_path / "state.sqlite", start, lines)
    policies = loop.replayer.policies
    assert policies.loads == 0
    assert loop.replayer.warm_up() > 0
    assert policies.loads == 1 and policies._tokenizer is not None and policies._task is not None
    commit_id = env.produce(WORKER_A)[0]
    drive(env, loop, [commit_id])
    evidence = verdict(env, loop, commit_id)
    assert evidence.ok, evidence.checks
    assert policies.loads == 1
    assert not [c.name for c in evidence.checks if "model_load_ms" in c.figures]


def test_a_commit_the_draw_passes_over_is_skipped_without_sealing(run_env, tmp_path, monkeypatch):
    """The draw is computed on the block hash before anything is sent: a commit it does not select
    costs this verifier no transaction, and its randomness stays unsealed. (The run checks every
    commit; the draw is taken here at 1 ppm, as a run with a rare check would have it.)"""
    from krill.verifier import select

    real, seen = select.drawn, []

    def rare(randomness, commit_id, key, ppm):
        seen.append((randomness, commit_id))
        return real(randomness, commit_id, key, 1)

    monkeypatch.setattr(select, "drawn", rare)
    env, lines = run_env, []
    start = env.head()
    commit_id = env.produce(WORKER_A)[0]
    loop = make_loop(env, tmp_path / "state.sqlite", start, lines)
    drive(env, loop, [commit_id])
    decision = loop.state.decision(commit_id)
    assert decision.status == SKIPPED and "not sealed" in decision.reason, decision
    block = env.at(VERIFIER).commit_of(commit_id).commit_block
    assert seen == [(env.at(VERIFIER).block_hash(block + 1), commit_id)]
    assert env.at(VERIFIER).randomness_of(commit_id) == b"\x00" * 32
    assert not env.at(VERIFIER).attestation_of(commit_id, env.address(VERIFIER)).exists


def test_commits_the_draw_passes_over_share_one_head_read_per_pass(run_env, tmp_path, monkeypatch):
    """Three commits skipped in one pass cost one read of the head, and one read of each randomness
    block (the block after each commit), not one of each per commit."""
    from krill.verifier import select

    real = select.drawn
    monkeypatch.setattr(select, "drawn", lambda randomness, commit_id, key, ppm: real(randomness, commit_id, key, 1))
    env, lines = run_env, []
    start = env.head()
    ids = [env.produce(worker)[0] for worker in (WORKER_A, WORKER_B, WORKER_A)]
    env.mine(1)  # the last commit's randomness block
    loop = make_loop(env, tmp_path / "state.sqlite", start, lines)
    calls: list[tuple] = []
    chain = loop.chain
    for name in ("block_number", "block_hash"):
        method = getattr(chain, name)
        monkeypatch.setattr(chain, name, lambda *a, _m=method, _n=name: calls.append((_n, *a)) or _m(*a))
    loop.step()
    assert [loop.state.decision(c).status for c in ids] == [SKIPPED] * 3
    blocks = sorted({env.at(VERIFIER).commit_of(c).commit_block + 1 for c in ids})
    assert [c for c in calls if c[0] == "block_number"] == [("block_number",)], calls
    assert sorted(c[1] for c in calls if c[0] == "block_hash") == blocks


@pytest.mark.parametrize(("tamper", "failed", "field"), [
    ("signature", "signature", "header.ed25519_key"),
    ("rewards", "rewards", None),
    ("fabricate", "resample", None),
    ("gradient", "gradient", None),
])
def test_each_forgery_fails_at_its_check(run_env, tmp_path, tamper, failed, field):
    env, lines = run_env, []
    start = env.head()
    commit_id, _ = env.produce(WORKER_B, tamper=tamper)
    loop = make_loop(env, tmp_path / "state.sqlite", start, lines)
    drive(env, loop, [commit_id])
    evidence = verdict(env, loop, commit_id)
    assert not evidence.ok and evidence.reason == failed
    names = [c.name for c in evidence.checks]
    assert names == CHECKS[:CHECKS.index(failed) + 1]  # cheapest first, stops at the first failure
    assert all(c.ok for c in evidence.checks[:-1]) and not evidence.checks[-1].ok
    assert evidence.failed_field == field
    assert any(f"FAIL at {failed}" in line for line in lines), lines


def test_withheld_payload_is_attested_unavailable_near_the_window_end(run_env, tmp_path):
    env, lines = run_env, []
    start = env.head()
    commit_id, _ = env.produce(WORKER_A, tamper="withhold")
    commit_block = env.at(VERIFIER).commit_of(commit_id).commit_block
    loop = make_loop(env, tmp_path / "state.sqlite", start, lines)
    env.mine(2)
    loop.step()
    assert loop.state.decision(commit_id).status == PENDING  # still retrying, not yet judged
    assert any("waiting" in line for line in lines), lines
    env.mine(unavailable_after(commit_block, WINDOW) - env.head())
    time.sleep(LoopSettings().payload_retry_s * 4)
    drive(env, loop, [commit_id])
    evidence = verdict(env, loop, commit_id)
    assert not evidence.ok and evidence.reason == "unavailable"
    assert [c.name for c in evidence.checks] == ["availability"]


def test_a_payload_the_store_holds_does_not_hold_the_verifier(run_env, tmp_path):
    """On a networked store a fetch of content nobody has waits out the store's timeout. A drawn commit of
    junk holds one fetch thread (its worker's lane), and the verifier checks the commits after it
    meanwhile instead of waiting for the store on every retry."""
    import threading

    from krill.errors import ContentNotFoundError
    from krill.store.cid import digest_to_cid

    env, lines = run_env, []
    start = env.head()
    junk_id, _ = env.produce(WORKER_A, tamper="withhold")
    honest_id = env.produce(WORKER_B)[0]
    loop = make_loop(env, tmp_path / "state.sqlite", start, lines)
    junk_cid = digest_to_cid(env.at(VERIFIER).commit_of(junk_id).header_digest)
    release, started, ended, store = threading.Event(), [], [], loop.replayer.store
    get = store.get

    def networked_get(cid, **kwargs):
        if cid == junk_cid:
            started.append(cid)
            # The store looking for content nobody has, until its timeout: here until the test ends. A stand-in
            # timeout of 8 s ran out while a loaded machine still drove the honest commit (16 s with each fetch
            # starting 1 s late), and the retry fetched the junk again: started == [cid, cid].
            release.wait(120)
            ended.append(cid)
            raise ContentNotFoundError(f"the store found no {cid} within its timeout")
        return get(cid, **kwargs)

    store.get = networked_get
    try:
        drive(env, loop, [honest_id])
        assert verdict(env, loop, honest_id).ok
        assert (started, ended) == ([junk_cid], [])  # checked while the junk fetch was still running
        assert loop.state.decision(junk_id).status == PENDING
        assert any("still being fetched" in line for line in lines), lines
    finally:
        release.set()


def test_work_between_fetches_does_not_use_up_the_replays_fetch_wait(run_env, tmp_path, monkeypatch):
    """A replay's fetches share one wait allowance (`wait_s`), and only the waiting draws on it. Counted from
    the replay's start, a version's masks loaded before the payload fetches (4 s here: a larger model's; or
    a slow check on a loaded machine) used up a 3 s allowance, and a payload on the verifier's own store
    raised PayloadStillFetching, which the loop attests as unavailable from `still_fetching_until` on."""
    from krill.verifier.replay import Policies, Replayer
    from krill.verifier.state import Job

    env, lines = run_env, []
    start = env.head()
    commit_id = env.produce(WORKER_A)[0]
    loop = make_loop(env, tmp_path / "state.sqlite", start, lines)
    drive(env, loop, [commit_id])  # seals the commit's randomness
    commit = env.at(VERIFIER).commit_of(commit_id)
    job = Job(commit_id, commit.worker, commit.version, commit.nonce, commit.header_digest, commit.commit_block)
    grad_lengths = Policies.grad_lengths

    def slow_grad_lengths(self, version):
        time.sleep(4.0)  # the version's masks, loaded between the header's fetch and the payload's
        return grad_lengths(self, version)

    monkeypatch.setattr(Policies, "grad_lengths", slow_grad_lengths)
    r = loop.replayer
    result = Replayer(r.chain, r.store, r.spec, r.verifier_key, r.chain_id).replay(
        job, env.at(VERIFIER).randomness_of(commit_id), wait_s=3.0)  # the fetches' own waits: ample, loaded or not
    assert result.ok and result.reason == "passed", result


def test_a_restart_after_an_unrecorded_attestation_does_not_attest_again(run_env, tmp_path):
    env, lines = run_env, []
    start = env.head()
    commit_id, _ = env.produce(WORKER_A)
    path = tmp_path / "state.sqlite"
    loop = make_loop(env, path, start, lines)
    drive(env, loop, [commit_id])
    assert loop.attested == 1
    # Crash between the mined attestation and the state update: the row is pending again.
    loop.state._db.execute("UPDATE commits SET status = 'pending' WHERE commit_id = ?", (commit_id,))
    loop.state.close()
    again = make_loop(env, path, start, lines)
    drive(env, again, [commit_id])
    assert again.attested == 0
    decision = again.state.decision(commit_id)
    assert decision.status == ATTESTED and decision.ok and decision.reason == "found on chain (earlier run)"
    attested = [e for e in env.at(VERIFIER).events(start) if type(e).__name__ == "Attested"
                and e.commit_id == commit_id]
    assert len(attested) == 1


def test_garbage_at_the_committed_digest_fails_at_the_header_without_crashing(run_env, tmp_path):
    env, lines = run_env, []
    start = env.head()
    garbage = b'{"protocol":1,"worker":' + b"[" * 40
    env.store.put_block(garbage)
    nonce = env.next_nonce(WORKER_B)
    receipt = env.at(WORKER_B).commit(env.spec.run_id, 0, nonce, hashlib.sha256(garbage).digest())
    commit_id = receipt.event(Committed).commit_id
    loop = make_loop(env, tmp_path / "state.sqlite", start, lines)
    drive(env, loop, [commit_id])
    evidence = verdict(env, loop, commit_id)
    assert not evidence.ok and evidence.reason == "signature" and evidence.failed_field.startswith("header")


def test_an_unreachable_chain_is_retried_with_capped_backoff(run_env, tmp_path):
    from krill.chain.anvil import free_port
    from krill.chain.client import KrillChain
    from krill.chain.rpc import RetryPolicy, connect_http

    env, lines = run_env, []
    dead = KrillChain(connect_http(f"http://127.0.0.1:{free_port()}", timeout_s=1.0), env.protocol,
                      env.accounts[VERIFIER], RetryPolicy(attempts=1))
    state = VerifierState(tmp_path / "state.sqlite", contract=env.protocol, run_id=env.spec.run_id,
                          verifier=env.address(VERIFIER))
    state.add_jobs([], next_block=1)  # a cursor exists: nothing needs the chain before the loop
    who = Who(31337, env.protocol, env.address(VERIFIER), bytes(env.keys[VERIFIER].verify_key), "hf-torch")
    loop = VerifierLoop(dead, env.store, env.spec, state, who,
                        LoopSettings(poll_interval_s=0.05, max_backoff_s=0.2), echo=lines.append)
    loop.run(should_stop=lambda: len(lines) >= 5)
    assert all(line.startswith("unreachable (ChainUnavailableError") for line in lines), lines
    assert [line.rsplit("retrying in ", 1)[1] for line in lines] == ["0.05s", "0.10s", "0.20s", "0.20s", "0.20s"]


def test_a_named_shard_never_replaces_the_drawn_one(run_env, tmp_path):
    """A verifier colluding with the worker fails the commit first, naming the honest shard: the replay still
    recomputes this verifier's drawn shard, the forged one, after the named one."""
    from krill.verifier import select

    env, lines = run_env, []
    start, admin, key = env.head(), env.at(VERIFIER), bytes(env.keys[VERIFIER].verify_key)
    for _ in range(30):  # the draw picks shard 0 with probability 1/2 a try
        commit_id, header = env.produce(WORKER_B, tamper="gradient-shard-0")
        env.mine(1)
        randomness = admin.block_hash(admin.commit_of(commit_id).commit_block + 1)
        if select.gradient_shard(randomness, commit_id, key, [0, 1]) == 0:
            break
    else:
        raise AssertionError("the draw never picked shard 0 in 30 tries")
    loop = make_loop(env, tmp_path / "state.sqlite", start, lines)
    loop.poll_events()
    job = next(j for j in loop.state.pending() if j.commit_id == commit_id)
    steered = loop.replayer.replay(job, randomness, shard=1, wait_s=60.0)  # the fetches' speed is not tested here
    gradients = [(c.ok, c.figures["shard"]) for c in steered.checks if c.name == "gradient"]
    assert gradients == [(True, 1), (False, 0)]  # the named honest shard passes, the drawn forged one fails
    assert (steered.ok, steered.reason, steered.gradient_shard) == (False, "gradient", 0)
    named_is_drawn = loop.replayer.replay(job, randomness, shard=0, wait_s=60.0)
    assert [c.figures["shard"] for c in named_is_drawn.checks if c.name == "gradient"] == [0]
    assert not named_is_drawn.ok
    loop.state.close()
