"""`python -m krill.worker run` as real processes against Anvil and the local store: honest and
forging workers whose commits replay as a verifier would; a chain outage at start and at commit
time, a `kill -9` between upload and commit, and the restart that finishes the work."""

from __future__ import annotations

import json
import os
import signal

from rpc_proxy import RpcProxy
from worker_procs import commits_of, start_worker, wait_for
from worker_replay import replay_commit

from krill.chain.anvil import free_port

HONEST, FORGER, RESTARTED = 2, 3, 4


def test_honest_and_forging_workers_commit_contributions_that_replay(worker_env, tmp_path, processes):
    env = worker_env
    run = env.new_run("two-workers")
    logs = {i: tmp_path / f"worker{i}.log" for i in (HONEST, FORGER)}
    honest = start_worker(env.config_path(HONEST, run, tmp_path / "honest"), "--max-contributions", "4",
                          log=logs[HONEST])
    forger = start_worker(env.config_path(FORGER, run, tmp_path / "forger"), "--behavior", "forge-rewards",
                          "--max-contributions", "2", log=logs[FORGER])
    processes += [honest, forger]
    # Publish version 1 while the workers run: later contributions must learn (and sample) at it. The
    # worker commits at most two per version (worker.max_per_version), so it waits for version 1 after
    # two; publishing any earlier would leave the fourth waiting for a version 2 nobody publishes.
    wait_for(lambda: len(commits_of(env, run, HONEST)) >= 2, 120, "the honest worker's first two commits", honest,
             logs[HONEST])
    assert env.publish_next(run) == 1
    for proc, i in ((honest, HONEST), (forger, FORGER)):
        assert proc.wait(timeout=120) == 0, logs[i].read_text()
    lines = [line for line in logs[HONEST].read_text().splitlines() if "commit #" in line]
    assert len(lines) == 4 and all("tok/s" in line and "reward" in line and "KiB" in line for line in lines)

    honest_commits, forged_commits = commits_of(env, run, HONEST), commits_of(env, run, FORGER)
    assert [c.nonce for c in honest_commits] == [0, 1, 2, 3] and [c.nonce for c in forged_commits] == [0, 1]
    assert honest_commits[-1].version == 1  # the worker followed the published version
    for commit in honest_commits:
        header, checks = replay_commit(env.admin, env.store, run.spec, commit.commit_id)
        assert all(c.ok for c in checks.values()), {n: c.detail for n, c in checks.items()}
        assert header.model_version == commit.version and header.behaviour_version <= header.model_version
        assert set(checks) == {"assignment", "rewards", "resample", "gradient-0", "gradient-1"}
    for commit in forged_commits:
        _, checks = replay_commit(env.admin, env.store, run.spec, commit.commit_id)
        failed = sorted(n for n, c in checks.items() if not c.ok)
        assert failed == ["rewards"], {n: c.detail for n, c in checks.items()}
        assert checks["rewards"].figures["mismatched"] == 16
    assert "(true 0.000)" in logs[FORGER].read_text()


def test_worker_rides_out_chain_outages_and_a_kill_between_upload_and_commit(worker_env, tmp_path, processes):
    env = worker_env
    run = env.new_run("outage-restart")
    proxy = RpcProxy(env.node.rpc_url, free_port())
    state_dir = tmp_path / "state"
    state_file = state_dir / "runs" / run.run_id.hex() / "state.json"
    # All three commits go in at version 0 (nothing is published here): a cap of 3 per version, since the
    # per-version cap counts the commits of earlier starts and the resumed one.
    config = env.config_path(RESTARTED, run, state_dir, rpc_url=proxy.url, max_per_version=3)
    first_log = tmp_path / "first.log"
    # 1. The chain's port is dead at start: the worker waits instead of crashing, then makes one commit.
    first = start_worker(config, "--max-contributions", "1", log=first_log)
    processes.append(first)
    wait_for(lambda: "unreachable" in first_log.read_text(), 60, "a back-off line", first, first_log)
    proxy.start("up")
    try:
        assert first.wait(timeout=120) == 0, first_log.read_text()
        assert [c.nonce for c in commits_of(env, run, RESTARTED)] == [0]
        # 2. Transactions fail from now on (switched between processes: a worker switched mid-run can
        # land its next commit first): the next contribution is saved and uploaded, then waits.
        proxy.mode = "writes-down"
        blocked_log = tmp_path / "blocked.log"
        blocked = start_worker(config, "--max-contributions", "2", log=blocked_log)
        processes.append(blocked)

        def pending():
            doc = json.loads(state_file.read_text())
            stuck = "chain (commit): unreachable" in blocked_log.read_text()
            return doc["pending"] if doc["pending"] and stuck else None

        saved = wait_for(pending, 120, "a pending commit blocked by the outage", blocked, blocked_log)
        os.kill(blocked.pid, signal.SIGKILL)  # 3. kill -9 between upload and commit
        blocked.wait(timeout=10)
        assert [c.nonce for c in commits_of(env, run, RESTARTED)] == [0]
        proxy.mode = "up"
        # 4. Restart: the saved commit goes in with the same digest, then the sequence continues.
        second_log = tmp_path / "second.log"
        second = start_worker(config, "--max-contributions", "2", log=second_log)
        processes.append(second)
        assert second.wait(timeout=120) == 0, second_log.read_text()
    finally:
        proxy.stop()
    commits = commits_of(env, run, RESTARTED)
    assert [c.nonce for c in commits] == [0, 1, 2]
    assert commits[1].header_digest.hex() == saved["digest"] and saved["nonce"] == 1
    text = second_log.read_text()
    assert "resuming nonce 1" in text and "(resumed)" in text
    doc = json.loads(state_file.read_text())
    assert doc["next_nonce"] == 3 and doc["pending"] is None
    log_lines = [json.loads(line) for line in (state_file.parent / "contributions.jsonl").read_text().splitlines()]
    assert [(x["nonce"], x["status"]) for x in log_lines] == [(0, "committed"), (1, "committed"), (2, "committed")]
