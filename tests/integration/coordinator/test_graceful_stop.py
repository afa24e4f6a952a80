"""SIGTERM and SIGINT stop the coordinator gracefully: a version journalled when the signal comes is
published before the process exits 0 (`krill demo` stops its coordinator with SIGTERM and never
restarts it, so a version left journalled there was lost to the demo)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

SPEC = {"rollout": {"prompts_per_contribution": 2, "group_size": 4},
        "version": {"contributions": 2, "deadline_s": 600.0}, "chain": {"max_staleness": 1}, "eval_n": 8,
        "compression": {"dense_versions": 1}}


@pytest.mark.parametrize("point,signame", [("decided", "SIGTERM"), ("stored", "SIGINT")])
def test_a_signal_between_journal_and_publication_publishes_the_version_and_exits_0(coordinator_env, point, signame):
    from krill.coordinator.journal import DecisionState, VersionDecision
    from krill.protocol.record import load_record

    env = coordinator_env(SPEC)
    ids = []
    for index in (1, 2):
        account, who = env.stake(index)
        header, files = env.produce(who, nonce=0, version=0)
        env.upload(header, files)
        ids.append(env.commit(account, header, version=0))
    # No version budget: only the signal ends the process (as in the demo).
    proc = env.spawn("--set", "coordinator.eval_every=0", "run", halt=f"{point}:{signame}")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}"
    assert env.chain.run_of(env.run_id).latest_version == 1, out
    assert "v1 " in out and f"stopped on {signame}" in out, out
    record = load_record(env.store, env.chain.version_of(env.run_id, 1).record_digest)
    assert [e.commit_id for e in record.accepted] == ids
    ctx, _ = env.context()
    with ctx.db.session() as s:
        states = list(s.scalars(select(VersionDecision.state).where(VersionDecision.run_id == env.run_id.hex())))
    assert states == [DecisionState.SETTLED]


def test_sigterm_while_waiting_for_contributions_exits_0_at_once(coordinator_env):
    import signal
    import time

    env = coordinator_env(SPEC)
    proc = env.spawn("--set", "coordinator.eval_every=0", "run")
    lines: list[str] = []
    while not lines or "coordinating run" not in lines[-1]:  # its first line: the loop starts next
        line = proc.stdout.readline()
        assert line, f"the coordinator ended before it started its loop:\n{''.join(lines)}"
        lines.append(line)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{''.join(lines)}{out}"
    assert time.monotonic() - started < 5.0  # `krill demo` waits 5 s before SIGKILL
    assert "stopped on SIGTERM: every journalled version is published" in out, out
    assert env.chain.run_of(env.run_id).latest_version == 0
