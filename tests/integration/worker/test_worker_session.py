"""The worker's contribution cycle in process against a real Anvil and a local store: resuming a
pending commit (landed or not), stale commits refused by the contract, nonce recovery, and the
stake / eligibility errors of the CLI."""

from __future__ import annotations

import hashlib
import json

from click.testing import CliRunner
from worker_accounts import PASSWORD, UNSTAKED, VERIFIER
from worker_procs import commits_of

from krill.chain.events import Committed
from krill.config import load_config
from krill.worker.cli import main
from krill.worker.runner import open_session

RESUMER, JAILED, JAILED_MID_RUN = 5, 6, 9


def _session(env, run, index, state_dir, behavior="honest"):
    lines: list[str] = []
    config = load_config(env.config_path(index, run, state_dir))
    return open_session(config, behavior, lines.append), lines


def test_restart_after_the_commit_landed_moves_on_without_committing_again(worker_env, tmp_path):
    env = worker_env
    run = env.new_run("resume-landed")
    first, _ = _session(env, run, RESUMER, tmp_path / "state")
    pending, *_ = first.contributor.prepare()
    # The process "dies" right after its commit transaction landed, before clearing the pending entry.
    landed = first.chain.commit(run.run_id, pending.model_version, pending.nonce,
                               bytes.fromhex(pending.digest)).event(Committed)
    count = env.admin.commit_count()

    again, _ = _session(env, run, RESUMER, tmp_path / "state")
    assert again.state.pending == pending and again.state.next_nonce == 1
    outcome = again.contributor.resume()
    assert (outcome.status, outcome.resumed, outcome.commit_id) == ("committed", True, landed.commit_id)
    assert env.admin.commit_count() == count  # nothing committed twice
    assert again.state.pending is None and not list((again.state.directory / "pending").iterdir())
    following = again.contributor.contribute()
    assert following.status == "committed" and following.nonce == 1
    assert [h["nonce"] for h in again.state.history()] == [0, 1]

    # A lost state directory: the nonce sequence is recovered from the chain, never reused.
    fresh, _ = _session(env, run, RESUMER, tmp_path / "other-disk")
    assert not fresh.state.existed and fresh.state.next_nonce == 2


def test_restart_before_the_commit_commits_the_saved_digest(worker_env, tmp_path):
    env = worker_env
    run = env.new_run("resume-pending")
    first, _ = _session(env, run, RESUMER, tmp_path / "state")
    pending, *_ = first.contributor.prepare()  # saved, neither uploaded nor committed: the process dies here
    again, _ = _session(env, run, RESUMER, tmp_path / "state")
    outcome = again.contributor.resume()
    assert outcome.status == "committed" and outcome.resumed and outcome.bytes_uploaded > 0
    info = env.admin.commit_of(outcome.commit_id)
    assert (info.header_digest.hex(), info.nonce, info.version) == (pending.digest, 0, 0)
    assert env.admin.commit_id_of(run.run_id, env.accounts[RESUMER].address, 0, 0) == outcome.commit_id


def test_commit_refused_as_stale_by_the_contract_is_recorded_and_work_goes_on(worker_env, tmp_path):
    env = worker_env
    run = env.new_run("stale", max_staleness=0)
    session, _ = _session(env, run, RESUMER, tmp_path / "state")
    prepared = session.contributor.prepare()
    assert prepared[0].model_version == 0
    env.publish_next(run)  # the coordinator moves past v + S_max while the worker uploads
    stale = session.contributor.submit(*prepared, resumed=False)
    assert stale.status == "stale" and "CommitVersionTooStale" in stale.detail
    assert env.admin.commit_id_of(run.run_id, env.accounts[RESUMER].address, 0, 0) == 0
    assert session.state.pending is None and session.state.history()[-1]["status"] == "stale"
    assert "STALE" in stale.line()
    following = session.contributor.contribute()
    assert (following.status, following.nonce, following.behaviour_version, following.model_version) == \
        ("committed", 1, 1, 1)


def _cli(env, run, index, state_dir, *args, keystore=None):
    config = env.config_path(index, run, state_dir, keystore=keystore)
    return CliRunner().invoke(main, ["--config", str(config), *args])


