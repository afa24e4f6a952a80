"""Coordinator writes whose receipt does not come in time (Anvil with automine off, a tiny receipt
timeout): the loop waits instead of stopping, the retry recognises its own pending transaction
(publishVersion, settle, slash) as `WritePending`, and once blocks come the write counts once. A write that
ran out of gas twice (`TransactionOutOfGas`) is a passing fault too; a create-run cut by a receipt timeout is
resumed, its id saved."""

from __future__ import annotations

import hashlib
import threading

import pytest
from conftest import SMALL_SPEC, TOKEN, wait_for  # at import: later, 'conftest' is whichever ran last

RECEIPT_TIMEOUT_S = 0.3


def _stop_blocks(env) -> None:
    env.chain._tx.receipt_timeout_s = RECEIPT_TIMEOUT_S
    env.chain.w3.provider.make_request("evm_setAutomine", [False])


def _resume_blocks(env) -> None:
    env.chain.w3.provider.make_request("evm_setAutomine", [True])
    env.chain.w3.provider.make_request("evm_mine", [])


def _two_contributions(env) -> None:
    for index in (1, 2):
        account, who = env.stake(index)
        header, files = env.produce(who, nonce=0, version=0)
        env.upload(header, files)
        env.commit(account, header, version=0)


def test_a_publication_whose_receipt_times_out_is_waited_for_and_lands_once(coordinator_env):
    """The loop ended on the receipt timeout; with it a passing fault, the retry's estimate met our own
    pending publishVersion (VersionNotNext(1, expected=2)) and ended it there."""
    from krill.coordinator.loop import Coordinator, LoopOptions

    env = coordinator_env()
    _two_contributions(env)
    ctx, indexer = env.context()
    pool = env.chain.run_of(env.run_id).reward_pool
    _stop_blocks(env)
    lines: list[str] = []
    coordinator = Coordinator(ctx, indexer, LoopOptions(poll_interval_s=0.1, eval_every=0, max_versions=1,
                                                        max_backoff_s=0.5), echo=lines.append)
    outcome: dict = {}

    def run() -> None:
        try:
            coordinator.run()
            outcome["ended"] = None
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            outcome["ended"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: any("WritePending" in line for line in lines) or not thread.is_alive(), 60,
                 "the loop to find its publication pending")
        assert thread.is_alive(), f"the loop ended while its publication was pending: {outcome.get('ended')!r}"
        assert any(line.startswith("waiting") and "ReceiptTimeout" in line for line in lines), lines
        assert env.chain.run_of(env.run_id).latest_version == 0
    finally:
        _resume_blocks(env)
        thread.join(60)
    assert not thread.is_alive() and outcome["ended"] is None, outcome
    assert env.chain.run_of(env.run_id).latest_version == 1
    assert env.chain.version_of(env.run_id, 1).settled
    assert env.chain.run_of(env.run_id).reward_pool == pool - ctx.spec.chain.reward_per_version  # paid once


def test_a_settle_whose_receipt_times_out_is_pending_not_a_crash_and_pays_once(coordinator_env):
    """settle_version and adoption's settle read the flag at the latest block (unset while our settle is
    pending); the send was estimated against the pending block and SettleAlreadyDone stopped the
    coordinator."""
    from krill.chain.tx import ReceiptTimeout
    from krill.coordinator.adopt import _settle
    from krill.coordinator.close import decide
    from krill.coordinator.ingest import ingest
    from krill.coordinator.journal import VersionDecision, ensure_tables
    from krill.coordinator.publish import WritePending, complete_version
    from krill.coordinator.settle import settle_version

    env = coordinator_env()
    _two_contributions(env)
    ctx, indexer = env.context()
    ensure_tables(ctx.db)
    indexer.sync()
    ingest(ctx, next_version=1)
    assert decide(ctx, 1) is not None
    complete_version(ctx, 1)
    pool = env.chain.run_of(env.run_id).reward_pool
    with ctx.db.session() as s:
        accepted = s.get(VersionDecision, (ctx.run_hex, 1)).accepted

    _stop_blocks(env)
    try:
        with pytest.raises(ReceiptTimeout):
            settle_version(ctx, 1, unsettled=True)
        with pytest.raises(WritePending):
            settle_version(ctx, 1)
        with pytest.raises(WritePending):
            _settle(ctx, 1, accepted)
        assert not env.chain.version_of(env.run_id, 1).settled
    finally:
        _resume_blocks(env)
    assert settle_version(ctx, 1) == ([], None)  # landed: read from the chain, not sent again
    assert env.chain.version_of(env.run_id, 1).settled
    assert env.chain.run_of(env.run_id).reward_pool == pool - ctx.spec.chain.reward_per_version


