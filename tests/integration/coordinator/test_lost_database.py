"""A coordinator whose database is lost (a new machine, a wiped SQLite file, a fresh PostgreSQL) never
folds again what the run's published versions already folded: the chain and the records say what
they did, and a contribution is applied once."""

from __future__ import annotations

import pytest
from conftest import step  # at import: later, 'conftest' is whichever ran last
from sqlalchemy import select

from krill.db.models import Contribution, ContributionStatus

SPEC = {"rollout": {"prompts_per_contribution": 2, "group_size": 4},
        "version": {"contributions": 2, "deadline_s": 600.0}, "chain": {"max_staleness": 1}, "eval_n": 8,
        "compression": {"dense_versions": 1}}


def _context(env, name: str):
    from krill.coordinator.context import RunContext
    from krill.db.indexer import Indexer
    from krill.db.session import open_database
    from krill.protocol.state import load_run

    db = open_database(f"sqlite:///{env.root / name}")
    spec = load_run(env.chain, env.store, env.run_id)
    ctx = RunContext(chain=env.chain, store=env.store, db=db, spec=spec, chain_id=env.deployment.chain_id)
    return ctx, Indexer(env.chain, db, env.store, start_block=env.deployment.block_number)


def test_a_coordinator_on_a_new_database_does_not_fold_published_contributions_again(coordinator_env):
    from krill.coordinator.loop import Coordinator, LoopOptions
    from krill.protocol.record import load_record

    env = coordinator_env(SPEC)
    workers = [env.stake(index) for index in (1, 2, 3)]
    ids = []
    for account, who in workers[:2]:
        header, files = env.produce(who, nonce=0, version=0)
        env.upload(header, files)
        ids.append(env.commit(account, header, version=0))
    ctx, indexer = _context(env, "first.db")
    assert [f.version for f in step(Coordinator(ctx, indexer, LoopOptions(eval_every=0), echo=lambda _: None))] == [1]
    assert [e.commit_id for e in load_record(env.store, env.chain.version_of(env.run_id, 1).record_digest).accepted] \
        == ids

    # The database is gone; a new one starts from the chain. Version 1's contributions are still
    # within the staleness window of version 2 (S_max = 1), and must not be folded into it again.
    ctx, indexer = _context(env, "second.db")
    coordinator = Coordinator(ctx, indexer, LoopOptions(eval_every=0), echo=lambda _: None)
    assert step(coordinator) == []
    assert env.chain.run_of(env.run_id).latest_version == 1
    with ctx.db.session() as s:
        rows = list(s.scalars(select(Contribution).order_by(Contribution.commit_id)))
    assert [(r.commit_id, r.status, r.aggregated_version) for r in rows] == [
        (i, ContributionStatus.ACCEPTED, 1) for i in ids]

    # A new contribution still goes into version 2, alone with the third worker's.
    account, who = workers[2]
    header, files = env.produce(who, nonce=1, version=1)
    env.upload(header, files)
    fresh = env.commit(account, header, version=1)
    account, who = workers[0]
    header, files = env.produce(who, nonce=1, version=1)
    env.upload(header, files)
    again = env.commit(account, header, version=1)
    assert [f.version for f in step(coordinator)] == [2]
    record = load_record(env.store, env.chain.version_of(env.run_id, 2).record_digest)
    assert [e.commit_id for e in record.accepted] == [fresh, again]


def test_a_version_published_but_not_settled_is_settled_on_a_new_database(coordinator_env, monkeypatch):
    """The loop settles a version right after publishing it, from its journal. A coordinator stopped in
    between whose database was then lost left that version unsettled for good (its workers unpaid): the
    new database's journal has no row for it. Adoption settles it from its record, once."""
    import krill.coordinator.loop as loop
    from krill.coordinator.loop import Coordinator, LoopOptions
    from krill.protocol.record import load_record
    from krill.protocol.rewards import reward_split

    env = coordinator_env(SPEC)
    for account, who in [env.stake(index) for index in (1, 2)]:
        header, files = env.produce(who, nonce=0, version=0)
        env.upload(header, files)
        env.commit(account, header, version=0)
    ctx, indexer = _context(env, "first.db")

    def stopped(*_args, **_kwargs):
        raise KeyboardInterrupt("stopped between publishing and settling")

    monkeypatch.setattr(loop, "settle_version", stopped)
    with pytest.raises(KeyboardInterrupt):
        step(Coordinator(ctx, indexer, LoopOptions(eval_every=0), echo=lambda _: None))
    monkeypatch.undo()
    assert env.chain.run_of(env.run_id).latest_version == 1 and not env.chain.version_of(env.run_id, 1).settled
    pool = env.chain.run_of(env.run_id).reward_pool
    record = load_record(env.store, env.chain.version_of(env.run_id, 1).record_digest)
    split = reward_split(min(env.spec.chain.reward_per_version, pool), [e.model_dump(mode="json") for e in record.accepted])
    assert split

    ctx, indexer = _context(env, "second.db")
    assert step(Coordinator(ctx, indexer, LoopOptions(eval_every=0), echo=lambda _: None)) == []
    assert env.chain.version_of(env.run_id, 1).settled
    assert env.chain.run_of(env.run_id).reward_pool == pool - sum(n for _, n in split)
    ctx, indexer = _context(env, "third.db")  # again on another new database: nothing is paid twice
    assert step(Coordinator(ctx, indexer, LoopOptions(eval_every=0), echo=lambda _: None)) == []
    assert env.chain.run_of(env.run_id).reward_pool == pool - sum(n for _, n in split)
