"""Public state of a model version, read from chain + store, and the masks that follow from it.

Design decisions:
- A version is (manifest, record); both are located by the digests `publishVersion` put on-chain
  (version 0: the run's base manifest, no record). Everything is verified on fetch.
- The coordinate mask a gradient computed at version v travels on (DESIGN §6) is
  `shared_masks(reference = AdamW momentum after version v's step, seed = H(run, v, name))`:
  public, identical for every party, and changing as the optimizer moves. Version 0, and shards
  never stepped, have no momentum: their masks are the seeded random share alone.
- Those masks are published with the version (`krill.protocol.mask_blob`, named in the record), and
  `masks()` reads them from there: a worker or verifier never fetches optimizer states, which are
  twice the weights' size. Who must not take the coordinator's word for them derives them from the
  momentum instead (`masks_from_momentum`: the audit, which also compares the two); version 0 and
  a coordinator's own new version derive or preload them. The blob is read up to `masks_blob_cap`:
  its bitmaps and a safetensors header entry per tensor. A flat 64 KiB for the whole header
  refused the honest blob of a model with some 600 tensors or more (a 64-layer Qwen2 has 771), so
  no worker or verifier of such a run could read any version after the base.
- Tensors and optimizer states are fetched lazily and cached per object, since a worker needs
  every shard's weights but a coordinator serving some shards needs only those.
- Optimizer states are stored only every few versions (the coordinator's `optimizer_state_every`);
  in between, the record names a state by its sha256 alone. Such a state is replayed: version v's
  fold is run again from version v - 1's state and v's accepted contributions, and must give the
  record's sha256 (else `ModelError`). The inputs come from a `FoldReplay` (the coordinator's
  context, `krill audit`'s source), which also hands out the earlier versions, so a replay walks
  back to the last stored state and forward again, each version once. A version loaded without
  one (a worker, a verifier: they read the published masks, never the states) raises instead.
- A later version keeps the base model's form: its manifest must name the base manifest's
  architecture, tokenizer and parameters (name, shape, dtype, shard), or loading it is a
  `ModelError`. Without the check a partly trusted coordinator could publish a different or much
  larger model (up to 4096 shards of 1 GiB) that every worker and verifier fetched and built; only
  the audit, which rebuilds a version from its parent, would have noticed. The base manifest's form
  is kept per CID (content-addressed, so it never changes), one fetch per process.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Protocol

import torch

from krill.errors import ModelError
from krill.model.manifest import Manifest
from krill.protocol.record import AggregationRecord, load_record
from krill.protocol.spec import RunSpec
from krill.rl.compression import shared_masks


def momentum_from_state(blob: bytes) -> dict[str, torch.Tensor]:
    """The first-moment tensors (`m/<name>`) of a ShardAdamW state blob; ModelError if it is not one."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        tensors = load(blob)
    except (SafetensorError, ValueError) as exc:
        raise ModelError(f"optimizer state: not a valid safetensors file ({exc})") from exc
    return {key[2:]: t for key, t in tensors.items() if key.startswith("m/")}


def masks_blob_cap(shapes: dict[str, torch.Size]) -> int:
    """Most bytes the published masks blob of tensors `shapes` can take: every bitmap, and the safetensors
    header's entry of each tensor (its name, JSON-escaped at worst, dtype, shape and offsets) beside
    64 KiB for the metadata and the rest."""
    bitmaps = sum(math.ceil(math.prod(shape) / 8) for shape in shapes.values())
    return bitmaps + sum(6 * len(name.encode()) + 128 for name in shapes) + 64 * 1024


def derive_masks(spec: RunSpec, version: int, shapes: dict[str, torch.Size],
                 optimizer_states: list[bytes | None]) -> dict[str, torch.Tensor]:
    """The public masks of gradients computed at `version`, from every shard's AdamW state after
    that version's step (None: never stepped)."""
    references: dict[str, torch.Tensor] = {}
    for blob in optimizer_states:
        if blob is not None:
            references.update(momentum_from_state(blob))
    return shared_masks(shapes, references or None, spec.compression, spec.run_id.hex(), version)


