"""Publish a decided version: fold, store the content, then `publishVersion`; idempotent after a crash.

Design decisions:
- Input is only the journal row (`VersionDecision`) plus public state: the parent version, the
  learner versions the contributions were computed at, and the contributions' gradient files
  (content-addressed). Weights come from the journal's strings (`float(repr(x)) == x`), so the
  fold, and with it every published byte, is the same whether it runs once or again after a
  `kill -9`.
- The chain is the commit point. Before publishing, the chain's latest version is read: if it
  holds t - 1, the content is (re)computed, stored (idempotent: content-addressed) and published;
  if it already holds t (we crashed after the transaction), the content is recomputed and stored
  again, checked against the published digest, and the row is marked published. Anything else
  means another coordinator publishes this run, and we stop with an error.
- The optimizer states (two thirds of a version's bytes: AdamW's two moments per weight) are
  named in the record before the transaction and written after it (`defer_states`): the workers
  wait for the publication and read only the weights and masks, so the states' writes leave the
  version's critical path (the store before the transaction fell from 86 to 60 ms a demo version
  in paired demos, 2026-12-06; on the demo's shared cores the writes after it still cost the
  CPU, so its seconds per version hardly moved). They are stored only at every
  `optimizer_state_every`-th version (default 10): in between the record names them by sha256, and
  a restart replays the folds since the last stored ones (`RunContext.fold_inputs`). A default
  demo's store fell from 5.2 to 2.45 GB (400 versions, 2026-12-06). The row is marked
  published only once they are stored, so a crash in between leaves it `stored`, and the restart
  recomputes and writes them (the recovery above).
- Once the transaction has landed, the new version's state is cached as the fold left it in memory
  (tensors, optimizer states: the bytes just stored), so the next fold does not read back and
  re-hash what this process wrote (about a tenth of a demo version's coordinator time). After a
  restart, or when the chain already held the version, it is loaded from chain and store.
- The contributions the version folds are pinned in this coordinator's store when the decision is
  journalled (`krill.coordinator.close.pin_decided`: the restart's fold needs them), and again after
  the transaction, with the optimizer states (`pin_folded`; idempotent, and it covers decisions
  journalled before they were pinned there): the record is public from then on, and whoever audits
  or replays it needs them, whether or not their workers keep them.
- `--shards` restricts the fold to the shards this coordinator serves; the others keep their
  weights and optimizer states (their outcome is absent from the record).
- A `publishVersion` whose receipt did not come in time (`ReceiptTimeout`) may still land. The
  retry reads the chain's latest version at `latest`, which is still t - 1 while it is pending,
  and sends again; that send is estimated against the pending block, where our own first
  transaction already made t the latest, and reverts with `VersionNotNext(t, expected=t + 1)`,
  which stopped the coordinator (although t landed once blocks came). Only the run's coordinator
  publishes, so that revert means our publication of t is pending: it is `WritePending`, a passing
  fault for the loop, and once t is on chain the pass takes the recovery above (the digests
  checked against the journal's, nothing published twice). Settle and slash treat their own
  pending writes the same way (`SettleAlreadyDone`, `SlashAlreadyDone` against a chain that says
  not yet).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass

from krill.coordinator.faults import halt_point
from krill.coordinator.journal import DecisionState, VersionDecision
from krill.errors import ChainError
from krill.phases import phase

log = logging.getLogger(__name__)


class CoordinatorStateError(ChainError):
    """The chain disagrees with the coordinator's journal in a way it cannot repair by itself."""


class WritePending(ChainError):
    """A write of this coordinator (publish, settle, slash) is pending on the chain: the pending
    block already holds its effect while the latest block does not (an earlier send whose receipt
    did not come in time). A passing fault: the loop waits and the next pass finds it landed."""


@dataclass
class Published:
    version: int
    manifest_digest: bytes
    record_digest: bytes
    bytes_published: int
    fold_seconds: float
    recovered: bool  # the chain already held it (a crash between the transaction and the journal update)


def submissions(ctx, accepted: list[dict]):
    """The fold's inputs for the journalled accepted entries: Submissions and the learner states they need."""
    from krill.coordinator.close import load_contribution
    from krill.protocol.step import Submission

    subs, states = [], {}
    for entry in accepted:
        v = int(entry["model_version"])
        contribution = load_contribution(ctx, int(entry["commit_id"]), entry["worker"], v)
        if contribution.header.digest.hex() != entry["header_digest"]:
            raise CoordinatorStateError(f"commit {entry['commit_id']}: header digest differs from the journal's")
        states[v] = ctx.state(v)
        values = {s: g.values for s, g in contribution.gradients.items()}
        subs.append(Submission(commit_id=int(entry["commit_id"]), weight=float(entry["weight"]), model_version=v,
                               values=values))
    return subs, states


