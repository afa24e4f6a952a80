"""Fill the index's store-derived fields: commit headers and version manifests, fetched by digest.

Design decisions:
- The chain gives only digests; headers are stored as raw blocks (and small manifests are one raw
  leaf), so the CID follows from the digest (`digest_to_cid`), and the store checks every byte
  it returns against it.
- Each object ends in one of three states, recorded with a message: AVAILABLE (fields filled),
  UNAVAILABLE (not in the store, the store unreachable, or it returned wrong bytes: a fault of
  the store, not of the object, so it is retried on later passes up to an attempt cap), or INVALID
  (the bytes are what the digest names but malformed, too large, badly signed, or contradicting
  the chain: final, since those bytes can never change). Nothing raises out of a fetch for a
  store or payload fault; unexpected errors still propagate.
- A header is checked against the chain it is indexed from: worker, version, nonce, chain id and
  contract must match the commit, and its key must be the worker's staked key at commit time.
  Deeper validation (files, assignment, replay) is the coordinator's and verifiers' job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from krill.db.models import FetchStatus
from krill.errors import PayloadError, StoreError
from krill.payload.header import decode_header, grad_file
from krill.payload.limits import PayloadLimits

# The index only parses headers (no tensors), so the header caps are all that matter here, and it
# serves every run: the widest caps any run spec may set, so no run's honest header reads as invalid
# (with the defaults, a run allowing 301 files had every header marked invalid in the explorer).
HEADER_LIMITS = PayloadLimits(vocab_size=1 << 24, max_header_bytes=1 << 20, max_files=4096)
STORE_FAULTS = (StoreError, ConnectionError, TimeoutError)
_GRAD = re.compile(r"^grad-([0-9]{1,6})\.safetensors$")


@dataclass
class Fetched:
    """The outcome of one fetch: a status, an error message, and the column values to set."""

    status: FetchStatus
    error: str | None = None
    values: dict[str, Any] = field(default_factory=dict)
    shards: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class CommitFacts:
    """What the chain says about a commit, which its header must agree with."""

    commit_id: int
    header_cid: str
    run_id: str
    worker: str
    version: int
    nonce: int
    worker_key: str | None
    chain_id: int
    contract: str


def _get(store, cid: str, max_bytes: int) -> bytes | Fetched:
    from krill.store.unixfs import ObjectTooLargeError

    try:
        return store.get(cid, max_bytes=max_bytes)
    except ObjectTooLargeError as exc:
        return Fetched(FetchStatus.INVALID, f"too large: {exc}")
    except STORE_FAULTS as exc:
        # KeyError-derived errors (ContentNotFoundError) would print their message quoted.
        message = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
        return Fetched(FetchStatus.UNAVAILABLE, f"{type(exc).__name__}: {message}")


def fetch_header(store, facts: CommitFacts, limits: PayloadLimits = HEADER_LIMITS) -> Fetched:
    """Fetch and check the header of one commit."""
    data = _get(store, facts.header_cid, limits.max_header_bytes)
    if isinstance(data, Fetched):
        return data
    try:
        header = decode_header(data, limits, verify=True)
    except PayloadError as exc:
        return Fetched(FetchStatus.INVALID, f"{type(exc).__name__}: {exc}")
    mismatch = _contradiction(header, facts)
    if mismatch is not None:
        return Fetched(FetchStatus.INVALID, mismatch)
    # Each shard once: `grad-00.safetensors` beside `grad-0.safetensors` is a name of shard 0 too.
    shards = sorted({int(m[1]) for m in map(_GRAD.match, header.files) if m and grad_file(int(m[1])) in header.files})
    values = dict(run_name=header.run_id, task=header.task, engine=header.engine, manifest_cid=header.manifest_cid,
                  prompt_seed=header.prompt_seed, sampling_seed=header.sampling.seed,
                  temperature_milli=header.sampling.temperature_milli, top_p_milli=header.sampling.top_p_milli,
                  top_k=header.sampling.top_k, max_new_tokens=header.sampling.max_new_tokens, shards=shards,
                  files={name: ref.model_dump(mode="json") for name, ref in sorted(header.files.items())},
                  total_bytes=sum(ref.size for ref in header.files.values()))
    return Fetched(FetchStatus.AVAILABLE, None, values)


def _contradiction(header, facts: CommitFacts) -> str | None:
    checks = (("header.run_id", header.run_id, facts.run_id),
              ("header.worker", header.worker, facts.worker.lower()),
              ("header.model_version", header.model_version, facts.version),
              ("header.nonce", header.nonce, facts.nonce),
              ("header.chain_id", header.chain_id, facts.chain_id),
              ("header.contract", header.contract, facts.contract.lower()),
              ("header.ed25519_key", header.ed25519_key, facts.worker_key))
    for name, found, expected in checks:
        if found != expected:
            return f"{name}: the header says {found!r}, the chain says {expected!r}"
    return None


def fetch_manifest(store, manifest_cid: str, version: int) -> Fetched:
    """Fetch a version's manifest and list its shards."""
    from krill.model.manifest import MAX_MANIFEST_BYTES, Manifest

    data = _get(store, manifest_cid, MAX_MANIFEST_BYTES)
    if isinstance(data, Fetched):
        return data
    try:
        manifest = Manifest.from_bytes(data)
    except (ValueError, RecursionError) as exc:
        # PayloadError; any other parse fault of these bytes (pydantic's ValidationError is a
        # ValueError) is as final, and raised here it would roll back the whole chunk's results
        # and leave the row pending, to crash every later pass the same way.
        return Fetched(FetchStatus.INVALID, f"{type(exc).__name__}: {exc}")
    if manifest.version != version:
        return Fetched(FetchStatus.INVALID, f"manifest.version: the manifest says {manifest.version}, "
                                            f"the chain published it as version {version}")
    # Sizes and element counts fit the BIGINT columns: the manifest bounds them (`MAX_COUNT`).
    shards = [dict(shard=s.index, cid=s.cid, sha256=s.sha256, size=s.size, parameters=len(s.parameters),
                   elements=s.elements) for s in manifest.shards]
    return Fetched(FetchStatus.AVAILABLE, None, dict(parent_cid=manifest.parent, num_shards=manifest.num_shards),
                   shards)