class FoldReplay(Protocol):
    """Where a version's fold can be run again: the public inputs of the fold that made a version."""

    def state(self, version: int) -> VersionState:
        """Published `version` (its optimizer states replayable through this object too)."""

    def fold_inputs(self, version: int, record: AggregationRecord) -> tuple[list, dict[int, VersionState]]:
        """The submissions `record` accepted (checked, with the weights it names) and the learner
        versions they were computed at; raises ModelError where one cannot be had."""


@dataclass
class VersionState:
    """One published version of a run."""

    spec: RunSpec
    version: int
    manifest: Manifest
    manifest_cid: str
    record: AggregationRecord | None
    record_cid: str | None
    store: object
    masks_from_momentum: bool = False  # derive the masks instead of reading the published ones
    replay: FoldReplay | None = None  # where optimizer states the store lacks are replayed from
    _tensors: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict, repr=False)
    _opt: dict[int, bytes | None] = field(default_factory=dict, repr=False)
    _masks: dict[str, torch.Tensor] | None = field(default=None, repr=False)

    def preload(self, shard: int, tensors: dict[str, torch.Tensor], optimizer_state: bytes | None) -> None:
        """Set `shard`'s tensors and optimizer state from memory: the ones this version's manifest and
        record name, as the process that folded and stored them holds them."""
        self._tensors[shard], self._opt[shard] = tensors, optimizer_state

    def shard_tensors(self, shard: int) -> dict[str, torch.Tensor]:
        from krill.model.publish import fetch_shard

        if shard not in self._tensors:
            self._tensors[shard] = fetch_shard(self.store, self.manifest, shard)
        return self._tensors[shard]

    def all_tensors(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for shard in range(self.manifest.num_shards):
            out.update(self.shard_tensors(shard))
        return out

    def optimizer_state(self, shard: int) -> bytes | None:
        """The AdamW state blob of `shard` after this version's step (None: never stepped): stored,
        else replayed (see the module docstring)."""
        if shard not in self._opt:
            found = _find_optimizer_state(self.store, self.version, self.record, shard)
            if isinstance(found, int):  # stepped at version `found`, whose state is not stored
                if self.replay is None:
                    raise ModelError(f"the optimizer state of shard {shard} after version {found} is not stored "
                                     "(the coordinator stores them every few versions): it has to be replayed "
                                     "from the run's contributions, which this reader does not fetch")
                if found == self.version:
                    self._replay_fold()
                    if shard not in self._opt:
                        raise ModelError(f"version {self.version}'s record names an optimizer state of shard {shard} "
                                         "that its fold does not step")
                else:
                    self._opt[shard] = self.replay.state(found).optimizer_state(shard)
            else:
                self._opt[shard] = found
        return self._opt[shard]

    def _replay_fold(self) -> None:
        """Replay this version's fold, after the earlier versions' that it needs, oldest first: each
        fold then finds its parent's states in memory, and the recursion stays one level deep
        however many versions lie between stored states."""
        older, version = [], self.version - 1
        while version >= 1:
            state = self.replay.state(version)
            if not state._lacks_states():
                break
            older.append(state)
            version -= 1
        for state in reversed(older):
            state._fold_again()
        self._fold_again()

    def _lacks_states(self) -> bool:
        """Whether this version stepped a shard whose state is neither stored nor in memory."""
        return self.record is not None and any(
            o.optimizer_state_sha256 is not None and o.optimizer_state_cid is None and o.shard not in self._opt
            for o in self.record.shards)

    def _fold_again(self) -> None:
        """Run this version's fold again and keep the optimizer states it gives, each checked
        against the record's sha256."""
        from krill.protocol.step import fold_version

        record, replay = self.record, self.replay
        parent = replay.state(self.version - 1)
        if (parent.manifest_cid, parent.record_cid) != (record.parent_manifest_cid, record.parent_record_cid):
            raise ModelError(f"version {self.version}'s record names another parent than the chain's version "
                             f"{self.version - 1}: its optimizer states cannot be replayed")
        submissions, learners = replay.fold_inputs(self.version, record)
        outcomes = {o.shard: o for o in record.shards}
        for result in fold_version(self.spec, parent, submissions, learners, shards=sorted(outcomes)):
            outcome = outcomes[result.shard]
            if result.submissions != outcome.submissions or (
                    result.submissions and hashlib.sha256(result.optimizer_state).hexdigest()
                    != outcome.optimizer_state_sha256):
                raise ModelError(f"replaying version {self.version}'s fold gives another optimizer state of shard "
                                 f"{result.shard} than the record's sha256 {outcome.optimizer_state_sha256}")
            if result.submissions:
                self._opt[result.shard] = result.optimizer_state

    def preload_optimizer_state(self, shard: int, blob: bytes) -> None:
        """Set `shard`'s optimizer state from memory, when it matches the record's sha256 (an
        audit's recomputation; saves replaying it again)."""
        outcome = next((o for o in self.record.shards if o.shard == shard), None) if self.record else None
        if outcome is not None and outcome.optimizer_state_sha256 == hashlib.sha256(blob).hexdigest():
            self._opt.setdefault(shard, blob)

    def shapes(self) -> dict[str, torch.Size]:
        return {p.name: torch.Size(p.shape) for s in self.manifest.shards for p in s.parameters}

    def preload_masks(self, masks: dict[str, torch.Tensor]) -> None:
        """Set the masks from memory: the ones the process that published this version derived."""
        self._masks = masks

    def masks(self) -> dict[str, torch.Tensor]:
        """The public masks of gradients computed at this version (every tensor of every shard): the
        published blob's, or derived from the momentum (version 0, `masks_from_momentum`)."""
        if self._masks is None:
            if self.record is None or self.masks_from_momentum:
                self._masks = self.derived_masks()
            else:
                self._masks = self.published_masks()
        return self._masks

    def published_masks(self) -> dict[str, torch.Tensor]:
        """The masks the record names, fetched and checked (sha256, names, sizes, density)."""
        from krill.protocol.mask_blob import decode_masks

        if self.record is None:
            raise ModelError("version 0 has no published masks")
        cap = masks_blob_cap(self.shapes())
        blob = self.store.get(self.record.masks_cid, max_bytes=cap)
        if hashlib.sha256(blob).hexdigest() != self.record.masks_sha256:
            raise ModelError(f"masks of version {self.version} do not match the record's sha256")
        return decode_masks(blob, self.shapes(), self.spec.compression, self.spec.run_id.hex(), self.version)

    def derived_masks(self) -> dict[str, torch.Tensor]:
        """The masks derived from the optimizer states (what the published ones must equal)."""
        return derive_masks(self.spec, self.version, self.shapes(),
                            [self.optimizer_state(s) for s in range(self.manifest.num_shards)])


def _find_optimizer_state(store, version: int, record: AggregationRecord | None, shard: int) -> bytes | int | None:
    """Walk back through records from `version`'s to the last version that stepped `shard`: its
    state if stored (checked against the record's sha256), else that version's number (to replay);
    None when no version stepped it."""
    from krill.store.cid import cid_to_digest

    while record is not None:
        outcome = next((s for s in record.shards if s.shard == shard), None)
        if outcome is not None and outcome.optimizer_state_sha256 is not None:
            if outcome.optimizer_state_cid is None:
                return version
            blob = store.get(outcome.optimizer_state_cid)
            if hashlib.sha256(blob).hexdigest() != outcome.optimizer_state_sha256:
                raise ModelError(f"optimizer state of shard {shard} does not match the record's sha256")
            return blob
        if record.parent_record_cid is None:
            return None
        record, version = load_record(store, cid_to_digest(record.parent_record_cid)), version - 1
    return None


def _form(manifest: Manifest) -> tuple:
    """What every version of a run shares with its base: architecture, tokenizer, parameters by shard."""
    from krill.model.manifest import canonical_json

    return (canonical_json(manifest.architecture), manifest.tokenizer,
            tuple((s.index, tuple((p.name, tuple(p.shape), p.dtype) for p in s.parameters)) for s in manifest.shards))


_BASE_FORMS: dict[str, tuple] = {}


def _base_form(store, cid: str) -> tuple:
    from krill.model.publish import load_manifest

    if cid not in _BASE_FORMS:
        if len(_BASE_FORMS) >= 16:
            _BASE_FORMS.clear()
        _BASE_FORMS[cid] = _form(load_manifest(store, cid))
    return _BASE_FORMS[cid]


def load_version(store, spec: RunSpec, version: int, manifest_digest: bytes, record_digest: bytes | None,
                 masks_from_momentum: bool = False, replay: FoldReplay | None = None) -> VersionState:
    """A version from the digests the chain holds for it."""
    from krill.model.publish import load_manifest
    from krill.store.cid import digest_to_cid

    manifest_cid = digest_to_cid(manifest_digest)
    manifest = load_manifest(store, manifest_cid)
    if manifest.version != version:
        raise ModelError(f"manifest {manifest_cid} is version {manifest.version}, the chain says {version}")
    record = record_cid = None
    if version > 0:
        if record_digest is None:
            raise ModelError(f"version {version} has no aggregation record digest")
        record = load_record(store, record_digest)
        record_cid = digest_to_cid(record_digest)
        if record.version != version or record.manifest_cid != manifest_cid:
            raise ModelError(f"record of version {version} names another version or manifest")
        if _form(manifest) != _base_form(store, spec.base_manifest_cid):
            raise ModelError(f"manifest {manifest_cid} of version {version} changes the base model's architecture, "
                             "tokenizer or parameters")
    elif manifest_cid != spec.base_manifest_cid:
        raise ModelError(f"base manifest {manifest_cid} differs from the run spec's {spec.base_manifest_cid}")
    return VersionState(spec, version, manifest, manifest_cid, record, record_cid, store, masks_from_momentum, replay)


def load_chain_version(chain, store, spec: RunSpec, version: int, masks_from_momentum: bool = False,
                       replay: FoldReplay | None = None) -> VersionState:
    """Version `version` of the run `spec` defines, located by the digests the chain holds."""
    info = chain.version_of(spec.run_id, version)
    if info.manifest_digest == b"\x00" * 32:
        raise ModelError(f"version {version} of run {spec.run_id.hex()[:16]}… is not published")
    record = None if version == 0 else info.record_digest
    return load_version(store, spec, version, info.manifest_digest, record, masks_from_momentum, replay)


def load_run(chain, store, run_id: bytes) -> RunSpec:
    """The run spec of on-chain run `run_id`, checked to match the contract's parameters."""
    from krill.errors import ConfigError
    from krill.protocol.spec import load_spec

    run = chain.run_of(run_id)
    if not run.exists:
        raise ConfigError(f"run {run_id.hex()} does not exist on the chain: check run.id")
    spec = load_spec(store, run_id)
    p, c = run.params, spec.chain
    onchain = (p.max_staleness, p.attestation_quorum, p.slash_fraction_bps, p.verifier_bounty_bps,
               p.check_probability_ppm, p.challenge_window_blocks, p.reward_per_version)
    declared = (c.max_staleness, c.attestation_quorum, c.slash_fraction_bps, c.verifier_bounty_bps,
                c.check_probability_ppm, c.challenge_window_blocks, c.reward_per_version)
    if onchain != declared or spec.staleness.max_staleness != p.max_staleness:
        raise ModelError(f"run {run_id.hex()[:16]}…: the spec's chain parameters {declared} differ from the "
                         f"contract's {onchain}")
    return spec
