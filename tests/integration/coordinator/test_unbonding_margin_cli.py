"""`krill coordinator run` refuses to start where the run's unbonding period leaves too few seconds after a
challenge window to confirm withheld content and slash it before the worker withdraws
(`krill.coordinator.margin`): on Anvil, with blocks one second apart and unbondingBlocks = window + 1, the least
the contract accepts, a worker that committed content it never uploaded and unstaked at once withdrew its whole
stake before the coordinator's fetch of that content gave up and the slash landed."""

from __future__ import annotations

import signal

from conftest import SMALL_SPEC

WINDOW = 4
SPEC = {**SMALL_SPEC, "chain": {"max_staleness": 0, "challenge_window_blocks": WINDOW}}


def _live_like(env) -> None:
    """unbondingBlocks = window + 1, and the last 300 blocks one second apart (as on a chain that mines a
    block a second, not Anvil's one block per transaction)."""
    env.chain.set_unbonding_blocks(WINDOW + 1)
    env.chain.w3.provider.make_request("anvil_mine", [hex(300), hex(1)])


def test_a_coordinator_refuses_to_start_when_a_withholder_could_withdraw_before_the_slash(coordinator_env):
    env = coordinator_env(SPEC)
    _live_like(env)
    # a pass every 5 s: 5 + 2 s (pass wait) to take a fetch's result, against 5 - 0 - 2 = 3 blocks of 1 s
    proc = env.spawn("--set", "coordinator.poll_interval_s=5", "run")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, f"exit {proc.returncode}\n{out}"
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, out
    for figure in ("unbonding period too short", "unbondingBlocks 5", "confirmations 0", "3.0 s", "7.0 s",
                   "poll interval 5 s", "coordinator.allow_short_unbonding"):
        assert figure in errors[0], (figure, out)
    assert "coordinating run" not in out


def test_the_override_starts_it_with_a_warning(coordinator_env):
    env = coordinator_env(SPEC)
    _live_like(env)
    proc = env.spawn("--set", "coordinator.poll_interval_s=5", "--set", "coordinator.allow_short_unbonding=true",
                     "--set", "coordinator.eval_every=0", "run")
    lines: list[str] = []
    while not lines or "coordinating run" not in lines[-1]:
        line = proc.stdout.readline()
        assert line, f"the coordinator ended before it started its loop:\n{''.join(lines)}"
        lines.append(line)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{''.join(lines)}{out}"
    warnings = [line for line in lines if line.startswith("warning: unbonding period too short")]
    assert len(warnings) == 1 and "running anyway" in warnings[0], "".join(lines)


def test_the_test_chain_with_the_devnet_unbonding_period_starts(coordinator_env):
    """The devnet's 50 000 blocks at a block a second: far more than a pass needs; the figures are printed."""
    env = coordinator_env(SPEC)
    env.chain.w3.provider.make_request("anvil_mine", [hex(300), hex(1)])
    proc = env.spawn("--set", "coordinator.eval_every=0", "run")
    lines: list[str] = []
    while not lines or "coordinating run" not in lines[-1]:
        line = proc.stdout.readline()
        assert line, f"the coordinator ended before it started its loop:\n{''.join(lines)}"
        lines.append(line)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{''.join(lines)}{out}"
    assert any(line.startswith("unbonding margin: unbondingBlocks 50000") for line in lines), "".join(lines)