def test_a_slash_whose_receipt_times_out_ends_the_pass_before_the_cheater_is_ingested(coordinator_env):
    """The retry's SlashAlreadyDone (our own pending slash) was recorded as a skip and the pass went on
    to ingest with the cheater not yet jailed: its other contribution was accepted and folded."""
    from krill.chain.tx import ReceiptTimeout
    from krill.coordinator.journal import VersionDecision
    from krill.coordinator.loop import Coordinator, LoopOptions
    from krill.coordinator.publish import WritePending
    from krill.db.models import Contribution, ContributionStatus, RejectionCode

    env = coordinator_env()
    (honest, w_honest), (cheat, w_cheat) = env.stake(1), env.stake(2)
    verifier, _ = env.stake(10)
    commits = {}
    for name, account, who, nonce in (("honest", honest, w_honest, 0), ("bad", cheat, w_cheat, 0),
                                      ("later", cheat, w_cheat, 1)):
        header, files = env.produce(who, nonce=nonce, forge_rewards=name == "bad")
        env.upload(header, files)
        commits[name] = env.commit(account, header)
    env.chain.as_account(verifier).attest(commits["bad"], False, hashlib.sha256(b"rewards differ").digest())

    ctx, indexer = env.context()
    lines: list[str] = []
    coordinator = Coordinator(ctx, indexer, LoopOptions(eval_every=0), echo=lines.append)
    _stop_blocks(env)
    try:
        with pytest.raises(ReceiptTimeout):
            coordinator.step()  # the slash is sent; its receipt does not come
        with pytest.raises(WritePending):
            coordinator.step()  # the retry meets it pending: the pass ends before ingest
        with ctx.db.session() as s:
            assert s.get(VersionDecision, (ctx.run_hex, 1)) is None
            assert s.get(Contribution, commits["later"]) is None
    finally:
        _resume_blocks(env)
    assert coordinator.step() == []
    assert env.chain.commit_of(commits["bad"]).slashed and env.chain.stake_of(cheat.address).jailed
    with ctx.db.session() as s:
        later = s.get(Contribution, commits["later"])
        assert (later.status, later.reason_code) == (ContributionStatus.REJECTED, RejectionCode.JAILED)
        assert s.get(VersionDecision, (ctx.run_hex, 1)) is None
    assert not any("skipped" in line for line in lines), lines


def test_a_create_run_cut_by_a_receipt_timeout_is_resumed_and_funded_once(coordinator_env, tiny_model_dir,
                                                                            monkeypatch):
    """A rerun of a create-run whose createRun receipt timed out met RunAlreadyExists for good: the run stood
    unfunded, and no command funded it. Resumed now, and a pending funding is never sent twice."""

    from krill.chain.errors import RunAlreadyExists
    from krill.chain.tx import ReceiptTimeout
    from krill.coordinator.create_run import CreationPending, create_run

    env = coordinator_env()

    def create(name: str):
        return create_run(env.chain, env.store, tiny_model_dir, name=name, num_shards=2, overrides=SMALL_SPEC,
                          fund=3 * TOKEN, save=False)

    _stop_blocks(env)  # createRun is not mined in time
    try:
        with pytest.raises(ReceiptTimeout):
            create("cut-at-create")
        with pytest.raises(CreationPending):
            create("cut-at-create")  # still pending: nothing is sent
    finally:
        _resume_blocks(env)
    created = create("cut-at-create")
    run_id = bytes.fromhex(created.run_id)
    assert env.chain.run_of(run_id).reward_pool == 3 * TOKEN and created.funded == 3 * TOKEN
    assert created.block_number == env.chain.run_of(run_id).created_block
    with pytest.raises(RunAlreadyExists):
        create("cut-at-create")  # funded: refused as before

    fund_rewards = env.chain.fund_rewards

    def fund_late(*args):
        _stop_blocks(env)
        return fund_rewards(*args)

    monkeypatch.setattr(env.chain, "fund_rewards", fund_late)
    try:
        with pytest.raises(ReceiptTimeout):
            create("cut-at-fund")
        monkeypatch.setattr(env.chain, "fund_rewards", fund_rewards)
        with pytest.raises(CreationPending):
            create("cut-at-fund")  # the funding is pending: not sent again
    finally:
        _resume_blocks(env)
    with pytest.raises(RunAlreadyExists) as refused:
        create("cut-at-fund")  # the first funding landed: nothing more
    assert env.chain.run_of(refused.value.named_args["run_id"]).reward_pool == 3 * TOKEN


