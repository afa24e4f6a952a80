"""An `unavailable` verdict against the contract's own window, on a run whose challenge window is 8 blocks:
blocks are mined by hand, one per pass of the verifier, so the deadline is exact."""

from __future__ import annotations

import threading

import pytest
from verifier_env import WORKER_A, make_loop, start_run_env, verdict

from krill.protocol.spec import ChainSpec
from krill.store.cid import digest_to_cid
from krill.verifier import select
from krill.verifier.state import PENDING

WINDOW = 8


@pytest.fixture(scope="module")
def small_window_env(tmp_path_factory):
    env = start_run_env(tmp_path_factory, "attest-deadline", chain_spec=ChainSpec(
        check_probability_ppm=1_000_000, challenge_window_blocks=WINDOW, attestation_quorum=1))
    yield env
    env.anvil.stop()


def test_a_payload_whose_fetch_never_ends_is_attested_unavailable_with_a_block_to_spare(small_window_env, tmp_path,
                                                                                       monkeypatch):
    """The worker's header is in no store that answers (its fetch never ends), and the evidence upload takes
    a block's time (another transaction is mined meanwhile). `still_fetching_until` was the window's last
    block but one on a window under 16 blocks: the attestation decided there was mined a block past the
    window, the contract refused it and the commit ended `missed`; decided two blocks before the close,
    it lands in the window's last block."""
    import krill.store.fetcher as fetcher_module

    monkeypatch.setattr(fetcher_module, "PASS_WAIT_S", 0.05)
    env, lines = small_window_env, []
    start = env.head()
    commit_id, _ = env.produce(WORKER_A)
    commit_block = env.at(WORKER_A).commit_of(commit_id).commit_block
    header_cid = digest_to_cid(env.at(WORKER_A).commit_of(commit_id).header_digest)
    release, get, put_block = threading.Event(), env.store.get, env.store.put_block

    def hanging_get(cid, **kwargs):
        if cid == header_cid:
            release.wait(30)
        return get(cid, **kwargs)

    def slow_upload(data, pin=False):
        env.mine(1)
        return put_block(data, pin=pin)

    monkeypatch.setattr(env.store, "get", hanging_get)
    monkeypatch.setattr(env.store, "put_block", slow_upload)
    loop = make_loop(env, tmp_path / "state.sqlite", start, lines)
    loop.poll_events()
    try:
        while loop.state.decision(commit_id).status == PENDING and env.head() <= commit_block + WINDOW:
            loop._retry_at.clear()  # the verifier looks at every block
            loop.step()
            env.mine(1)
    finally:
        release.set()
    evidence = verdict(env, loop, commit_id)
    assert not evidence.ok and evidence.reason == "unavailable", evidence
    assert "still being fetched" in evidence.checks[0].detail
    assert select.still_fetching_until(commit_block, WINDOW) <= commit_block + WINDOW - 2


def test_a_verifier_resumed_after_the_randomness_block_expired_says_it_missed_the_commit(tmp_path_factory, tmp_path):
    """A window longer than the 256 blocks whose hashes the EVM keeps: a verifier that sleeps (a laptop's lid
    closed) past that many blocks after a commit it is drawn for can no longer seal the commit's randomness,
    inside the window. It records the commit as missed, and says so (it said nothing)."""
    from verifier_env import make_loop as loop_of

    from krill.verifier.state import MISSED

    env = start_run_env(tmp_path_factory, "randomness-expired", chain_spec=ChainSpec(
        check_probability_ppm=1_000_000, challenge_window_blocks=400, attestation_quorum=1), unbonding_blocks=500)
    try:
        start = env.head()
        commit_id, _ = env.produce(WORKER_A)
        env.mine(260)  # the hash of the block after the commit is gone; the window is still open
        lines: list[str] = []
        loop = loop_of(env, tmp_path / "state.sqlite", start, lines)
        loop.step()
        decision = loop.state.decision(commit_id)
        assert decision.status == MISSED and "randomness block expired" in decision.reason, decision
        said = [line for line in lines if line.startswith(f"commit {commit_id} ")]
        assert len(said) == 1 and "MISSED" in said[0] and "expired" in said[0], lines
    finally:
        env.anvil.stop()
