"""A whole contribution: build it (worker side) and validate it (coordinator and verifier side).

Design decisions:
- Validation runs cheapest first and stops at the first failure: header size and canonical form,
  schema, then the on-chain digest, the context (run, chain, contract, worker, staked key, model
  version, manifest), the Ed25519 signature, then each file's size, sha256 and CID against the
  signed header, and only then the tensor decoders. A forged or misdirected contribution is
  rejected before any tensor is parsed.
- The caller supplies the expected context from the chain and the run spec (`ExpectedContext`;
  fields left `None` are not checked) and the mask lengths of every shard (`grad_lengths`); the
  header must carry the rollouts and a gradient for at least one of those shards, and nothing
  else (a contribution without a gradient would count towards closing a version that then has
  nothing to fold). `check_file_names` runs before any file is fetched, so a header naming
  files it may not carry costs one small read, not the bytes of those files.
- The header's nonce must be the one its commit carries on-chain: the worker's assignment is
  derived from it, so a header free to name another nonce could repeat an assignment.
- The run spec fixes the gradient codec (and for int8 its block size); a contribution in another
  codec is refused, so no worker buys weight in bytes the run did not budget.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from krill.payload.errors import ContextMismatchError, DigestMismatchError, SchemaError
from krill.payload.gradient import CODECS, GradientShard, decode_gradient_shard
from krill.payload.header import ROLLOUTS_FILE, FileRef, HeaderBody, SignedHeader, decode_header, grad_file
from krill.payload.limits import PayloadLimits
from krill.payload.rollout import RolloutBatch, decode_rollouts
from krill.phases import phase


@dataclass(frozen=True)
class ExpectedContext:
    """What the chain (and the run spec, for the codec) says the header must name; `None` skips a check."""

    run_id: str | None = None
    chain_id: int | None = None
    contract: str | None = None
    worker: str | None = None
    ed25519_key: str | None = None
    model_version: int | None = None
    manifest_cid: str | None = None
    digest: bytes | None = None
    nonce: int | None = None
    codec: str | None = None  # a `krill.payload.gradient.CODECS` name
    block_size: int | None = None  # checked for the int8-block codec only


@dataclass(frozen=True)
class Contribution:
    header: SignedHeader
    rollouts: RolloutBatch
    gradients: dict[int, GradientShard]


def file_ref(data: bytes) -> FileRef:
    """The CID, sha256 and size a header records for `data`."""
    from krill.store.cid import file_cid

    return FileRef(cid=file_cid(data), sha256=hashlib.sha256(data).hexdigest(), size=len(data))


def build_contribution(body: dict, rollouts: RolloutBatch, gradients: list[GradientShard], signing_key,
                       limits: PayloadLimits) -> tuple[SignedHeader, dict[str, bytes]]:
    """Encode the files, name them in the header, sign it. `body` holds every other header field."""
    with phase("encode_rollouts"):
        files = {ROLLOUTS_FILE: rollouts.encode(limits)}
    with phase("compress"):
        for grad in gradients:
            files[grad_file(grad.shard)] = grad.encode()
    with phase("hash"):
        refs = {name: file_ref(data) for name, data in files.items()}
    with phase("sign"):
        header = HeaderBody(**body, files=refs).sign(signing_key)
    return header, files


def check_file(header: SignedHeader, name: str, data: bytes) -> None:
    """Raise `DigestMismatchError` unless `data` has the size, sha256 and CID the header names."""
    from krill.store.cid import file_cid

    ref = header.files.get(name)
    if ref is None:
        raise SchemaError("header names no such file", field=f"header.files.{name}")
    if len(data) != ref.size:
        raise DigestMismatchError(f"{len(data)} bytes, the header says {ref.size}", field=f"{name}.size")
    if hashlib.sha256(data).hexdigest() != ref.sha256:
        raise DigestMismatchError("sha256 differs from the header's", field=f"{name}.sha256")
    if file_cid(data) != ref.cid:
        raise DigestMismatchError("CID differs from the header's", field=f"{name}.cid")


def check_context(header: SignedHeader, context: ExpectedContext) -> None:
    for name in ("run_id", "chain_id", "contract", "worker", "model_version", "manifest_cid", "nonce"):
        expected = getattr(context, name)
        if expected is None:
            continue
        if isinstance(expected, str) and name in ("contract", "worker", "ed25519_key"):
            expected = expected.lower()
        if getattr(header, name) != expected:
            raise ContextMismatchError(f"{getattr(header, name)!r}, expected {expected!r}", field=f"header.{name}")


def shard_of(name: str) -> int | None:
    """The shard number of a `grad-<shard>.safetensors` name, else None."""
    if name.startswith("grad-") and name.endswith(".safetensors"):
        middle = name[len("grad-"):-len(".safetensors")]
        if middle.isdigit() and len(middle) <= 6 and str(int(middle)) == middle:
            return int(middle)
    return None


def validate_contribution(header_bytes: bytes, files: Mapping[str, bytes], limits: PayloadLimits,
                          context: ExpectedContext, grad_lengths: Mapping[int, Mapping[str, int]]) -> Contribution:
    """Everything a coordinator or verifier checks before using a contribution."""
    if context.digest is not None and hashlib.sha256(header_bytes).digest() != context.digest:
        raise DigestMismatchError("header bytes do not hash to the committed digest", field="header")
    header = decode_header(header_bytes, limits, verify=False)
    check_context(header, context)
    header.verify(context.ed25519_key)
    shards = check_file_names(header, grad_lengths)
    for name in header.files:
        if name not in files:
            raise SchemaError("file named by the header was not supplied", field=name)
        check_file(header, name, files[name])
    rollouts = decode_rollouts(files[ROLLOUTS_FILE], limits)
    codecs = (context.codec,) if context.codec is not None else tuple(CODECS)
    gradients = {}
    for shard, name in sorted(shards.items()):
        grad = decode_gradient_shard(files[name], grad_lengths[shard], limits, shard, codecs)
        if grad.codec == "int8-block" and context.block_size is not None and grad.block_size != context.block_size:
            raise SchemaError(f"block_size {grad.block_size}, the run's is {context.block_size}",
                              field=f"grad-{shard}.__metadata__.block_size")
        gradients[shard] = grad
    return Contribution(header, rollouts, gradients)


def check_file_names(header: SignedHeader, grad_lengths: Mapping[int, Mapping[str, int]]) -> dict[int, str]:
    """{shard: file name} of the header's gradients; SchemaError unless the header names the rollouts,
    at least one gradient of a shard in `grad_lengths`, and nothing else."""
    if ROLLOUTS_FILE not in header.files:
        raise SchemaError("header names no rollouts file", field=f"header.files.{ROLLOUTS_FILE}")
    shards: dict[int, str] = {}
    for name in header.files:
        if name == ROLLOUTS_FILE:
            continue
        shard = shard_of(name)
        if shard is None or shard not in grad_lengths:
            raise SchemaError("not a file a contribution may carry", field=f"header.files.{name}")
        shards[shard] = name
    if not shards:
        raise SchemaError(f"header names no gradient file (one of the shards {sorted(grad_lengths)[:8]})",
                          field="header.files")
    return shards
