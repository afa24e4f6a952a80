"""The signed contribution header (DESIGN §3): a typed, versioned struct with one canonical encoding.

Design decisions:
- `HeaderBody` holds what a worker claims (run, chain id + contract, worker address, Ed25519 key,
  model version and its manifest CID, task, prompt seed, nonce, sampling parameters, and for each
  file its CID, sha256 and size). `SignedHeader` adds the Ed25519 signature over
  sha256(canonical JSON of the body). The header's digest is sha256 of the canonical JSON of the
  signed header; that digest is what goes on-chain, and the header is stored as one raw IPFS
  block, so its CID is `digest_to_cid(digest)`.
- Strict pydantic models (no coercion, unknown fields refused, frozen) with one spelling per value:
  lowercase hex for addresses, keys, digests and signatures; integers in milli-units for
  temperature and top-p. Floats never appear, so the encoding is byte-identical everywhere.
- `protocol` is a literal version number; a different one is `UnsupportedVersionError`, so the
  format can evolve without old code misreading new headers. `true` is refused by name: strict
  mode keeps booleans out of int fields, but `Literal[1]` accepts `True` (True == 1).
- A decoded header must re-encode to exactly the bytes received (`NonCanonicalError` otherwise), so
  `SignedHeader.digest` is always sha256 of those bytes and a signed header has one digest: without
  this, omitting a field that has a default (`engine`, `sampling.top_k`, ...) or writing `true` for
  `protocol` gave a second encoding that the same signature verifies.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from krill.errors import StoreError
from krill.payload.canonical import canonical_json, parse_canonical
from krill.payload.errors import (
    NonCanonicalError,
    PayloadTooLargeError,
    SchemaError,
    SignatureError,
    UnsupportedVersionError,
)
from krill.payload.limits import PayloadLimits

PROTOCOL_VERSION = 1
U64 = Annotated[int, Field(ge=0, lt=1 << 64)]
Hex32 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Address = Annotated[str, Field(pattern=r"^0x[0-9a-f]{40}$")]
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")]
ROLLOUTS_FILE = "rollouts.safetensors"


def grad_file(shard: int) -> str:
    """The header's file name for the gradient of `shard`."""
    return f"grad-{shard}.safetensors"


def _canonical_cid(value: str) -> str:
    from krill.store.cid import normalize_cid

    try:
        canonical = normalize_cid(value)
    except StoreError as exc:
        raise ValueError(str(exc)) from None
    if canonical != value:
        raise ValueError("CID must be written as canonical CIDv1 base32")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class SamplingParams(_Strict):
    """How completions were sampled; exact integers so replay uses exactly the same values."""

    temperature_milli: int = Field(ge=0, le=100_000, description="Temperature x 1000 (1000 = 1.0; 0 = greedy).")
    top_p_milli: int = Field(1000, ge=1, le=1000, description="Nucleus mass x 1000 (1000 = off).")
    top_k: int = Field(0, ge=0, le=1 << 20, description="Top-k cut-off (0 = off).")
    max_new_tokens: int = Field(ge=1, le=1 << 16, description="Completion length cap.")
    seed: U64 = Field(description="Sampling seed the worker commits to.")


class FileRef(_Strict):
    """One file of the contribution, pinned three ways."""

    cid: str = Field(min_length=8, max_length=128, description="IPFS CID (add --cid-version 1 --raw-leaves).")
    sha256: Hex32 = Field(description="sha256 of the file bytes, lowercase hex.")
    size: int = Field(ge=0, lt=1 << 40, description="Byte length.")

    _cid = field_validator("cid")(classmethod(lambda cls, value: _canonical_cid(value)))


