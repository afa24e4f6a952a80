"""Settle a published version: its reward split among the workers it folded, pro rata by weight.

Design decisions:
- The amount is `spec.chain.reward_per_version` (or what is left in the run's pool, if less).
  A worker's share is the sum of the weights of its contributions in the version's record over
  the sum of all weights, computed in exact rationals from the recorded float64 weights, floored
  to token base units; the units left by flooring go one each to the largest remainders. Anyone can
  recompute the split from the record (`krill.protocol.rewards.version_split`).
- The contract settles a version once, with at most MAX_SETTLE_BATCH (64) accounts: when more
  workers took part, the 64 with the largest weights share the reward. Ties follow the run's
  `reward.ties`: a new run's order tied accounts afresh on each version by a hash of the run id, the
  version and the address; a run published before the option keeps lower address first.
- Idempotent: the chain's `settled` flag is read first, so a restart never pays twice (skipped only
  right after this process published the version, when nobody can have settled it).
- The journal row is marked settled by the loop only after the version's figures are reported
  (`journal.mark_settled`): a crash between settling and reporting leaves it published, and the
  restart reads the chain's flag (nothing paid twice) and reports it.
- A settle whose receipt did not come in time may still land. The retry reads the flag at the
  latest block (not settled while it is pending) and sends again, and that send is estimated against
  the pending block, where our own first settle has set the flag: `SettleAlreadyDone`, which
  stopped the coordinator. Only the run's coordinator settles, so it means our settle is pending:
  `WritePending`, a passing fault (the loop waits, and the next pass reads the flag once it landed).
  The version is not marked settled before then: a settle the node drops is sent again.
"""

from __future__ import annotations

from krill.coordinator.journal import VersionDecision
from krill.protocol.rewards import version_split


def settle_version(ctx, version: int, unsettled: bool = False) -> tuple[list[tuple[str, int]], str | None]:
    """Credit `version`'s rewards (once); returns the split and a note when nothing was paid.

    `unsettled`: the caller knows the chain has not settled `version` (this process published it a
    moment ago, and only the run's coordinator settles), which saves reading the flag."""
    with ctx.db.session() as s:
        row = s.get(VersionDecision, (ctx.run_hex, version))
    split, note = [], None
    if unsettled or not ctx.chain.version_of(ctx.run_id, version).settled:
        pool = ctx.chain.run_of(ctx.run_id).reward_pool
        total = min(ctx.spec.chain.reward_per_version, pool)
        split = version_split(ctx.spec, version, total, row.accepted)
        if split:
            send_settle(ctx, version, split)
        else:
            note = f"nothing settled (reward per version {ctx.spec.chain.reward_per_version}, pool {pool})"
    if note is not None:
        with ctx.db.write() as s:
            s.get(VersionDecision, (ctx.run_hex, version)).note = note
    return split, note


def send_settle(ctx, version: int, split: list[tuple[str, int]]) -> None:
    """`settle` of `version` with `split`, sent after the chain's latest block said it is not settled;
    a `SettleAlreadyDone` from the pending block is our own earlier settle: `WritePending`."""
    from krill.chain.errors import SettleAlreadyDone
    from krill.coordinator.publish import WritePending

    try:
        ctx.chain.settle(ctx.run_id, version, [a for a, _ in split], [n for _, n in split])
    except SettleAlreadyDone as exc:
        raise WritePending(f"version {version}: its settle is pending (not settled at the latest block, settled "
                           "in the pending one): an earlier send whose receipt did not come in time; waiting for "
                           "it to land") from exc
