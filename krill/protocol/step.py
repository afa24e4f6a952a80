"""The version step: fold accepted contributions into new shard weights, deterministically.

Design decisions:
- Input is public: the parent version's tensors and optimizer states, the run spec, and for each
  accepted contribution its weight, learner version and per-shard values on that version's
  public mask. Output is the new tensors, optimizer states and per-shard outcomes. The coordinator
  publishes with it and `krill audit` recomputes with it; the same inputs give the same bits.
- Submissions are processed in commit-id order. Each shard is aggregated over the submissions
  that carry it, in the coordinate space of the union of their masks (equal to the one mask when
  all were computed at the same version, the common case; a late contribution computed at an
  older version has zeros where its mask did not reach). The robust rule runs on that space, the
  result is scattered to dense gradients, and the shard's AdamW takes one step.
- A shard with no submission keeps its weights and optimizer state.
- `publish_version_content` can leave the optimizer states unwritten (`defer_states`): the record
  names them by CID and sha256, and the caller stores them once the version is on-chain (the
  coordinator does, so the publication does not wait for two thirds of a version's bytes). With
  `keep_states=False` it names them by sha256 alone and never stores them: the coordinator keeps
  them only every few versions, and readers replay the folds in between.
- Threads: the fold runs with one torch thread whatever the caller set, and puts the caller's
  count back. torch splits large reductions (norms, sums) across threads, so their last bits
  depend on the thread count; a coordinator on 1 thread and an auditor on 2 then disagreed on
  recorded statistics (seen in a demo's audit). One thread makes the result a function of the
  inputs alone on a given machine and build.
- Across machines: a new run's rule names `reductions = "fixed-tree"`, and then the aggregation's
  norms and distances, the optimizer's gradient norm and the update norm are summed by
  `krill.rl.fixed_sum`'s tree, whose bits do not depend on the CPU's vector width (torch's kernels'
  do: an auditor on another CPU failed honest versions). A run published before it keeps torch's.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from krill.errors import ModelError
from krill.phases import phase
from krill.protocol.spec import RunSpec
from krill.rl import fixed_sum
from krill.rl.aggregate import aggregate
from krill.rl.optimizer import ShardAdamW


@dataclass(frozen=True)
class Submission:
    """One accepted contribution as the step sees it."""

    commit_id: int
    weight: float
    model_version: int
    values: dict[int, dict[str, np.ndarray]]  # shard -> tensor name -> float32 values on the mask


@dataclass(frozen=True)
class ShardResult:
    shard: int
    submissions: int
    tensors: dict[str, torch.Tensor]
    optimizer_state: bytes | None
    trimmed_fractions: list[float]
    clipped: int
    update_norm: float
    grad_norm: float


def fold_shard(spec: RunSpec, shard: int, names: list[str], parent_tensors: dict[str, torch.Tensor],
               parent_state: bytes | None, submissions: list[Submission],
               masks_by_version: dict[int, dict[str, torch.Tensor]]) -> ShardResult:
    """Aggregate one shard's submissions and take its optimizer step."""
    subs = sorted((s for s in submissions if shard in s.values), key=lambda s: s.commit_id)
    tensors = {n: parent_tensors[n].detach().clone().to(torch.float32) for n in names}
    if not subs:
        return ShardResult(shard, 0, tensors, parent_state, [], 0, 0.0, 0.0)
    # The union of the masks involved, per tensor, and each submission's positions in it.
    unions: dict[str, torch.Tensor] = {}
    for n in names:
        idx = [masks_by_version[v][n] for v in sorted({s.model_version for s in subs})]
        unions[n] = idx[0] if len(idx) == 1 else torch.unique(torch.cat(idx))
    widths = [int(unions[n].numel()) for n in names]
    with phase("aggregate"):
        rows = torch.zeros((len(subs), sum(widths)), dtype=torch.float32)
        for r, sub in enumerate(subs):
            col = 0
            for n, width in zip(names, widths, strict=True):
                mask = masks_by_version[sub.model_version][n]
                values = torch.from_numpy(np.ascontiguousarray(sub.values[shard][n], dtype=np.float32))
                if values.numel() != mask.numel():
                    raise ModelError(f"commit {sub.commit_id}: {n} has {values.numel()} values for a mask of {mask.numel()}")
                target = rows[r, col:col + width]
                if mask is unions[n]:  # computed at the only learner version: its mask is the union
                    target.copy_(values)
                else:
                    target.index_copy_(0, torch.searchsorted(unions[n], mask), values)
                col += width
        weights = torch.tensor([s.weight for s in subs], dtype=torch.float64)
        agg, stats = aggregate(rows, weights, spec.rule)
        grads: dict[str, torch.Tensor] = {}
        for n, part in zip(names, torch.split(agg.to(torch.float32), widths), strict=True):
            dense = torch.zeros(math.prod(tensors[n].shape), dtype=torch.float32)
            dense.index_copy_(0, unions[n], part)
            grads[n] = dense.view(tensors[n].shape)
    with phase("optimizer"):
        optimizer = ShardAdamW(tensors, spec.optimizer, spec.rule.reductions)
        if parent_state is not None:
            optimizer.load_state_bytes(parent_state)
        before = {n: t.clone() for n, t in tensors.items()}
        grad_norm = optimizer.step(grads)
        if spec.rule.reductions == "fixed-tree":
            update = fixed_sum.norm_of(tensors[n] - before[n] for n in names)
        else:
            update = math.sqrt(sum(float((tensors[n] - before[n]).double().pow(2).sum()) for n in names))
        out = {n: tensors[n].to(parent_tensors[n].dtype) for n in names}
        state_bytes = optimizer.state_bytes()
    return ShardResult(shard, len(subs), out, state_bytes, list(stats.trimmed_fractions),
                       stats.clipped, update, grad_norm)


