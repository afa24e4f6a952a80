"""The tables of the Krill database: the chain index, and the roles' own state.

Design decisions:
- Two kinds of tables, on two separate `MetaData` objects so no code can mix them up:
  * `IndexBase` — the index: what the chain (and the content store, for headers and manifests)
    says. Only `krill.db.indexer.Indexer` writes it; `krill index rebuild` drops these tables and
    replays the chain from the deploy block, and gets the same rows. Tables: index_meta (which
    chain and contract, and the cursor), chain_events (every protocol event, the idempotency
    key), runs, versions, shards, participants, commits, headers, verdicts, slashes, rewards.
  * `StateBase` — what the roles decide and keep for themselves, which no indexer can recompute:
    the coordinator's treatment of each commit (contributions), per-version metrics and evals,
    named cursors of role loops, and the schema versions. Rebuild never touches them. They refer
    to index rows by natural key (commit id, run id, version) without foreign keys, so the index
    can be dropped under them.
- Rows that belong to another (a commit's run, a verdict's commit) have a foreign key and a plain
  many-to-one `relationship`, so a session flushes parents first whatever order rows were added.
- Natural keys wherever the chain has one (commit id, run id + version, tx hash + log index);
  no surrogate ids, so a replay produces identical rows and re-running an ingest is a no-op.
- Value spellings (see `krill.db.types`): bytes32 as 64 lowercase hex, addresses 0x-lowercase,
  tx hashes 0x-hex, uint256 (and uint64 values that can pass 2**63) in `Uint` columns; messages that
  quote untrusted input (fetch errors, rejection reasons) in `Message` columns.
- Status columns are Python enums stored as short strings without a database CHECK, so adding a
  value later needs no migration.
- A participant's `trust_alpha` / `trust_beta` are a Beta tally over every verdict on its commits:
  alpha = prior alpha + passing attestations, beta = prior beta + failing ones (prior from the
  indexer's `TrustPrior`, so new workers start low). It is a public summary, not the trust the
  coordinator weighs with: any staked account may attest on any commit, so the tally can be raised
  at will. The coordinator computes trust itself (`krill.coordinator.standing`): from the index's
  commit, verdict, event and participant rows (jail state, verifier keys) it counts only verdicts
  on its run's commits by verifiers the commit's randomness drew, staked no later than the commit's
  block, not failing a quorum its replay refuted, with the run spec's prior; it never reads these
  two columns.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Integer,
    String,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from krill.db.types import Message, Uint

Hex32 = String(64)
Address = String(42)
TxHash = String(66)


def _enum(cls: type[enum.Enum]) -> Enum:
    return Enum(cls, native_enum=False, create_constraint=False, length=32,
                values_callable=lambda e: [m.value for m in e], validate_strings=True)


class FetchStatus(enum.StrEnum):
    """Where fetching a content-store object for the index stands."""

    PENDING = "pending"          # not tried yet
    AVAILABLE = "available"      # fetched, decoded, fields filled
    UNAVAILABLE = "unavailable"  # not in the store (yet): retried on later passes
    INVALID = "invalid"          # fetched but malformed, forged or contradicting the chain: final


class ParticipantRole(enum.IntEnum):
    """The contract's role codes (0: never staked, e.g. an account that was only credited)."""

    NONE = 0
    WORKER = 1
    VERIFIER = 2


class RewardKind(enum.StrEnum):
    REWARD = "reward"  # RewardCredited: a share of a version's reward
    BOUNTY = "bounty"  # BountyCredited: a verifier's share of a slash
    CLAIM = "claim"    # Claimed: credits paid out


class ContributionStatus(enum.StrEnum):
    PENDING = "pending"
    ACCEPTED = "accepted"
    REJECTED = "rejected"


class RejectionCode(enum.StrEnum):
    """Why the coordinator rejected a contribution (the message column says the details)."""

    BAD_SIGNATURE = "bad_signature"
    UNKNOWN_KEY = "unknown_key"
    DIGEST_MISMATCH = "digest_mismatch"
    MALFORMED_PAYLOAD = "malformed_payload"
    STALE = "stale"
    JAILED = "jailed"
    UNAVAILABLE = "unavailable"
    WRONG_ASSIGNMENT = "wrong_assignment"
    WRONG_REWARDS = "wrong_rewards"
    BELOW_TRUST_FLOOR = "below_trust_floor"
    SLASHED = "slashed"
    NO_SERVED_SHARD = "no_served_shard"


# ===================================================================================== index