def test_stake_and_run_explain_what_is_missing(worker_env, tmp_path):

    from krill.keystore import KdfCost, create_keystore

    env = worker_env
    run = env.new_run("stake-cli")
    state = tmp_path / "state"
    refused = _cli(env, run, UNSTAKED, state, "run", "--max-contributions", "1")
    assert refused.exit_code == 1 and "krill worker stake" in refused.output
    poor = _cli(env, run, UNSTAKED, state, "stake", "--amount", "5000")
    assert poor.exit_code == 1 and "not enough tokens" in poor.output and "1000 KRILL" in poor.output
    small = _cli(env, run, UNSTAKED, state, "stake", "--amount", "10")
    assert small.exit_code == 1 and "below the worker minimum of 100" in small.output
    ok = _cli(env, run, UNSTAKED, state, "stake", "--amount", "150")
    assert ok.exit_code == 0 and "staked 150 KRILL" in ok.output, ok.output
    assert env.admin.stake_of(env.accounts[UNSTAKED].address).staked == 150 * 10**18
    other_key = create_keystore("other", PASSWORD, directory=tmp_path, private_key=env.accounts[UNSTAKED].key,
                                ed25519_seed=hashlib.sha256(b"another key").digest(), cost=KdfCost.FAST).path
    clash = _cli(env, run, UNSTAKED, state, "stake", "--amount", "150", keystore=other_key)
    assert clash.exit_code == 1 and "already staked with Ed25519 key" in clash.output
    wrong_key = _cli(env, run, UNSTAKED, state, "run", "--max-contributions", "1", keystore=other_key)
    assert wrong_key.exit_code == 1 and "use the keystore you staked with" in wrong_key.output


def test_jailed_worker_stops_with_a_clear_message(worker_env, tmp_path):

    env = worker_env
    run = env.new_run("jailed", quorum=1)
    session, _ = _session(env, run, JAILED, tmp_path / "state")
    outcome = session.contributor.contribute()
    env.admin.seal_randomness_now(outcome.commit_id)
    env.chain(VERIFIER).attest(outcome.commit_id, False, hashlib.sha256(b"evidence").digest())
    env.admin.slash(outcome.commit_id)
    result = _cli(env, run, JAILED, tmp_path / "state", "run", "--max-contributions", "1")
    assert result.exit_code == 1 and "is jailed" in result.output and "krill worker stake" in result.output


def test_the_next_contribution_is_made_while_the_previous_one_is_committed(worker_env, tmp_path):
    from krill.worker.runner import run_worker

    env = worker_env
    run = env.new_run("pipelined")
    lines: list[str] = []
    config = load_config(env.config_path(RESUMER, run, tmp_path / "state"))
    outcomes = run_worker(config, max_contributions=2, echo=lines.append)
    assert [(o.nonce, o.status) for o in outcomes] == [(0, "committed"), (1, "committed")]
    assert [c.nonce for c in commits_of(env, run, RESUMER)] == [0, 1]
    log = tmp_path / "state" / "runs" / run.run_id.hex() / "contributions.jsonl"
    first, second = (json.loads(line) for line in log.read_text().splitlines())  # "time": when each was logged
    # Each contribution's time on the critical path ends before its upload and commit do.
    assert all(0 < o.seconds["foreground"] < o.seconds["total"] for o in outcomes)
    # The second was started before the first's commit finished, and waited for it before saving.
    assert second["time"] - second["seconds"]["total"] < first["time"]
    assert "wait_submit" in second["phases"] and "chain_confirm" in second["phases"]
    assert sum(line.count("commit #") for line in lines) == 2