def masks_by_version(states: dict[int, object]) -> dict[int, dict[str, torch.Tensor]]:
    """The public masks of each learner version among `states` (version -> VersionState)."""
    return {v: state.masks() for v, state in states.items()}


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the block with one torch thread; restore the caller's count afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def fold_version(spec: RunSpec, parent, submissions: list[Submission], learner_states: dict[int, object],
                 shards: list[int] | None = None) -> list[ShardResult]:
    """Fold every (or the listed) shard of `parent` (a VersionState) with `submissions`, on one thread."""
    with one_thread():
        return _fold_version(spec, parent, submissions, learner_states, shards)


def _fold_version(spec: RunSpec, parent, submissions: list[Submission], learner_states: dict[int, object],
                  shards: list[int] | None) -> list[ShardResult]:
    masks = masks_by_version(learner_states)
    missing = {s.model_version for s in submissions} - set(masks)
    if missing:
        raise ModelError(f"no public state for learner versions {sorted(missing)}")
    out = []
    for shard in (range(parent.manifest.num_shards) if shards is None else shards):
        names = parent.manifest.shard_names(shard)
        out.append(fold_shard(spec, shard, names, parent.shard_tensors(shard), parent.optimizer_state(shard),
                              submissions, masks))
    return out


class VersionContent(NamedTuple):
    """What `publish_version_content` stored."""

    manifest: object
    manifest_cid: str
    record: object
    masks: dict[str, torch.Tensor]  # the new version's public masks, as derived
    masks_bytes: int  # size of their published blob
    # Optimizer states the record names but that are not stored yet (`defer_states`): the caller
    # stores them with `store.put_prepared` once it has published the version.
    pending_states: tuple = ()


def new_optimizer_states(parent, results: list[ShardResult]) -> list[bytes | None]:
    """Every shard's AdamW state after the new version's step: the fold's, or the parent's where the
    shard had no submissions or was not folded."""
    folded = {r.shard: r.optimizer_state for r in results if r.submissions > 0}
    return [folded[s] if s in folded else parent.optimizer_state(s) for s in range(parent.manifest.num_shards)]


def publish_version_content(store, spec: RunSpec, parent, results: list[ShardResult], accepted: list,
                            rejected: list, closed_by: str, defer_states: bool = False,
                            keep_states: bool = True) -> VersionContent:
    """Store the new shards, optimizer states, masks, manifest and record.

    `defer_states`: name the optimizer states in the record (CID and sha256) without storing them,
    and return them as `pending_states`; two thirds of a version's bytes, which no worker reads.
    `keep_states=False`: name them by sha256 only and never store them (they are replayed from the
    last version that kept them, `krill.protocol.state`)."""
    import hashlib

    from krill.model.publish import publish_update
    from krill.protocol.mask_blob import encode_masks
    from krill.protocol.record import AggregationRecord, ShardOutcome, publish_record
    from krill.protocol.state import derive_masks

    changed = {r.shard: r.tensors for r in results if r.submissions > 0}
    if changed:
        manifest, manifest_cid = publish_update(store, parent.manifest, parent.manifest_cid, changed, parent.version + 1)
    else:
        raise ModelError("a version needs at least one shard with submissions")
    outcomes, pending = [], []
    for r in results:
        cid = sha = None
        if r.submissions > 0:
            sha = hashlib.sha256(r.optimizer_state).hexdigest()
            if keep_states and defer_states:
                pending.append(store.prepare(r.optimizer_state))
                cid = pending[-1].cid
            elif keep_states:
                cid = store.add(r.optimizer_state, pin=True)
        outcomes.append(ShardOutcome(shard=r.shard, submissions=r.submissions, optimizer_state_cid=cid,
                                     optimizer_state_sha256=sha, trimmed_fractions=[repr(float(x)) for x in r.trimmed_fractions],
                                     clipped=r.clipped, update_norm=repr(float(r.update_norm)),
                                     grad_norm=repr(float(r.grad_norm))))
    version = parent.version + 1
    with phase("publish_masks"):
        shapes = parent.shapes()
        masks = derive_masks(spec, version, shapes, new_optimizer_states(parent, results))
        blob = encode_masks(masks, shapes, spec.run_id.hex(), version)
        masks_cid = store.add(blob, pin=True)
    record = AggregationRecord(run_id=spec.run_id.hex(), version=version,
                               parent_manifest_cid=parent.manifest_cid, parent_record_cid=parent.record_cid,
                               manifest_cid=manifest_cid, rule=spec.rule.model_dump(mode="json"),
                               accepted=accepted, rejected=rejected, shards=outcomes,
                               masks_cid=masks_cid, masks_sha256=hashlib.sha256(blob).hexdigest(), closed_by=closed_by)
    publish_record(store, record)
    return VersionContent(manifest, manifest_cid, record, masks, len(blob), tuple(pending))


def folded_state(store, spec: RunSpec, parent, results: list[ShardResult], content: VersionContent):
    """The version `publish_version_content` stored, as a VersionState holding the fold's tensors,
    optimizer states and masks in memory (what loading it back from the store would give, without
    the reads)."""
    from krill.protocol.state import VersionState
    from krill.store.cid import digest_to_cid

    state = VersionState(spec, parent.version + 1, content.manifest, content.manifest_cid, content.record,
                         digest_to_cid(content.record.digest), store)
    state.preload_masks(content.masks)
    for r in results:  # a shard without submissions keeps the parent's tensors (same CIDs) and state
        if r.submissions > 0:
            state.preload(r.shard, r.tensors, r.optimizer_state)
        else:
            state.preload(r.shard, parent.shard_tensors(r.shard), parent.optimizer_state(r.shard))
    return state
