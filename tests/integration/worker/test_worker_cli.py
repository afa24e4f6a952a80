"""`krill worker init|stake|status|run|unstake|withdraw|claim` as a person runs them, against the suite's
Anvil devnet: each command's happy path in one account's life, then every failure message, each one
line naming what to do next, exit status 1 and no traceback."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from click.testing import CliRunner
from worker_accounts import PASSWORD, VERIFIER

from krill.chain.devnet import DEVNET_ACCOUNTS, DevnetState
from krill.chain.rpc import dev_account, mine
from krill.cli import cli
from krill.config import krill_home
from krill.staking import TOKEN


def _fake_devnet(env) -> None:
    """Record the suite's node as this KRILL_HOME's running devnet, as `krill devnet up` would."""
    folder = krill_home() / "devnet"
    folder.mkdir(parents=True, exist_ok=True)
    state = DevnetState(pid=env.node.pid, port=env.node.port, chain_id=31337, protocol_address=env.deployment.protocol,
                        token_address=env.deployment.token, deploy_block=env.deployment.block_number,
                        config_path=str(folder / "config.toml"))
    (folder / "devnet.json").write_text(json.dumps(state.to_json()), encoding="utf-8")
    faucet = dev_account(DEVNET_ACCOUNTS - 1).address  # `krill devnet up` funds it; the suite's node did not
    if env.admin.token.balance_of(faucet) < 10_000 * TOKEN:
        env.admin.token.mint(faucet, 10_000 * TOKEN)


def krill(*args: str, password: str = PASSWORD):
    result = CliRunner().invoke(cli, list(args), env={"KRILL_KEYSTORE__PASSWORD": password})
    assert "Traceback" not in result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def failed(result, *needles: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.output.count("error: ") == 1, result.output
    for needle in needles:
        assert needle in result.output, result.output


def _init(env, run, name: str, *extra: str) -> str:
    _fake_devnet(env)
    out = krill_home() / f"{name}.toml"
    result = krill("worker", "init", "--devnet", "--store", str(env.root / "store"), "--run-id", run.run_id.hex(),
                   "--keystore", name, "--out", str(out), *extra)
    assert result.exit_code == 0, result.output
    return str(out)


def _status(config: str) -> dict:
    result = krill("--config", config, "worker", "status", "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_a_worker_from_init_to_withdraw_and_claim(worker_env):
    env = worker_env
    run = env.new_run("cli-life")
    _fake_devnet(env)
    out = krill_home() / "worker.toml"
    made = krill("worker", "init", "--devnet", "--store", str(env.root / "store"), "--run-id", run.run_id.hex())
    assert made.exit_code == 0, made.output
    assert "created keystore" in made.output and "funded on the devnet" in made.output
    assert f"krill --config {out} worker ..." in made.output and "krill worker stake" in made.output
    config = str(out)
    again = krill("worker", "init", "--devnet", "--store", str(env.root / "store"))
    failed(again, "already exists", "--force")

    fresh = _status(config)
    assert fresh["staked_as"] == "nothing" and fresh["trust"] is None and fresh["trust_weighed"] is None
    assert fresh["trust_note"] == "none yet (the run has published no version)" and fresh["verdicts"] is None
    assert any("krill worker stake" in h for h in fresh["hints"])
    table = krill("--config", config, "worker", "status")
    assert "trust" in table.output and "none yet" in table.output and "next: not staked" in table.output
    assert "unknown (no index)" in table.output  # the verdict counts and the coordinator's decisions

    staked = krill("--config", config, "worker", "stake", "--amount", "300")
    assert staked.exit_code == 0 and "staked 300 KRILL as worker" in staked.output, staked.output
    ran = krill("--config", config, "worker", "run", "--max-contributions", "1")
    assert ran.exit_code == 0, ran.output
    assert sum(" | commit #" in line for line in ran.output.splitlines()) == 1
    assert "worker done: 1 committed, 0 dropped" in ran.output

    status = _status(config)
    address = status["address"]
    assert (status["staked"], status["jailed"], status["eligible"], status["claimable"]) == ("300", False, True, "0")
    assert status["local"]["committed"] == 1 and status["local"]["next_nonce"] == 1
    assert status["contributions"] is None and status["contributions_source"] == "unknown (no index)"

    # With the index (and a coordinator's verdicts) in the configured database, verdict counts and reasons
    # appear; trust is still the coordinator's weighing from published records (none yet), not the index's.
    from krill.db.indexer import Indexer
    from krill.db.models import Contribution, ContributionStatus, RejectionCode
    from krill.db.session import open_database

    url = f"sqlite:///{krill_home() / 'index.db'}"
    with open_database(url) as db:
        Indexer(env.admin, db, env.store, start_block=env.deployment.block_number).sync()
        commit_id = env.admin.commit_id_of(run.run_id, address, 0, 0)
        with db.write() as s:
            s.add(Contribution(commit_id=commit_id, run_id=run.run_id.hex(), worker=address.lower(), version=0,
                               status=ContributionStatus.REJECTED, reason_code=RejectionCode.STALE,
                               reason="v0 is 3 versions old"))
    indexed = krill("--config", config, "--set", f"database.url={url}", "worker", "status", "--json")
    data = json.loads(indexed.output)
    assert data["trust"] is None and data["trust_note"] == "none yet (the run has published no version)"
    assert data["verdicts"] == {"passed": 0, "failed": 0}
    assert data["contributions"]["rejected_by_reason"] == {"stale": 1}
    assert data["contributions"]["recent_rejections"][0]["reason"] == "v0 is 3 versions old"
    shown = krill("--config", config, "--set", f"database.url={url}", "worker", "status")
    assert "0 accepted, 1 rejected (stale 1)" in shown.output and "v0 is 3 versions old" in shown.output

    unbond = krill("--config", config, "worker", "unstake", "--amount", "100")
    assert unbond.exit_code == 0 and "unbonding 100 KRILL" in unbond.output, unbond.output
    early = krill("--config", config, "worker", "withdraw")
    failed(early, "still unbonding", "more blocks must pass", "krill worker withdraw")
    left = _status(config)["blocks_to_release"]
    assert left > 0 and f"{left} more blocks" in early.output
    mine(env.w3, left)
    paid = krill("--config", config, "worker", "withdraw")
    assert paid.exit_code == 0 and "withdrew 100 KRILL" in paid.output, paid.output

    nothing = krill("--config", config, "worker", "claim")
    failed(nothing, "nothing to claim", "settles a version")
    env.admin.approve_stake(10 * TOKEN)
    env.admin.fund_rewards(run.run_id, 10 * TOKEN)
    env.publish_next(run)
    env.admin.settle(run.run_id, 1, [address], [4 * TOKEN])
    assert _status(config)["claimable"] == "4"
    claimed = krill("--config", config, "worker", "claim")
    assert claimed.exit_code == 0 and "claimed 4 KRILL" in claimed.output, claimed.output
    after = _status(config)
    assert (after["claimable"], after["earned"], after["claimed"], after["staked"]) == ("0", "4", "4", "200")


def test_each_failure_names_the_next_step(worker_env, tmp_path):
    env = worker_env
    run = env.new_run("cli-failures")
    no_devnet = krill("worker", "init", "--devnet")
    failed(no_devnet, "no devnet is running", "krill devnet up")
    config = _init(env, run, "failing")

    failed(krill("--config", config, "worker", "unstake"), "nothing staked", "krill worker stake")
    failed(krill("--config", config, "worker", "withdraw"), "nothing staked", "krill worker stake")
    failed(krill("--config", config, "worker", "run", "--max-contributions", "1"), "no stake", "krill worker stake")
    failed(krill("--config", config, "worker", "stake", "--amount", "10"),
           "below the worker minimum of 100 KRILL", "--amount 100")
    failed(krill("--config", config, "worker", "stake", "--amount", "ten"), "not a number of tokens")
    failed(krill("--config", config, "worker", "stake", password="not the password"),
           "wrong password for keystore", "KRILL_KEYSTORE__PASSWORD")
    failed(krill("--config", config, "--set", "run.id=" + "ab" * 32, "worker", "status"),
           "does not exist on the chain", "check run.id")
    failed(krill("--config", config, "--set", "chain.rpc_url=http://127.0.0.1:9", "worker", "status"),
           "http://127.0.0.1:9 is unreachable", "krill devnet status")

    # Init checks what it is given before it writes anything.
    elsewhere = str(tmp_path / "w.toml")
    common = ("worker", "init", "--keystore", "failing", "--out", elsewhere)
    failed(krill(*common, "--rpc-url", "http://127.0.0.1:9", "--protocol", env.deployment.protocol),
           "unreachable", "krill devnet status")
    failed(krill(*common, "--devnet", "--store", str(env.root / "store"), "--run-id", "cd" * 32),
           "does not exist on the chain", "check run.id")
    failed(krill(*common, "--devnet", "--store", "http://127.0.0.1:9"), "cannot reach Kubo")
    failed(krill(*common, "--devnet", "--store", str(tmp_path / "empty-store"), "--run-id", run.run_id.hex()),
           "does not hold the spec of run", "--store")
    failed(krill(*common, "--devnet", "--store", str(env.root / "store"), password="not the password"),
           "wrong password for the existing keystore", "--keystore NEW_NAME")
    failed(krill(*common, "--rpc-url", env.node.rpc_url, "--protocol", env.accounts[9].address),
           "no contract at", "--protocol")
    assert not os.path.exists(elsewhere)

    # Jailed: slashed after a failing verdict; status says so, stake refuses and points at a new account.
    assert krill("--config", config, "worker", "stake", "--amount", "200").exit_code == 0
    assert krill("--config", config, "worker", "run", "--max-contributions", "1").exit_code == 0
    address = _status(config)["address"]
    commit_id = env.admin.commit_id_of(run.run_id, address, 0, 0)
    env.admin.seal_randomness_now(commit_id)
    env.chain(VERIFIER).attest(commit_id, False, hashlib.sha256(b"evidence").digest())
    env.admin.slash(commit_id)
    jailed = _status(config)
    assert jailed["jailed"] is True and jailed["staked"] == "100"
    assert any("is jailed" in h and "new account" in h for h in jailed["hints"])
    failed(krill("--config", config, "worker", "stake", "--amount", "100"), "is jailed", "new account")
    failed(krill("--config", config, "worker", "run", "--max-contributions", "1"), "is jailed")
    # What was not slashed can still leave.
    assert krill("--config", config, "worker", "unstake").exit_code == 0
    failed(krill("--config", config, "worker", "unstake"), "no stake left to unbond", "krill worker withdraw")


@pytest.mark.parametrize("tty", [False, True])
def test_run_progress_keeps_status_lines_and_draws_a_bar_only_on_a_terminal(tty):
    import io

    from krill.progress import LineProgress

    class Stream(io.StringIO):
        def isatty(self) -> bool:
            return tty

    stream = Stream()
    with LineProgress("committed", total=2, stream=stream) as bar:
        bar.line("nonce 0 | b0->v0 | commit #1")
        bar.update(1)
    assert "nonce 0 | b0->v0 | commit #1" in stream.getvalue()
    assert (stream.getvalue() == "nonce 0 | b0->v0 | commit #1\n") is not tty
