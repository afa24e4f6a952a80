"""The aggregation record of a version: what was folded, how, and the resulting public state.

Design decisions:
- Published with every version (v >= 1) as canonical JSON; its sha256 is the `recordDigest` of
  `publishVersion`, and it is stored so that its CID follows from that digest (one raw block while
  it fits 256 KiB, which a record of a few hundred contributions does). With the parent's
  public state it is everything `krill audit` needs to recompute the version bit for bit.
- Weights and the trust they came from are written as decimal strings of the float64 the
  coordinator used (`repr`), so the audit feeds the aggregation exactly the same numbers.
- Rejections are part of the record too: a contribution is never silently dropped.
- Format 2 adds the version's gradient masks (`masks_cid`, `masks_sha256`): derived from the
  optimizer states the record names, published so that workers need not fetch those states.
- A stepped shard's optimizer state is always named by sha256, but by CID only at the versions
  the coordinator stores states (every `optimizer_state_every`): in between, whoever needs it
  replays the folds from the last stored one (`krill.protocol.state`) and checks the sha256.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, ConfigDict, Field, model_validator

from krill.errors import PayloadError

RECORD_FORMAT = "krill-aggregation-record/2"
MAX_RECORD_BYTES = 256 * 1024
MAX_ACCEPTED_PER_VERSION = 200  # accepted entries one record names at most (the rest wait for the next version)
MAX_REJECTED_PER_RECORD = 100   # rejections one record names at most (the rest wait for the next record)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AcceptedEntry(_Strict):
    commit_id: int = Field(ge=1)
    worker: str = Field(pattern=r"^0x[0-9a-f]{40}$")
    header_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    model_version: int = Field(ge=0, description="Learner version the gradient was computed at (its mask's version).")
    behaviour_version: int = Field(ge=0, description="Version the rollouts were sampled from.")
    staleness: int = Field(ge=0, description="This version - 1 - model_version.")
    trust: str = Field(description="Trust used (float64 repr).")
    weight: str = Field(description="trust x staleness weight (float64 repr).")
    shards: list[int] = Field(description="Shards this contribution carried gradients for.")
    mean_reward: str = Field(description="Mean reward of its rollouts (float32 repr), for metrics.")
    tokens: int = Field(ge=0, description="Completion tokens sampled.")


class RejectedEntry(_Strict):
    commit_id: int = Field(ge=1)
    worker: str = Field(pattern=r"^0x[0-9a-f]{40}$")
    reason_code: str = Field(pattern=r"^[a-z_]{1,40}$")
    reason: str = Field(max_length=500)


class ShardOutcome(_Strict):
    shard: int = Field(ge=0)
    submissions: int = Field(ge=0)
    optimizer_state_cid: str | None = Field(
        description="AdamW state after this version's step, where stored (None: never stepped, or not stored at "
                    "this version: the coordinator stores them every few versions, and the state named by the "
                    "sha256 below is replayed from the last stored one).")
    optimizer_state_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$",
                                               description="sha256 of that state (None: not stepped at this version).")
    trimmed_fractions: list[str] = Field(default_factory=list, description="Per accepted submission, in order.")
    clipped: int = 0
    update_norm: str = "0.0"
    grad_norm: str = "0.0"

    @model_validator(mode="after")
    def _state_named_when_stepped(self) -> ShardOutcome:
        if (self.submissions > 0) != (self.optimizer_state_sha256 is not None):
            raise ValueError(f"shard {self.shard}: an optimizer state sha256 goes with submissions, and only then")
        if self.optimizer_state_cid is not None and self.optimizer_state_sha256 is None:
            raise ValueError(f"shard {self.shard}: an optimizer state CID without its sha256")
        return self


class AggregationRecord(_Strict):
    format: str = Field(RECORD_FORMAT, pattern=r"^krill-aggregation-record/2$")
    run_id: str = Field(pattern=r"^[0-9a-f]{64}$")
    version: int = Field(ge=1)
    parent_manifest_cid: str
    parent_record_cid: str | None = Field(description="Record of the parent version (None for version 1).")
    manifest_cid: str
    rule: dict = Field(description="The aggregation rule and its parameters (as in the run spec).")
    accepted: list[AcceptedEntry]
    rejected: list[RejectedEntry]
    shards: list[ShardOutcome]
    masks_cid: str = Field(description="Public gradient masks of this version (krill-masks/1 blob).")
    masks_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    closed_by: str = Field(pattern=r"^(count|deadline)$", description="Why the version closed.")

    def encode(self) -> bytes:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode()

    @property
    def digest(self) -> bytes:
        return hashlib.sha256(self.encode()).digest()

    @classmethod
    def decode(cls, data: bytes) -> AggregationRecord:
        if len(data) > MAX_RECORD_BYTES:
            raise PayloadError(f"{len(data)} bytes, over the cap of {MAX_RECORD_BYTES}", field="record")
        try:
            record = cls.model_validate_json(data)
        except ValueError as exc:
            raise PayloadError(f"not a valid aggregation record: {exc}", field="record") from None
        if record.encode() != data:
            raise PayloadError("aggregation record is not in canonical form", field="record")
        return record


def publish_record(store, record: AggregationRecord) -> str:
    """Store the record so its CID follows from its digest; returns the CID."""
    from krill.store.cid import digest_to_cid

    data = record.encode()
    if len(data) > MAX_RECORD_BYTES:
        raise PayloadError(f"record of {len(data)} bytes exceeds {MAX_RECORD_BYTES}", field="record")
    cid = store.add(data, pin=True)
    if cid != digest_to_cid(record.digest):
        raise PayloadError(f"store answered CID {cid} for the record", field="record")
    return cid


def load_record(store, digest: bytes) -> AggregationRecord:
    """The record whose sha256 is `digest` (from `publishVersion`)."""
    from krill.store.cid import digest_to_cid

    data = store.get(digest_to_cid(digest), max_bytes=MAX_RECORD_BYTES)
    if hashlib.sha256(data).digest() != digest:
        raise PayloadError("content does not hash to the record digest", field="record")
    return AggregationRecord.decode(data)


# Worst-case bytes of the record's parts a decision does not know yet (they come from the fold).
RECORD_FIXED_BYTES = 4096  # run id, CIDs, rule, masks, closing reason and the keys around them
SHARD_FIXED_BYTES = 400    # one shard's outcome without its trimmed fractions (CID, sha256, norms)
FRACTION_BYTES = 26        # one trimmed fraction: a float64 repr in [0, 1] (<= 23 characters), quotes, comma


def fitting_entries(accepted: list[dict], rejected: list[dict], num_shards: int) -> tuple[int, int]:
    """(accepted, rejected): how many of each list (in order) keep the record within
    `MAX_RECORD_BYTES` with every shard's outcome, at the worst case of each figure the fold adds.
    Rejections take at most half of what the fixed parts leave (a 500-character reason can take
    6 kB as JSON escapes: 12 bytes for a character outside the BMP); accepted entries take the
    rest, at least one."""
    def size(value) -> int:  # as AggregationRecord.encode writes it
        return len(json.dumps(value, sort_keys=True, separators=(",", ":")))

    budget = MAX_RECORD_BYTES - RECORD_FIXED_BYTES - num_shards * SHARD_FIXED_BYTES
    n_rejected, half = 0, budget // 2
    for entry in rejected:
        if half - size(entry) - 1 < 0:
            break
        half -= size(entry) + 1
        n_rejected += 1
    budget -= size(rejected[:n_rejected])
    for n, entry in enumerate(accepted):
        budget -= size(entry) + 1 + num_shards * FRACTION_BYTES
        if budget < 0:
            return max(1, n), n_rejected
    return len(accepted), n_rejected


def had_room(record: AggregationRecord, num_shards: int) -> bool:
    """Whether `record` could have named one more rejection and one more accepted entry, each at its
    largest, by the coordinator's own rule (`fitting_entries`, the count caps). When it could not,
    something may have waited for a later record; when it could, nothing decided before the version
    closed had to."""
    accepted = [e.model_dump(mode="json") for e in record.accepted]
    rejected = [e.model_dump(mode="json") for e in record.rejected]
    worst_rejected = RejectedEntry(commit_id=(1 << 256) - 1, worker="0x" + "f" * 40, reason_code="x" * 40,
                                   reason="\U0010ffff" * 500).model_dump(mode="json")
    worst_accepted = AcceptedEntry(commit_id=(1 << 256) - 1, worker="0x" + "f" * 40, header_digest="f" * 64,
                                   model_version=(1 << 64) - 1, behaviour_version=(1 << 64) - 1,
                                   staleness=(1 << 64) - 1, trust=repr(0.1 + 0.2), weight=repr(0.1 + 0.2),
                                   shards=list(range(num_shards)), mean_reward=repr(-1.2345679e-38),
                                   tokens=(1 << 64) - 1).model_dump(mode="json")
    if len(rejected) >= MAX_REJECTED_PER_RECORD or len(accepted) >= MAX_ACCEPTED_PER_VERSION:
        return False
    return (fitting_entries([], rejected + [worst_rejected], num_shards)[1] == len(rejected) + 1
            and fitting_entries(accepted + [worst_accepted], rejected, num_shards)[0] == len(accepted) + 1)