def test_a_create_run_cut_while_its_funding_is_pending_has_saved_the_new_run_id(coordinator_env, tiny_model_dir,
                                                                                  monkeypatch):
    """The id was saved only after the funding: cut there (and the rerun refused once the funding landed), the
    run id file kept the run before it, which `krill coordinator run` then served."""

    from krill.chain.errors import RunAlreadyExists
    from krill.chain.tx import ReceiptTimeout
    from krill.coordinator.create_run import create_run, saved_run_id, saved_run_path

    env = coordinator_env()
    monkeypatch.setenv("KRILL_HOME", str(env.root))
    saved_run_path().parent.mkdir(parents=True, exist_ok=True)
    saved_run_path().write_text("ab" * 32 + "\n")  # the run created before this one
    fund_rewards = env.chain.fund_rewards

    def fund_late(*args):
        _stop_blocks(env)
        return fund_rewards(*args)

    def create():
        return create_run(env.chain, env.store, tiny_model_dir, name="cut-at-fund-saved", num_shards=2,
                          overrides=SMALL_SPEC, fund=2 * TOKEN)

    monkeypatch.setattr(env.chain, "fund_rewards", fund_late)
    try:
        with pytest.raises(ReceiptTimeout):
            create()
    finally:
        _resume_blocks(env)
    run_id = bytes.fromhex(saved_run_id())
    assert run_id != bytes.fromhex("ab" * 32)
    assert env.chain.run_of(run_id).reward_pool == 2 * TOKEN and env.chain.run_of(run_id).created_block > 0
    monkeypatch.setattr(env.chain, "fund_rewards", fund_rewards)
    with pytest.raises(RunAlreadyExists):
        create()  # funded: refused as before, and nothing more is sent
    assert env.chain.run_of(run_id).reward_pool == 2 * TOKEN and saved_run_id() == run_id.hex()


def test_a_slash_out_of_gas_twice_waits_for_a_later_pass_instead_of_stopping_the_loop(coordinator_env, monkeypatch):
    """A slash loops over the commit's failing verifiers, and any staked account may attest failing until the
    window closes: failing verdicts sent ahead of the slash (a higher tip) outgrow its estimate. The transactor
    sends it once more; out of gas again, `TransactionOutOfGas` (no effect but its fee) stopped the loop."""
    from krill.chain.tx import TransactionOutOfGas
    from krill.coordinator.loop import Coordinator, LoopOptions

    env = coordinator_env()
    (cheat, w_cheat), (verifier, _) = env.stake(2), env.stake(10)
    header, files = env.produce(w_cheat, nonce=0, forge_rewards=True)
    env.upload(header, files)
    bad = env.commit(cheat, header)
    env.chain.as_account(verifier).attest(bad, False, hashlib.sha256(b"rewards differ").digest())
    ctx, indexer = env.context()
    tx, starved = ctx.chain._tx, []
    estimate = tx._gas_limit

    def outgrown(probe, what):  # the first two sends of the slash: the state grew past their estimate
        if what == "slash" and len(starved) < 2:
            starved.append(what)
            return 60_000
        return estimate(probe, what)

    monkeypatch.setattr(tx, "_gas_limit", outgrown)
    lines: list[str] = []
    coordinator = Coordinator(ctx, indexer, LoopOptions(poll_interval_s=0.1, eval_every=0, max_backoff_s=0.2),
                              echo=lines.append)
    stop, outcome = threading.Event(), {}

    def run() -> None:
        try:
            coordinator.run(stop)
            outcome["ended"] = None
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            outcome["ended"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: env.chain.commit_of(bad).slashed or not thread.is_alive(), 60, "the slash to land")
    finally:
        stop.set()
        thread.join(60)
    assert outcome.get("ended") is None, outcome
    assert len(starved) == 2 and env.chain.commit_of(bad).slashed and env.chain.stake_of(cheat.address).jailed
    assert any(line.startswith("waiting") and TransactionOutOfGas.__name__ in line for line in lines), lines
