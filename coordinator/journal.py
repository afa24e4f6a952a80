"""The coordinator's journal: one row per version it decided to close, written before publishing.

Design decisions:
- Crash safety rests on one rule: the decision of version t (closed_by, the ordered accepted
  entries with their exact weights, the rejected entries) is committed to the database, in the
  same transaction that marks those contributions as folded into t, BEFORE anything is published.
  A contribution is therefore folded into at most one version, and an accepted one is never lost.
- After a crash, `publish.complete_version` redoes the fold from the journal row: the fold is
  deterministic and the record is built from the stored entries, so the published content is
  the same bytes it would have been. The row moves decided -> stored (content in the store,
  digests kept) -> published (the chain holds version t) -> settled.
- The table belongs to the coordinator role, so it lives on its own `MetaData` (created by
  `ensure_tables`) beside the core's state tables: the core never learns about roles, and an
  index rebuild never touches it.
"""

from __future__ import annotations

import enum
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Enum, Float, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from krill.db.types import Message


class CoordinatorBase(DeclarativeBase):
    """Tables private to the coordinator role."""


class DecisionState(enum.StrEnum):
    DECIDED = "decided"      # journal written; nothing published yet
    STORED = "stored"        # shards, manifest and record are in the store; digests below
    PUBLISHED = "published"  # the chain holds the version
    SETTLED = "settled"      # rewards credited (or nothing to credit)


class VersionDecision(CoordinatorBase):
    __tablename__ = "coordinator_versions"

    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    state: Mapped[DecisionState] = mapped_column(Enum(DecisionState, native_enum=False, create_constraint=False,
                                                      length=16, values_callable=lambda e: [m.value for m in e]))
    closed_by: Mapped[str] = mapped_column(String(16))
    accepted: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # AcceptedEntry dicts, commit-id order
    rejected: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # RejectedEntry dicts, commit-id order
    decided_at: Mapped[float] = mapped_column(Float)               # unix time of the decision
    window_s: Mapped[float] = mapped_column(Float)                 # seconds since the previous publish
    manifest_digest: Mapped[str | None] = mapped_column(String(64))
    record_digest: Mapped[str | None] = mapped_column(String(64))
    bytes_published: Mapped[int | None] = mapped_column(BigInteger)
    note: Mapped[str | None] = mapped_column(Message)               # e.g. why settlement was skipped
    # The fold's settings at the decision (None in rows written before they were kept: the process's own).
    served_shards: Mapped[list[int] | None] = mapped_column(JSON)
    keep_states: Mapped[bool | None] = mapped_column(Boolean)


# Columns added after the table first shipped: `ensure_tables` adds them to an existing table.
_ADDED_COLUMNS = {"served_shards": "JSON", "keep_states": "BOOLEAN"}


def ensure_tables(database) -> None:
    """Create the coordinator's tables if missing, and add the columns a table written by an earlier
    release lacks (nullable, so its rows keep their meaning); idempotent, safe with concurrent openers:
    it runs under the database's schema lock (`Database.schema_lock`), without which openers of a fresh
    PostgreSQL database all saw the table missing and the losers' CREATE TABLE failed."""
    from sqlalchemy import inspect, text

    import krill.coordinator.confirm  # noqa: F401  (its table is on this MetaData)

    with database.schema_lock() as conn:
        CoordinatorBase.metadata.create_all(conn)
        have = {c["name"] for c in inspect(conn).get_columns(VersionDecision.__tablename__)}
        for name, kind in _ADDED_COLUMNS.items():
            if name not in have:
                conn.execute(text(f"ALTER TABLE {VersionDecision.__tablename__} ADD COLUMN {name} {kind}"))


def mark_settled(ctx, version: int) -> None:
    """The last step of a version: its rewards are credited and its figures reported."""
    with ctx.db.write() as s:
        s.get(VersionDecision, (ctx.run_hex, version)).state = DecisionState.SETTLED


def unfinished(session, run_id: str) -> list[VersionDecision]:
    """Decisions of `run_id` not yet settled, oldest first."""
    return list(session.scalars(select(VersionDecision).where(VersionDecision.run_id == run_id,
                                                              VersionDecision.state != DecisionState.SETTLED)
                                .order_by(VersionDecision.version)))


def latest_decided(session, run_id: str) -> int:
    """The newest version decided for `run_id` (0 if none)."""
    from sqlalchemy import func

    return int(session.scalar(select(func.max(VersionDecision.version)).where(VersionDecision.run_id == run_id)) or 0)
