"""The version manifest: which shards make up one model version, by CID.

Design decisions:
- A typed, versioned pydantic struct (`schema_version` 1) that crosses trust boundaries: it is
  published on IPFS and its digest anchored on-chain, so it is validated strictly on decode
  (unknown fields, bad CIDs, bad digests, inconsistent shard indices or duplicate parameter
  names are errors naming the field).
- Canonical encoding: UTF-8 JSON with sorted keys and no insignificant whitespace. The same
  manifest always encodes to the same bytes, hence the same CID. The only floats are inside
  `architecture` (the HF config, e.g. `rms_norm_eps`), which Python prints with the shortest
  round-tripping representation, so they survive decode/encode unchanged.
- Each shard lists its parameters (name, shape, dtype) so a participant can check a shard file
  before loading it and can size its work without downloading anything else.
- Sizes, dimensions and element counts (of a parameter and of a whole shard) are at most
  `MAX_COUNT` (2**63 - 1): the index stores them in signed 64-bit columns, and one bigger number
  from an untrusted manifest made every indexer pass crash on the write instead of marking it
  INVALID.
- `from_bytes` turns every fault of parsing untrusted bytes into `PayloadError`. Nesting deeper
  than `MAX_JSON_DEPTH` is refused before `json` sees the text: its C parser recurses once per
  level, and with the recursion limit py_ecc sets on import (100000, it comes with web3) a
  100000-deep bomb overflowed the C stack and killed the process instead of raising
  `RecursionError`. An integer literal over Python's 4300-digit limit is a plain `ValueError`.
- `version` is the model version (0 for a base model); `parent` is the CID of the previous
  version's manifest (None for a base model); `tokenizer` is the CID of the tokenizer bundle
  (see `krill.model.publish`).

Public API:
    ParameterEntry(name, shape, dtype), ShardEntry(index, cid, sha256, size, parameters)
    Manifest(schema_version=1, version, parent, architecture, tokenizer, shards)
    Manifest.canonical_bytes() -> bytes;  Manifest.from_bytes(data) -> Manifest
    Manifest.shard_names(index) -> list[str];  Manifest.shard_of(name) -> int
    ParameterEntry.elements, ShardEntry.elements;  MAX_MANIFEST_BYTES, MAX_JSON_DEPTH, MAX_COUNT
"""

from __future__ import annotations

import json
from math import prod
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from krill.errors import PayloadError
from krill.payload.canonical import check_depth

MAX_MANIFEST_BYTES = 16 * 1024 * 1024
MAX_JSON_DEPTH = 32
"""Deepest nesting a manifest may have: its own structure takes 6 levels, the HF config a few more."""
MAX_COUNT = 2**63 - 1
"""Largest size, dimension or element count a manifest may state (a signed 64-bit column holds it)."""
SAFETENSORS_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I64", "I32", "I16", "I8", "U8", "BOOL")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _check_cid(value: str) -> str:
    from krill.store.cid import InvalidCIDError, normalize_cid

    try:
        canonical = normalize_cid(value)
    except InvalidCIDError as exc:
        raise ValueError(str(exc)) from None
    if canonical != value:
        raise ValueError(f"CID {value!r} is not in canonical CIDv1 base32 form ({canonical})")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (a manifest must re-encode as canonical JSON)")


class ParameterEntry(_Strict):
    """One tensor of a shard."""

    name: str = Field(min_length=1, max_length=512)
    shape: list[int] = Field(max_length=8)
    dtype: Literal[SAFETENSORS_DTYPES]

    @field_validator("shape")
    @classmethod
    def _dims(cls, shape: list[int]) -> list[int]:
        if any(d < 0 for d in shape):
            raise ValueError("dimensions must be >= 0")
        if any(d > MAX_COUNT for d in shape) or prod(shape) > MAX_COUNT:
            raise ValueError(f"dimensions and their product must be at most 2**63 - 1 ({MAX_COUNT})")
        return shape

    @property
    def elements(self) -> int:
        """Number of values in the tensor."""
        return prod(self.shape)


class ShardEntry(_Strict):
    """One shard file: its content address and what it holds."""

    index: int = Field(ge=0, le=4095)
    cid: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0, le=MAX_COUNT)
    parameters: list[ParameterEntry] = Field(min_length=1)

    @field_validator("cid")
    @classmethod
    def _cid(cls, value: str) -> str:
        return _check_cid(value)

    @field_validator("parameters")
    @classmethod
    def _elements(cls, parameters: list[ParameterEntry]) -> list[ParameterEntry]:
        if sum(p.elements for p in parameters) > MAX_COUNT:
            raise ValueError(f"the shard's parameters hold more than 2**63 - 1 ({MAX_COUNT}) elements")
        return parameters

    @property
    def elements(self) -> int:
        """Number of values in all the shard's tensors."""
        return sum(p.elements for p in self.parameters)


class Manifest(_Strict):
    """The shards, architecture and tokenizer of one model version."""

    schema_version: Literal[1] = 1
    version: int = Field(ge=0)
    parent: str | None = None
    architecture: dict[str, Any]
    tokenizer: str
    shards: list[ShardEntry] = Field(min_length=1, max_length=4096)

    @field_validator("parent")
    @classmethod
    def _parent(cls, value: str | None) -> str | None:
        return None if value is None else _check_cid(value)

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer(cls, value: str) -> str:
        return _check_cid(value)

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        for i, shard in enumerate(self.shards):
            if shard.index != i:
                raise ValueError(f"shards[{i}].index is {shard.index}; shards must be listed in order 0..S-1")
        seen: set[str] = set()
        for shard in self.shards:
            for p in shard.parameters:
                if p.name in seen:
                    raise ValueError(f"parameter {p.name!r} appears in more than one place")
                seen.add(p.name)
        return self

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def shard_names(self, index: int) -> list[str]:
        """Parameter names of shard `index`."""
        return [p.name for p in self.shards[index].parameters]

    def shard_of(self, name: str) -> int:
        """The shard holding parameter `name`."""
        for shard in self.shards:
            if any(p.name == name for p in shard.parameters):
                return shard.index
        raise KeyError(name)

    def canonical_bytes(self) -> bytes:
        """Sorted-key, whitespace-free UTF-8 JSON: the bytes whose CID names this manifest."""
        return canonical_json(self.model_dump(mode="json"))

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Decode and validate a manifest; `PayloadError` naming the bad field otherwise."""
        if len(data) > MAX_MANIFEST_BYTES:
            raise PayloadError(f"{len(data)} bytes exceeds {MAX_MANIFEST_BYTES}", field="manifest")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PayloadError(f"not UTF-8 ({exc})", field="manifest") from None
        check_depth(text, MAX_JSON_DEPTH, "manifest")
        try:
            raw = json.loads(text, parse_constant=_no_constant)
        except ValueError as exc:  # JSONDecodeError, NaN / Infinity, or an integer literal over 4300 digits
            raise PayloadError(f"not JSON ({exc})", field="manifest") from None
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "manifest"
            raise PayloadError(err["msg"], field=f"manifest.{where}" if where != "manifest" else where) from None


def canonical_json(value: Any) -> bytes:
    """Sorted keys, compact separators, UTF-8, NaN refused."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")