def build_content(ctx, row: VersionDecision):
    """Fold and store version `row.version` but for its optimizer states; returns (state, bytes
    published, pending states): the new version's `VersionState` holding the folded tensors and
    optimizer states, and the states to store with `store.put_prepared` once it is published."""
    from krill.protocol.record import AcceptedEntry, RejectedEntry
    from krill.protocol.step import fold_version, folded_state, publish_version_content

    parent = ctx.state(row.version - 1)
    subs, states = submissions(ctx, row.accepted)
    # The settings journalled with the decision, so a restart with other ones rebuilds the same bytes.
    shards = row.served_shards if row.served_shards is not None else ctx.shards
    keep = row.keep_states if row.keep_states is not None else ctx.keeps_states(row.version)
    results = fold_version(ctx.spec, parent, subs, states, shards=shards)
    with phase("store"):
        content = publish_version_content(
            ctx.store, ctx.spec, parent, results, [AcceptedEntry(**e) for e in row.accepted],
            [RejectedEntry(**e) for e in row.rejected], row.closed_by, defer_states=True, keep_states=keep)
    changed = {r.shard for r in results if r.submissions > 0}
    sent = len(content.manifest.canonical_bytes()) + len(content.record.encode()) + content.masks_bytes
    sent += sum(s.size for s in content.manifest.shards if s.index in changed)
    sent += sum(p.size for p in content.pending_states)  # the optimizer states, where this version stores them
    return folded_state(ctx.store, ctx.spec, parent, results, content), sent, content.pending_states


def store_states(ctx, pending) -> None:
    """Write the optimizer states `build_content` left pending (idempotent: content-addressed)."""
    with phase("store_states"):
        for prepared in pending:
            ctx.store.put_prepared(prepared, pin=True)


def pin_folded(ctx, accepted: list[dict]) -> None:
    """Pin the header and every file of each contribution the version folded, so that this
    coordinator's store keeps what the published record names whatever its authors do (a worker
    may unpin its uploads or go away; `krill audit` and a restart's replay need them). A pin the
    store refuses is logged, not raised: the version stands, and is replayable while the content
    lasts anywhere."""
    from krill.coordinator.close import load_contribution
    from krill.errors import KrillError

    with phase("pin"):
        for entry in accepted:
            try:
                c = load_contribution(ctx, int(entry["commit_id"]), entry["worker"], int(entry["model_version"]))
                ctx.store.pin_all([c.header.cid, *(ref.cid for _, ref in sorted(c.header.files.items()))])
            except KrillError as exc:
                log.warning("commit %s: its content could not be pinned (%s)", entry["commit_id"], exc)


def complete_version(ctx, version: int) -> Published:
    """Bring journalled `version` to the chain (whatever step a crash interrupted)."""
    from krill.chain.errors import VersionNotNext

    with ctx.db.session() as s:
        row = s.get(VersionDecision, (ctx.run_hex, version))
    if row is None:
        raise CoordinatorStateError(f"version {version} has no journalled decision")
    latest = ctx.chain.run_of(ctx.run_id).latest_version
    if latest >= version:  # crashed after the transaction: the optimizer states may not be stored
        info = ctx.chain.version_of(ctx.run_id, version)
        state, sent, pending = build_content(ctx, row)
        digest = hashlib.sha256(state.manifest.canonical_bytes()).digest()
        if (digest, state.record.digest) != (info.manifest_digest, info.record_digest):
            raise CoordinatorStateError(f"version {version} recomputed from the journal differs from the published one "
                                        f"(manifest {digest.hex()} against {info.manifest_digest.hex()}): "
                                        "another coordinator publishes this run?")
        store_states(ctx, pending)
        pin_folded(ctx, row.accepted)
        _mark(ctx, version, DecisionState.PUBLISHED, info.manifest_digest, info.record_digest, sent)
        return Published(version, info.manifest_digest, info.record_digest, sent, 0.0, True)
    if latest != version - 1:
        raise CoordinatorStateError(f"the chain's latest version is {latest}, the journal is at {version}: "
                                    "another coordinator publishes this run?")
    started = time.perf_counter()
    state, sent, pending = build_content(ctx, row)
    seconds = time.perf_counter() - started
    manifest_digest, record = hashlib.sha256(state.manifest.canonical_bytes()).digest(), state.record
    _mark(ctx, version, DecisionState.STORED, manifest_digest, record.digest, sent)
    halt_point("stored")
    with phase("publish_tx"):
        try:
            ctx.chain.publish_version(ctx.run_id, version, manifest_digest, record.digest)
        except VersionNotNext as exc:
            if exc.named_args["expected"] != version + 1:
                raise
            raise WritePending(f"version {version}: its publishVersion is pending (the chain's latest block says "
                               f"{latest}, the pending one {version}): an earlier send whose receipt did not come "
                               "in time; waiting for it to land") from exc
    halt_point("published")
    store_states(ctx, pending)
    pin_folded(ctx, row.accepted)
    _mark(ctx, version, DecisionState.PUBLISHED, manifest_digest, record.digest, sent)
    ctx.adopt(state)
    return Published(version, manifest_digest, record.digest, sent, seconds, False)


def _mark(ctx, version: int, state: DecisionState, manifest_digest: bytes, record_digest: bytes,
          sent: int | None) -> None:
    with ctx.db.write() as s:
        row = s.get(VersionDecision, (ctx.run_hex, version))
        if row.manifest_digest is not None and row.manifest_digest != manifest_digest.hex():
            raise CoordinatorStateError(f"version {version}: manifest digest {manifest_digest.hex()} differs from "
                                        f"the journalled {row.manifest_digest} (non-deterministic fold?)")
        row.state, row.manifest_digest, row.record_digest = state, manifest_digest.hex(), record_digest.hex()
        row.bytes_published = sent
