"""Attestations whose fate is decided after they were sent, on a real Anvil node: a receipt that comes
after the receipt timeout (the retry meets our own transaction, still pending), and a transaction that
passed its estimate but failed once mined (the window closed in between). The verifier records only
what the chain holds, or will hold, never a verdict of its own making.

The replay is replaced by an honest PASS and the commit names a header nobody uploaded: what is
tested here is what happens after the verdict, and a real replay would only add seconds."""

from __future__ import annotations

import hashlib

from verifier_env import VERIFIER, WINDOW, WORKER_A, make_loop

from krill.chain.events import Committed
from krill.verifier.replay import ReplayResult
from krill.verifier.state import ATTESTED, MISSED, PENDING


def _sealed_commit(env) -> tuple[int, int]:
    """A commit of worker A, its randomness sealed; returns (commit id, commit block)."""
    nonce = env.next_nonce(WORKER_A)
    receipt = env.at(WORKER_A).commit(env.spec.run_id, 0, nonce, hashlib.sha256(b"header %d" % nonce).digest())
    commit_id = receipt.event(Committed).commit_id
    env.at(VERIFIER).seal_randomness_now(commit_id)
    return commit_id, receipt.block_number


def _passing_loop(env, tmp_path, start: int, lines: list[str]):
    loop = make_loop(env, tmp_path / "state.sqlite", start, lines)
    loop.replayer.replay = lambda job, randomness, shard=None, wait_s=None: ReplayResult(True, "passed", [])
    return loop


def _automine(env, on: bool) -> None:
    env.w3.provider.make_request("evm_setAutomine", [on])


def test_a_pass_whose_receipt_came_late_is_recorded_as_the_pass_the_chain_holds(run_env, tmp_path):
    env, lines = run_env, []
    start = env.head()
    commit_id, _ = _sealed_commit(env)
    loop = _passing_loop(env, tmp_path, start, lines)
    chain = env.at(VERIFIER)
    timeout, chain._tx.receipt_timeout_s = chain._tx.receipt_timeout_s, 0.3
    _automine(env, False)  # the attestation waits in the pool past the receipt timeout
    try:
        loop.step()
        assert loop.state.decision(commit_id).status == PENDING
        assert any("ReceiptTimeout" in line for line in lines), lines
        loop._retry_at.clear()
        loop.step()  # the retry: nothing on-chain yet, and the estimate meets our pending transaction
        assert loop.state.decision(commit_id).status == PENDING, loop.state.decision(commit_id)
        env.w3.provider.make_request("evm_mine", [])
    finally:
        _automine(env, True)
        chain._tx.receipt_timeout_s = timeout
    loop._retry_at.clear()
    loop.step()
    decision = loop.state.decision(commit_id)
    onchain = chain.attestation_of(commit_id, env.address(VERIFIER))
    assert onchain.exists and onchain.ok
    assert (decision.status, decision.ok) == (ATTESTED, True), decision
    counts = loop.state.counts()
    assert counts["passed"] == 1 and counts["failed"] == 0, counts


def test_an_attestation_mined_after_the_window_closed_is_missed_not_an_error(run_env, tmp_path, monkeypatch):
    env, lines = run_env, []
    start = env.head()
    commit_id, commit_block = _sealed_commit(env)
    env.mine(commit_block + WINDOW - 1 - env.head())  # a transaction sent now lands in the window's last block
    loop = _passing_loop(env, tmp_path, start, lines)
    tx = env.at(VERIFIER)._tx
    estimate = tx._gas_limit

    def estimate_then_a_block(probe, what):
        gas = estimate(probe, what)
        if what == "attest":
            env.mine(1)  # another transaction took the window's last block meanwhile
        return gas

    monkeypatch.setattr(tx, "_gas_limit", estimate_then_a_block)
    loop.step()
    decision = loop.state.decision(commit_id)
    assert not env.at(VERIFIER).attestation_of(commit_id, env.address(VERIFIER)).exists
    assert decision.status == MISSED and "window closed" in decision.reason, decision
    assert decision.evidence_cid is not None and loop.attested == 0
