"""A commit racing other transactions on a real Anvil: beaten in its own block by a front-runner's copy of
its digest or by a `publishVersion` that makes it stale, the contribution is logged and dropped and the
worker goes on; a receipt that times out while the commit sits in the pool never logs it as lost.

Each test pauses the shared node's automining for a moment and turns it back on before it ends."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from types import SimpleNamespace

from worker_accounts import WORKERS

from krill.chain.types import to_bytes32, to_uint
from krill.testing.races import beaten_in_one_block
from krill.worker.backoff import Backoff
from krill.worker.contribute import COMMITTED, FRONT_RUN, STALE, Contributor
from krill.worker.nonce_state import Pending, WorkerState


def _contributor(env, run, index: int, state_dir, lines: list[str]) -> Contributor:
    """A Contributor of worker `index` with only what `submit` uses (no model work, nothing uploaded)."""
    chain = env.chain(index)
    state = WorkerState.open(state_dir, run.run_id, chain.sender)
    spec = SimpleNamespace(run_id=run.run_id, staleness=SimpleNamespace(max_staleness=run.spec.chain.max_staleness))
    return Contributor(chain, None, spec, source=None, who=SimpleNamespace(worker=chain.sender),
                       behavior=SimpleNamespace(uploads=False), shards=[0], state=state,
                       backoff=Backoff(0.05, 0.1, echo=lines.append), echo=lines.append)


def _save(contributor: Contributor, version: int, label: bytes) -> tuple[Pending, bytes]:
    header = json.dumps({"label": label.hex(), "files": {}}, sort_keys=True).encode()
    pending = Pending(model_version=version, behaviour_version=version, nonce=contributor.state.reserve_nonce(),
                      digest=hashlib.sha256(header).hexdigest(), files=[])
    contributor.state.save_pending(pending, header, {})
    return pending, header


def _beaten_in_one_block(env, monkeypatch, contributor: Contributor, rival, name: str, args: tuple) -> None:
    """The contributor's next commit passes its estimate; then `rival` sends `name(args)` with a ten times
    higher tip, and both are mined in one block, the rival's first."""
    beaten_in_one_block(env.w3, env.deployment.protocol, monkeypatch, contributor.chain, rival, name, args)


def test_a_commit_a_front_runner_beat_in_its_block_is_logged_front_run_and_the_next_one_lands(
        worker_env, tmp_path, monkeypatch):
    env = worker_env
    run = env.new_run("race-front-run")
    lines: list[str] = []
    contributor = _contributor(env, run, WORKERS[0], tmp_path / "state", lines)
    pending, header = _save(contributor, 0, b"front-run")
    thief = env.chain(WORKERS[1])
    _beaten_in_one_block(env, monkeypatch, contributor, thief, "commit",
                         (to_bytes32(run.run_id, "run_id"), to_uint(0, "version", 64), to_uint(777, "nonce", 64),
                          bytes.fromhex(pending.digest)))
    outcome = contributor.submit(pending, header, {}, {}, time.perf_counter(), resumed=False)
    assert outcome.status == FRONT_RUN and thief.sender in outcome.detail
    assert contributor.state.pending is None and contributor.state.history()[-1]["status"] == FRONT_RUN
    monkeypatch.undo()
    following, header2 = _save(contributor, 0, b"after the front-run")
    assert following.nonce == pending.nonce + 1
    assert contributor.submit(following, header2, {}, {}, time.perf_counter(), resumed=False).status == COMMITTED


def test_a_commit_a_published_version_made_stale_in_its_block_is_logged_stale(worker_env, tmp_path, monkeypatch):
    env = worker_env
    run = env.new_run("race-stale", max_staleness=1)
    admin = env.admin
    admin.publish_version(run.run_id, 1, hashlib.sha256(b"m1").digest(), hashlib.sha256(b"r1").digest())
    contributor = _contributor(env, run, WORKERS[0], tmp_path / "state", [])
    pending, header = _save(contributor, 0, b"stale")  # within S_max=1 of version 1 at its estimate
    _beaten_in_one_block(env, monkeypatch, contributor, admin, "publishVersion",
                         (to_bytes32(run.run_id, "run_id"), to_uint(2, "version", 64), hashlib.sha256(b"m2").digest(),
                          hashlib.sha256(b"r2").digest()))
    outcome = contributor.submit(pending, header, {}, {}, time.perf_counter(), resumed=False)
    assert outcome.status == STALE and "CommitVersionTooStale" in outcome.detail
    assert contributor.state.pending is None and contributor.state.history()[-1]["status"] == STALE
    assert admin.run_of(run.run_id).latest_version == 2


def test_a_commit_whose_receipt_timed_out_waits_for_its_block_instead_of_logging_it_lost(worker_env, tmp_path):
    env = worker_env
    run = env.new_run("receipt-timeout")
    lines: list[str] = []
    waiting = threading.Event()

    def echo(line: str) -> None:
        lines.append(line)
        if "waiting for the next block" in line:
            waiting.set()

    contributor = _contributor(env, run, WORKERS[0], tmp_path / "state", lines)
    contributor.echo = contributor.backoff.echo = echo
    contributor.chain._tx.receipt_timeout_s = 0.5  # stands for the 120 s default on a congested chain
    pending, header = _save(contributor, 0, b"slow receipt")
    w3 = env.w3
    done = threading.Event()

    def mine_once_it_waits() -> None:
        """Blocks come back once the worker says it waits for one, and keep coming until `submit` returns:
        a single block mined before the worker reads the head it waits past would leave it waiting for ever
        (automine mines only on a transaction, and none comes)."""
        try:
            waiting.wait(60)  # the retry's estimate refused the commit against the pending block
            while not done.wait(0.1):
                w3.provider.make_request("evm_mine", [])
        finally:
            w3.provider.make_request("evm_setAutomine", [True])

    w3.provider.make_request("evm_setAutomine", [False])
    miner = threading.Thread(target=mine_once_it_waits, daemon=True)
    miner.start()
    try:
        outcome = contributor.submit(pending, header, {}, {}, time.perf_counter(), resumed=False)
    finally:
        waiting.set()
        done.set()
        miner.join(10)
    assert any("waiting for the next block" in line for line in lines)
    assert any("not in the chain after 0.5 seconds" in line for line in lines)
    commit_id = contributor.chain.commit_id_by_digest(bytes.fromhex(pending.digest))
    assert (outcome.status, outcome.commit_id) == (COMMITTED, commit_id) and commit_id
    assert contributor.chain.commit_of(commit_id).worker == contributor.chain.sender
    assert [h["status"] for h in contributor.state.history()] == [COMMITTED]
    assert contributor.state.pending is None
