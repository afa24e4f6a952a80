"""What a worker's trust is computed from: the verdicts that count, and its jail state.

Design decisions:
- A verdict counts only if the commit's sealed randomness selected its verifier (the contract's
  draw, `krill.protocol.selection.drawn`). Anyone staked may attest on any commit, which lets
  verifiers corroborate a failure (those verdicts count towards the on-chain slash quorum), but
  an unselected verdict must not move trust: a worker's own sybil verifiers passing its commits
  would otherwise raise its weight from the prior 0.25 towards 1 after a few commits.
- A verdict counts only if its verifier's key was on-chain before the commit's randomness could be
  known: the verifier's first `Staked` event (which fixes its key for good) is in the commit's block
  or earlier, and the randomness is the hash of the block after it. The contract takes any non-zero
  32 bytes as a key, so an account staked after the randomness was sealed could grind a key the draw
  selects on every commit it names (about 1/p^n tries for n commits: 10^3 at the default p = 0.1 for
  three), and a few such sybils passing a cheater's commits lifted its trust from 0.25 to 0.84.
- Failing verdicts on a commit whose quorum the coordinator's replay refuted do not count
  (`krill.coordinator.confirm`).
- Counts are over this run's commits: the run spec's prior is the run's, and another run's
  verdicts judged other work.
- The draw is memoised on its inputs (`krill.protocol.selection.drawn`): every close weighs the same
  workers' verdicts again.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import aliased

from krill.coordinator.trust import Standing
from krill.db.models import ChainEventRow, Commit, Participant, Verdict
from krill.protocol.selection import drawn


def standings(session, run_id: str, workers: set[str], probability_ppm: int,
              refuted: set[int] = frozenset()) -> dict[str, Standing]:
    """{worker: Standing} for `workers` (a worker the index does not know is absent)."""
    if not workers:
        return {}
    names = sorted(workers)
    out = {p.address: [0, 0, bool(p.jailed)] for p in session.scalars(
        select(Participant).where(Participant.address.in_(names)))}
    checker = aliased(Participant)
    keyed = (select(ChainEventRow.account, func.min(ChainEventRow.block_number).label("block"))
             .where(ChainEventRow.kind == "Staked").group_by(ChainEventRow.account).subquery())
    rows = session.execute(
        select(Commit.worker, Commit.commit_id, Commit.randomness, Verdict.ok, checker.ed25519_key)
        .join(Verdict, Verdict.commit_id == Commit.commit_id)
        .join(checker, checker.address == Verdict.verifier)
        .join(keyed, keyed.c.account == Verdict.verifier)
        .where(Commit.run_id == run_id, Commit.worker.in_(names), keyed.c.block <= Commit.block_number)).all()
    for worker, commit_id, randomness, ok, key in rows:
        if worker not in out or randomness is None or key is None or (not ok and commit_id in refuted):
            continue
        if drawn(bytes.fromhex(randomness), commit_id, bytes.fromhex(key), probability_ppm):
            out[worker][0 if ok else 1] += 1
    return {w: Standing(passes, fails, jailed) for w, (passes, fails, jailed) in out.items()}