class IndexBase(DeclarativeBase):
    """Tables rebuilt from chain + store (`krill index rebuild`); written by the Indexer only."""


class IndexMeta(IndexBase):
    """Which deployment this index follows, and the next block to read (a single row, id 1)."""

    __tablename__ = "index_meta"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    chain_id: Mapped[int] = mapped_column(BigInteger)
    protocol: Mapped[str] = mapped_column(Address)
    start_block: Mapped[int] = mapped_column(BigInteger)
    next_block: Mapped[int] = mapped_column(BigInteger)


class IndexAnchor(IndexBase):
    """Block hashes the index was built on: row 1 the start block's (chain id and contract address alone do not
    tell two chains apart: a restarted devnet has the same chain id and, deploying the same way, the same
    address), row 2 the last indexed block's (a reorganisation or restart under a running indexer)."""

    __tablename__ = "index_anchor"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    block_number: Mapped[int] = mapped_column(BigInteger)
    block_hash: Mapped[str] = mapped_column(String(64))


class ChainEventRow(IndexBase):
    """Every protocol event ingested, in chain order; (tx hash, log index) makes ingest idempotent."""

    __tablename__ = "chain_events"

    tx_hash: Mapped[str] = mapped_column(TxHash, primary_key=True)
    log_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    block_number: Mapped[int] = mapped_column(BigInteger, index=True)
    block_time: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(32), index=True)
    run_id: Mapped[str | None] = mapped_column(Hex32, index=True)
    commit_id: Mapped[int | None] = mapped_column(BigInteger, index=True)
    account: Mapped[str | None] = mapped_column(Address, index=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)


class Run(IndexBase):
    __tablename__ = "runs"

    run_id: Mapped[str] = mapped_column(Hex32, primary_key=True)
    coordinator: Mapped[str] = mapped_column(Address)
    base_manifest_digest: Mapped[str] = mapped_column(Hex32)
    max_staleness: Mapped[int] = mapped_column(BigInteger)
    attestation_quorum: Mapped[int] = mapped_column(BigInteger)
    slash_fraction_bps: Mapped[int] = mapped_column(Integer)
    verifier_bounty_bps: Mapped[int] = mapped_column(Integer)
    check_probability_ppm: Mapped[int] = mapped_column(BigInteger)
    challenge_window_blocks: Mapped[int] = mapped_column(BigInteger)
    reward_per_version: Mapped[int] = mapped_column(Uint)
    reward_pool: Mapped[int] = mapped_column(Uint)
    funded_total: Mapped[int] = mapped_column(Uint)
    latest_version: Mapped[int] = mapped_column(BigInteger)
    created_block: Mapped[int] = mapped_column(BigInteger)
    created_tx: Mapped[str] = mapped_column(TxHash)


class Version(IndexBase):
    """A model version of a run (version 0 is the base, from RunCreated) and its manifest."""

    __tablename__ = "versions"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.run_id"), primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    manifest_digest: Mapped[str] = mapped_column(Hex32)
    record_digest: Mapped[str | None] = mapped_column(Hex32)
    published_block: Mapped[int] = mapped_column(BigInteger)
    published_tx: Mapped[str] = mapped_column(TxHash)
    settled: Mapped[bool] = mapped_column(Boolean)
    settled_block: Mapped[int | None] = mapped_column(BigInteger)
    settled_accounts: Mapped[int | None] = mapped_column(Integer)
    settled_total: Mapped[int | None] = mapped_column(Uint)
    manifest_cid: Mapped[str] = mapped_column(String(128))
    manifest_status: Mapped[FetchStatus] = mapped_column(_enum(FetchStatus))
    manifest_attempts: Mapped[int] = mapped_column(Integer)
    manifest_error: Mapped[str | None] = mapped_column(Message)
    parent_cid: Mapped[str | None] = mapped_column(String(128))
    num_shards: Mapped[int | None] = mapped_column(Integer)

    run: Mapped[Run] = relationship()