def test_a_worker_with_its_share_in_samples_ahead_and_learns_at_the_next_version(worker_env, tmp_path, monkeypatch):
    import threading
    import time

    from worker_replay import replay_commit

    from krill.worker.contribute import Contributor
    from krill.worker.runner import run_worker

    env = worker_env
    run = env.new_run("sample-ahead")
    config = load_config(env.config_path(RESUMER, run, tmp_path / "state", max_per_version=1, sample_ahead=True))
    waiting, wait_newer = threading.Event(), Contributor.wait_newer

    def says_it_waits(self, *args, **kwargs):  # the second contribution's rollouts are drawn: it waits for v1
        waiting.set()
        return wait_newer(self, *args, **kwargs)

    monkeypatch.setattr(Contributor, "wait_newer", says_it_waits)
    outcomes: list = []
    worker = threading.Thread(target=lambda: outcomes.extend(run_worker(config, max_contributions=2,
                                                                        echo=lambda line: None)), daemon=True)
    worker.start()
    deadline = time.monotonic() + 120
    while not commits_of(env, run, RESUMER) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert commits_of(env, run, RESUMER), "the first commit never landed"
    # Its rollouts are drawn at version 0 (however long that takes on a loaded machine); then it waits.
    assert waiting.wait(120), "the second contribution never waited for version 1"
    time.sleep(0.6)  # it waits at least this long: version 1 is published only after
    assert worker.is_alive() and len(commits_of(env, run, RESUMER)) == 1
    assert env.publish_next(run) == 1
    worker.join(timeout=120)
    assert not worker.is_alive()
    assert [(o.status, o.nonce, o.behaviour_version, o.model_version) for o in outcomes] == \
        [("committed", 0, 0, 0), ("committed", 1, 0, 1)]
    assert outcomes[1].phases.get("wait_version", 0.0) > 0.5 and "wait_version" not in outcomes[0].phases
    second = commits_of(env, run, RESUMER)[1]
    header, checks = replay_commit(env.admin, env.store, run.spec, second.commit_id)
    assert (header.behaviour_version, header.model_version) == (0, 1)
    assert all(c.ok for c in checks.values()), {n: c.detail for n, c in checks.items()}


def test_a_worker_jailed_mid_run_stops_at_the_next_version_without_committing_again(worker_env, tmp_path):
    import threading
    import time

    import pytest

    from krill.worker.errors import JailedError
    from krill.worker.runner import run_worker

    env = worker_env
    run = env.new_run("jailed-mid-run", quorum=1)
    config = load_config(env.config_path(JAILED_MID_RUN, run, tmp_path / "state", max_per_version=1,
                                         sample_ahead=True))
    raised: list[BaseException] = []

    def work() -> None:
        try:
            run_worker(config, max_contributions=3, echo=lambda line: None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            raised.append(exc)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    deadline = time.monotonic() + 120
    while not commits_of(env, run, JAILED_MID_RUN) and time.monotonic() < deadline:
        time.sleep(0.1)
    first = commits_of(env, run, JAILED_MID_RUN)
    assert first, "the first commit never landed"
    env.admin.seal_randomness_now(first[0].commit_id)
    env.chain(VERIFIER).attest(first[0].commit_id, False, hashlib.sha256(b"evidence").digest())
    env.admin.slash(first[0].commit_id)  # jailed while it waits for version 1 with its next rollouts
    assert env.publish_next(run) == 1  # the watcher fetches version 1 and finds the stake jailed
    worker.join(timeout=120)
    assert not worker.is_alive() and len(raised) == 1
    with pytest.raises(JailedError, match="is jailed"):
        raise raised[0]
    assert len(commits_of(env, run, JAILED_MID_RUN)) == 1


def test_a_store_held_by_another_process_at_start_is_waited_for(worker_env, tmp_path, monkeypatch):
    """An embedded Kubo repo whose node another process holds (`krill worker status` holds it a few
    seconds) made `open_session` raise and the worker exit; the open is retried with the back-off."""
    import krill.runtime as runtime
    from krill.store.embedded_kubo import RepoInUseError

    env = worker_env
    run = env.new_run("store-held")
    real_open, tries = runtime.open_configured_store, []

    def held_once(config):
        tries.append(1)
        if len(tries) == 1:
            raise RepoInUseError("the IPFS repo /r is in use by the Kubo node of process 4242", tmp_path, 4242)
        return real_open(config)

    monkeypatch.setattr(runtime, "open_configured_store", held_once)
    monkeypatch.setattr("time.sleep", lambda s: None)
    session, lines = _session(env, run, RESUMER, tmp_path / "state")
    assert len(tries) == 2 and session.store is not None
    assert any(line.startswith("store (open): unreachable (the IPFS repo /r is in use") for line in lines), lines