class HeaderBody(_Strict):
    """Everything the worker signs."""

    protocol: Literal[1] = Field(PROTOCOL_VERSION, description="Header format version.")
    run_id: Hex32 = Field(description="On-chain run id (sha256 of the run spec), lowercase hex.")
    chain_id: int = Field(ge=1, lt=1 << 63, description="EVM chain id of the protocol contract.")
    contract: Address = Field(description="Protocol contract address, lowercase hex.")
    worker: Address = Field(description="Worker's Ethereum address, lowercase hex.")
    ed25519_key: Hex32 = Field(description="Worker's Ed25519 public key (staked on-chain), lowercase hex.")
    model_version: int = Field(ge=0, lt=1 << 63, description="Version v the gradients were computed at (committed on-chain).")
    behaviour_version: int = Field(ge=0, lt=1 << 63, description="Version the rollouts were sampled from (<= model_version).")
    manifest_cid: str = Field(min_length=8, max_length=128, description="CID of version v's manifest.")
    task: Name = Field(description="Task name (krill.rl.tasks).")
    prompt_seed: U64 = Field(description="Seed of the prompt assignment H(run seed, worker, version, nonce).")
    nonce: U64 = Field(description="Worker's contribution counter for this version.")
    engine: Name = Field("hf-torch", description="Rollout engine, for the verifier's tolerance table.")
    sampling: SamplingParams
    files: dict[Name, FileRef] = Field(description="File name -> CID, sha256, size.")

    _cid = field_validator("manifest_cid")(classmethod(lambda cls, value: _canonical_cid(value)))

    @field_validator("protocol", mode="before")
    @classmethod
    def _protocol_not_bool(cls, value):
        if isinstance(value, bool):
            raise ValueError(f"protocol must be the integer {PROTOCOL_VERSION}, not a boolean")
        return value

    @model_validator(mode="after")
    def _behaviour_not_newer(self):
        if self.behaviour_version > self.model_version:
            raise ValueError("behaviour_version must not exceed model_version")
        return self

    def to_json(self) -> dict:
        return self.model_dump(mode="json")

    def signing_digest(self) -> bytes:
        """sha256 of the canonical unsigned header: what the Ed25519 signature covers."""
        return hashlib.sha256(canonical_json(self.to_json())).digest()

    def sign(self, signing_key) -> SignedHeader:
        """Sign with a `nacl.signing.SigningKey` (or its 32-byte seed); the key must match `ed25519_key`."""
        from nacl.signing import SigningKey

        key = signing_key if isinstance(signing_key, SigningKey) else SigningKey(bytes(signing_key))
        if bytes(key.verify_key).hex() != self.ed25519_key:
            raise SignatureError("signing key does not match the header's ed25519_key", field="header.ed25519_key")
        signature = key.sign(self.signing_digest()).signature
        return SignedHeader(**self.model_dump(), signature=signature.hex())


class SignedHeader(HeaderBody):
    """A header with its signature; `encode()` gives the bytes stored on IPFS."""

    signature: str = Field(pattern=r"^[0-9a-f]{128}$", description="Ed25519 signature, lowercase hex.")

    def body(self) -> HeaderBody:
        return HeaderBody(**self.model_dump(exclude={"signature"}))

    def signing_digest(self) -> bytes:
        return self.body().signing_digest()

    def encode(self) -> bytes:
        return canonical_json(self.to_json())

    @property
    def digest(self) -> bytes:
        """sha256 of the encoded signed header: the value committed on-chain."""
        return hashlib.sha256(self.encode()).digest()

    @property
    def cid(self) -> str:
        from krill.store.cid import digest_to_cid

        return digest_to_cid(self.digest)

    def verify(self, expected_key: bytes | str | None = None) -> None:
        """Check the signature, and that the key is the one staked on-chain when given."""
        from nacl.exceptions import BadSignatureError
        from nacl.signing import VerifyKey

        if expected_key is not None:
            expected = expected_key.hex() if isinstance(expected_key, bytes | bytearray) else str(expected_key).lower()
            if expected != self.ed25519_key:
                raise SignatureError("header names a different Ed25519 key than the one registered for "
                                     "this worker", field="header.ed25519_key")
        try:
            VerifyKey(bytes.fromhex(self.ed25519_key)).verify(self.signing_digest(), bytes.fromhex(self.signature))
        except BadSignatureError:
            raise SignatureError("Ed25519 signature does not verify", field="header.signature") from None
        except (ValueError, TypeError) as exc:  # e.g. a key that is not a valid curve point
            raise SignatureError(f"unusable Ed25519 key or signature: {exc}", field="header.ed25519_key") from None


def decode_header(data: bytes, limits: PayloadLimits, verify: bool = True) -> SignedHeader:
    """Parse and check an untrusted header (canonical form, schema, caps, and the signature)."""
    raw = parse_canonical(data, limits.max_header_bytes, field="header")
    if not isinstance(raw, dict):
        raise SchemaError("a header is a JSON object", field="header")
    if raw.get("protocol") != PROTOCOL_VERSION:
        raise UnsupportedVersionError(f"protocol {raw.get('protocol')!r}; this Krill speaks {PROTOCOL_VERSION}",
                                      field="header.protocol")
    files = raw.get("files")
    if isinstance(files, dict) and len(files) > limits.max_files:
        raise PayloadTooLargeError(f"{len(files)} files, over the cap of {limits.max_files}", field="header.files")
    try:
        header = SignedHeader.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise SchemaError(f"{err['msg']} (and {exc.error_count() - 1} more)" if exc.error_count() > 1
                          else err["msg"], field=f"header.{where}" if where else "header") from None
    if header.encode() != bytes(data):
        raise NonCanonicalError("header does not re-encode to the bytes received (every field must be "
                                "written, defaults included), so its digest would not be unique", field="header")
    if verify:
        header.verify()
    return header