class Shard(IndexBase):
    """One shard of a version, from its manifest in the store."""

    __tablename__ = "shards"

    run_id: Mapped[str] = mapped_column(Hex32, primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    shard: Mapped[int] = mapped_column(Integer, primary_key=True)
    cid: Mapped[str] = mapped_column(String(128))
    sha256: Mapped[str] = mapped_column(Hex32)
    size: Mapped[int] = mapped_column(BigInteger)
    parameters: Mapped[int] = mapped_column(Integer)
    elements: Mapped[int] = mapped_column(BigInteger)


class Participant(IndexBase):
    """An account the protocol knows: its stake, key, jail state, verdict counts and credits."""

    __tablename__ = "participants"

    address: Mapped[str] = mapped_column(Address, primary_key=True)
    role: Mapped[int] = mapped_column(Integer)
    ed25519_key: Mapped[str | None] = mapped_column(Hex32)
    staked: Mapped[int] = mapped_column(Uint)
    unbonding: Mapped[int] = mapped_column(Uint)
    release_block: Mapped[int] = mapped_column(BigInteger)
    jailed: Mapped[bool] = mapped_column(Boolean)
    jailed_commit_id: Mapped[int | None] = mapped_column(BigInteger)
    slashed_total: Mapped[int] = mapped_column(Uint)
    first_block: Mapped[int] = mapped_column(BigInteger)
    commits: Mapped[int] = mapped_column(Integer)
    checks_passed: Mapped[int] = mapped_column(Integer)
    checks_failed: Mapped[int] = mapped_column(Integer)
    trust_alpha: Mapped[float] = mapped_column(Float)
    trust_beta: Mapped[float] = mapped_column(Float)
    rewards_credited: Mapped[int] = mapped_column(Uint)
    bounties_credited: Mapped[int] = mapped_column(Uint)
    claimed: Mapped[int] = mapped_column(Uint)

    @property
    def trust(self) -> float:
        """Posterior mean of the index's Beta tally (not the coordinator's trust: see the module docstring)."""
        return self.trust_alpha / (self.trust_alpha + self.trust_beta)

    @property
    def claimable(self) -> int:
        """Credits not yet claimed (equals the contract's claimableOf)."""
        return self.rewards_credited + self.bounties_credited - self.claimed


class Commit(IndexBase):
    """A worker's on-chain commitment to a header digest, with its randomness and verdict counts."""

    __tablename__ = "commits"

    commit_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.run_id"), index=True)
    worker: Mapped[str] = mapped_column(Address, index=True)
    version: Mapped[int] = mapped_column(BigInteger, index=True)
    nonce: Mapped[int] = mapped_column(Uint)
    header_digest: Mapped[str] = mapped_column(Hex32, unique=True)
    header_cid: Mapped[str] = mapped_column(String(128))
    worker_key: Mapped[str | None] = mapped_column(Hex32)
    block_number: Mapped[int] = mapped_column(BigInteger)
    tx_hash: Mapped[str] = mapped_column(TxHash)
    randomness: Mapped[str | None] = mapped_column(Hex32)
    sealed_block: Mapped[int | None] = mapped_column(BigInteger)
    pass_count: Mapped[int] = mapped_column(Integer)
    fail_count: Mapped[int] = mapped_column(Integer)
    slashed: Mapped[bool] = mapped_column(Boolean)

    run: Mapped[Run] = relationship()


class Header(IndexBase):
    """The signed header a commit names, fetched from the store by digest; fields of interest."""

    __tablename__ = "headers"

    commit_id: Mapped[int] = mapped_column(ForeignKey("commits.commit_id"), primary_key=True)
    status: Mapped[FetchStatus] = mapped_column(_enum(FetchStatus), index=True)
    attempts: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Message)
    run_name: Mapped[str | None] = mapped_column(String(64))
    task: Mapped[str | None] = mapped_column(String(64))
    engine: Mapped[str | None] = mapped_column(String(64))
    manifest_cid: Mapped[str | None] = mapped_column(String(128))
    prompt_seed: Mapped[int | None] = mapped_column(Uint)
    sampling_seed: Mapped[int | None] = mapped_column(Uint)
    temperature_milli: Mapped[int | None] = mapped_column(Integer)
    top_p_milli: Mapped[int | None] = mapped_column(Integer)
    top_k: Mapped[int | None] = mapped_column(Integer)
    max_new_tokens: Mapped[int | None] = mapped_column(Integer)
    shards: Mapped[list[int] | None] = mapped_column(JSON)
    files: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    total_bytes: Mapped[int | None] = mapped_column(BigInteger)

    commit: Mapped[Commit] = relationship()


class Verdict(IndexBase):
    """One verifier's attestation on a commit."""

    __tablename__ = "verdicts"

    commit_id: Mapped[int] = mapped_column(ForeignKey("commits.commit_id"), primary_key=True)
    verifier: Mapped[str] = mapped_column(Address, primary_key=True)
    ok: Mapped[bool] = mapped_column(Boolean)
    evidence_digest: Mapped[str] = mapped_column(Hex32)
    pass_count: Mapped[int] = mapped_column(Integer)
    fail_count: Mapped[int] = mapped_column(Integer)
    block_number: Mapped[int] = mapped_column(BigInteger)
    tx_hash: Mapped[str] = mapped_column(TxHash)

    commit: Mapped[Commit] = relationship()


