"""Typed values the Krill contract takes and returns.

Design decisions:
- Frozen dataclasses mirror the Solidity structs field by field (snake_case names), so callers
  never index tuples. `from_abi` accepts what web3 returns for a struct (tuple or mapping) and
  converts nested structs by the field's annotation.
- bytes32 values are `bytes` of length 32 everywhere; `to_bytes32` accepts bytes or 0x-hex and
  names the field when the value is malformed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from functools import cache
from typing import Any, TypeVar, get_type_hints

from krill.chain.errors import ChainInputError, snake_case

T = TypeVar("T")

BPS = 10_000
PPM = 1_000_000
ZERO32 = b"\x00" * 32


class Role(IntEnum):
    """Participant role codes of KrillProtocol."""

    WORKER = 1
    VERIFIER = 2


def to_bytes32(value: bytes | str, field: str) -> bytes:
    """`value` as 32 bytes (bytes or 0x-prefixed hex), or a ChainInputError naming `field`."""
    if isinstance(value, str):
        try:
            value = bytes.fromhex(value.removeprefix("0x"))
        except ValueError as exc:
            raise ChainInputError(f"{field}: not hex: {value!r}") from exc
    if not isinstance(value, bytes | bytearray) or len(value) != 32:
        raise ChainInputError(f"{field}: expected 32 bytes, got {value!r}")
    return bytes(value)


def to_uint(value: int, field: str, bits: int = 256) -> int:
    """`value` checked to fit an unsigned integer of `bits` bits."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**bits:
        raise ChainInputError(f"{field}: expected an integer in [0, 2**{bits}), got {value!r}")
    return value


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def from_abi(cls: type[T], values: Sequence[Any] | Mapping[str, Any]) -> T:
    """Build dataclass `cls` from a web3 struct value (positional tuple or named mapping)."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if isinstance(values, Mapping):
        by_name = {snake_case(k): v for k, v in values.items()}
        raw = [by_name[f.name] for f in fields]
    else:
        raw = list(values)
    hints = _hints(cls)
    out = {}
    for f, v in zip(fields, raw, strict=True):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            v = from_abi(hint, v)
        elif hint is bytes:
            v = bytes(v)
        out[f.name] = v
    return cls(**out)


@dataclass(frozen=True)
class RunParams:
    """Parameters of a run (Solidity `RunParams`)."""

    coordinator: str
    max_staleness: int
    attestation_quorum: int
    slash_fraction_bps: int
    verifier_bounty_bps: int
    check_probability_ppm: int
    challenge_window_blocks: int
    reward_per_version: int

    def to_abi(self) -> tuple:
        """The tuple web3 encodes as the Solidity struct (ranges checked here, naming the field)."""
        return (
            self.coordinator,
            to_uint(self.max_staleness, "max_staleness", 32),
            to_uint(self.attestation_quorum, "attestation_quorum", 32),
            to_uint(self.slash_fraction_bps, "slash_fraction_bps", 16),
            to_uint(self.verifier_bounty_bps, "verifier_bounty_bps", 16),
            to_uint(self.check_probability_ppm, "check_probability_ppm", 32),
            to_uint(self.challenge_window_blocks, "challenge_window_blocks", 32),
            to_uint(self.reward_per_version, "reward_per_version"),
        )


@dataclass(frozen=True)
class StakeInfo:
    """Stake record of an account (Solidity `StakeInfo`); role 0 = never staked."""

    role: int
    jailed: bool
    ed25519_public_key: bytes
    staked: int
    unbonding: int
    release_block: int


@dataclass(frozen=True)
class RunInfo:
    """State of a run (Solidity `RunInfo`)."""

    exists: bool
    params: RunParams
    latest_version: int
    reward_pool: int
    created_block: int


@dataclass(frozen=True)
class VersionInfo:
    """A published version (Solidity `VersionInfo`); zero digests = unpublished."""

    manifest_digest: bytes
    record_digest: bytes
    published_block: int
    settled: bool


@dataclass(frozen=True)
class CommitInfo:
    """A commit (Solidity `CommitInfo`); worker = zero address = no such commit."""

    run_id: bytes
    worker: str
    version: int
    header_digest: bytes
    nonce: int
    commit_block: int
    pass_count: int
    fail_count: int
    slashed: bool
    randomness: bytes


@dataclass(frozen=True)
class AttestationInfo:
    """One verifier's verdict on a commit (Solidity `AttestationInfo`)."""

    exists: bool
    ok: bool
    evidence_digest: bytes
