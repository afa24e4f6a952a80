"""The evidence document a verdict points to: typed, versioned, canonical JSON, stored as a raw block.

Design decisions:
- `Evidence` names everything needed to re-run the check from public data (chain id, contract,
  run, commit id, header digest and CID, worker, the commit's sealed randomness and the shard it
  recomputed: its own draw, or for a corroborating replay the one the failing verdict it checks
  names) and every check's outcome with its figures, so a disputed verdict can be audited.
  The on-chain attestation carries sha256 of these bytes; the block's CID follows from it.
- Canonical JSON (`krill.payload.canonical`) forbids floats, so figures travel as integers,
  booleans, strings or null, and floats as their shortest round-trip decimal string (`repr`),
  which is the same on every IEEE-754 machine; non-finite values are spelled `nan`/`inf`.
  Stage times are integer milliseconds (the cost of a check is a published figure).
- Free text is capped so a hostile payload cannot make the document outgrow one block.
"""

from __future__ import annotations

import hashlib
import numbers
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from krill.payload.canonical import canonical_json

EVIDENCE_FORMAT = "krill-evidence/1"
MAX_DETAIL = 1_000
MAX_FIGURES = 32
Hex32 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Address = Annotated[str, Field(pattern=r"^0x[0-9a-f]{40}$")]
Figure = int | bool | str | None
Reason = Literal["passed", "unavailable", "signature", "payload", "assignment", "rewards", "resample", "gradient"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class CheckRecord(_Strict):
    """One replay stage: its outcome, why, the numbers behind it and what it cost."""

    name: str = Field(pattern=r"^[a-z_]{1,32}$")
    ok: bool
    detail: str = Field(max_length=MAX_DETAIL)
    figures: dict[str, Figure] = Field(default_factory=dict, max_length=MAX_FIGURES)
    ms: int = Field(ge=0, description="Wall time of the stage in milliseconds.")


class Evidence(_Strict):
    """Why a verifier attested what it did about one commit."""

    format: Literal["krill-evidence/1"] = EVIDENCE_FORMAT
    chain_id: int = Field(ge=1)
    contract: Address
    run_id: Hex32
    commit_id: int = Field(ge=1)
    header_digest: Hex32
    header_cid: str = Field(min_length=8, max_length=128)
    worker: Address
    model_version: int = Field(ge=0, description="Learner version committed on-chain.")
    behaviour_version: int | None = Field(None, ge=0, description="Version the rollouts claim (None: header unread).")
    nonce: int = Field(ge=0)
    verifier: Address
    verifier_key: Hex32
    randomness: Hex32
    gradient_shard: int | None = Field(None, ge=0)
    ok: bool
    reason: Reason
    failed_field: str | None = Field(None, max_length=200, description="Payload field that failed, when known.")
    checks: list[CheckRecord]
    engine: str = Field(max_length=200)
    krill_version: str = Field(max_length=64)

    def encode(self) -> bytes:
        return canonical_json(self.model_dump(mode="json"))

    @property
    def digest(self) -> bytes:
        """sha256 of the encoded document: the value attested on-chain."""
        return hashlib.sha256(self.encode()).digest()


def figure(value) -> Figure:
    """A check figure in a form canonical JSON accepts (floats as shortest round-trip strings)."""
    if value is None or isinstance(value, bool | str):
        return value if not isinstance(value, str) else value[:MAX_DETAIL]
    if isinstance(value, numbers.Integral):
        value = int(value)
        return value if -(1 << 63) < value < (1 << 63) else str(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)[:MAX_DETAIL]
    return repr(number)  # 'nan', 'inf' and '-inf' included


def check_record(name: str, ok: bool, detail: str, figures: dict, seconds: float) -> CheckRecord:
    cleaned = {str(k)[:64]: figure(v) for k, v in list(figures.items())[:MAX_FIGURES]}
    text = detail if len(detail) <= MAX_DETAIL else detail[:MAX_DETAIL - 1] + "…"
    return CheckRecord(name=name, ok=bool(ok), detail=text, figures=cleaned, ms=max(0, round(seconds * 1000)))


def publish_evidence(store, evidence: Evidence) -> tuple[str, bytes]:
    """Store the document as a pinned raw block; returns (CID, sha256 digest)."""
    data = evidence.encode()
    cid = store.put_block(data, pin=True)
    return cid, hashlib.sha256(data).digest()


def load_evidence(store, cid: str) -> Evidence:
    """Fetch and parse an evidence document (the block is verified against its CID by the store)."""
    from krill.payload.canonical import parse_canonical

    raw = parse_canonical(store.get(cid, max_bytes=1 << 20), 1 << 20, field="evidence")
    return Evidence.model_validate(raw)