class Slash(IndexBase):
    """A slash of a commit's worker (at most one per commit)."""

    __tablename__ = "slashes"

    commit_id: Mapped[int] = mapped_column(ForeignKey("commits.commit_id"), primary_key=True)
    worker: Mapped[str] = mapped_column(Address, index=True)
    amount: Mapped[int] = mapped_column(Uint)
    bounty: Mapped[int] = mapped_column(Uint)
    burned: Mapped[int] = mapped_column(Uint)
    block_number: Mapped[int] = mapped_column(BigInteger)
    tx_hash: Mapped[str] = mapped_column(TxHash)

    commit: Mapped[Commit] = relationship()


class Reward(IndexBase):
    """A credit (version reward or slash bounty) or a claim of an account."""

    __tablename__ = "rewards"

    tx_hash: Mapped[str] = mapped_column(TxHash, primary_key=True)
    log_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[RewardKind] = mapped_column(_enum(RewardKind), index=True)
    account: Mapped[str] = mapped_column(Address, index=True)
    amount: Mapped[int] = mapped_column(Uint)
    run_id: Mapped[str | None] = mapped_column(Hex32)
    version: Mapped[int | None] = mapped_column(BigInteger)
    commit_id: Mapped[int | None] = mapped_column(BigInteger)
    block_number: Mapped[int] = mapped_column(BigInteger)


# ===================================================================================== role state


class StateBase(DeclarativeBase):
    """Tables the roles write for themselves; never dropped by an index rebuild."""


class SchemaVersion(StateBase):
    """The schema version of each table group ('index', 'state') this database was made with."""

    __tablename__ = "krill_schema"

    component: Mapped[str] = mapped_column(String(16), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)


class RoleCursor(StateBase):
    """A named position of a role's loop (e.g. 'coordinator:<run>' -> next commit id to ingest)."""

    __tablename__ = "role_cursors"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    position: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(),
                                                 onupdate=func.now())


class Contribution(StateBase):
    """The coordinator's treatment of one commit: status, reason, weight, staleness."""

    __tablename__ = "contributions"

    commit_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    run_id: Mapped[str] = mapped_column(Hex32, index=True)
    worker: Mapped[str] = mapped_column(Address, index=True)
    version: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[ContributionStatus] = mapped_column(_enum(ContributionStatus), index=True)
    reason_code: Mapped[RejectionCode | None] = mapped_column(_enum(RejectionCode))
    reason: Mapped[str | None] = mapped_column(Message)
    weight: Mapped[float | None] = mapped_column(Float)
    staleness: Mapped[int | None] = mapped_column(Integer)
    trust: Mapped[float | None] = mapped_column(Float)
    aggregated_version: Mapped[int | None] = mapped_column(BigInteger, index=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(),
                                                 onupdate=func.now())


class Metric(StateBase):
    """Figures of one published version, recorded by the coordinator."""

    __tablename__ = "metrics"

    run_id: Mapped[str] = mapped_column(Hex32, primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    accepted: Mapped[int] = mapped_column(Integer)
    rejected: Mapped[int] = mapped_column(Integer)
    mean_reward: Mapped[float | None] = mapped_column(Float)
    sampled_tokens: Mapped[int | None] = mapped_column(BigInteger)
    bytes_received: Mapped[int | None] = mapped_column(BigInteger)
    bytes_published: Mapped[int | None] = mapped_column(BigInteger)
    mean_staleness: Mapped[float | None] = mapped_column(Float)
    aggregation_rule: Mapped[str | None] = mapped_column(String(64))
    wall_seconds: Mapped[float | None] = mapped_column(Float)
    extra: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class Eval(StateBase):
    """An evaluation of one version on one task split."""

    __tablename__ = "evals"

    run_id: Mapped[str] = mapped_column(Hex32, primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    task: Mapped[str] = mapped_column(String(64), primary_key=True)
    split: Mapped[str] = mapped_column(String(32), primary_key=True, default="eval")
    n: Mapped[int] = mapped_column(Integer)
    correct: Mapped[int] = mapped_column(Integer)
    accuracy: Mapped[float] = mapped_column(Float)


INDEX_TABLES = tuple(IndexBase.metadata.sorted_tables)
STATE_TABLES = tuple(StateBase.metadata.sorted_tables)
