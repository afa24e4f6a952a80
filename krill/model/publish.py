"""Model versions in a content store: shard a model into it, fetch and assemble it back.

Design decisions:
- Functions take a store-like object with `add(bytes) -> cid` and `get(cid) -> bytes` (any
  `krill.store.ContentStore` fits) and do no other I/O, except `read_model_dir` and
  `assemble_model_dir`, whose job is the directory.
- The manifest records `krill.store.cid.file_cid` of each shard file (the CID `ipfs add
  --cid-version 1 --raw-leaves` gives); the store's answer to `add` must agree, so a manifest
  never names content under a CID some other store would compute differently.
- Everything fetched is checked before use: sha256 and CID of each shard file, and the
  tensors in it against the manifest's names, shapes and dtypes. The store is not trusted.
  Reads are capped before they download: a manifest at `MAX_MANIFEST_BYTES`, a shard at the
  size its manifest states (the store's own cap, 1 GiB by default, was the only bound, so a
  manifest CID naming a large file was read whole before `Manifest.from_bytes` refused it).
- Floating weights must be finite: a shard holding NaN or infinity is refused (`ModelError`)
  when it is fetched. Such a version is no model anyone can sample from (its logits are NaN),
  and before, every role built it and ran into the NaNs wherever they first surfaced.
- The tokenizer and other small non-weight files (tokenizer.json, tokenizer_config.json,
  generation_config.json, ...) travel as one "file bundle": canonical JSON mapping file
  name to base64 content. Its CID is the manifest's `tokenizer`. `config.json` is not in
  the bundle: it is the manifest's `architecture`.
- Assembling writes one `model.safetensors` holding every tensor: the tensors are bit-for-bit
  those that were sharded, and re-sharding the assembled directory gives the same manifest.
- `publish_update` makes the next version from a parent: only the shards given are replaced,
  the rest keep their CIDs (a worker re-downloads only what changed).
- A base model (`publish_model_dir` at version 0) is published in float32: its bf16 / fp16 / fp8
  floating tensors are widened (exactly) and `config.json`'s dtype says float32. Every version keeps
  its parent's dtypes and the fold steps a float32 copy, so a bf16 base rounded each version's
  update back to bf16: a step under half a bf16 ulp was lost every version (RMSNorm weights near
  1.0 never moved, nor almost anything at lr 1e-6), while the record reported the update.

Public API:
    read_model_dir(directory) -> (tensors, architecture, aux_files)
    publish_model(store, tensors, architecture, aux_files, num_shards, version=0, parent=None)
        -> (Manifest, manifest_cid)
    publish_model_dir(store, directory, num_shards, version=0, parent=None) -> (Manifest, cid)
    publish_update(store, parent_manifest, parent_cid, shard_tensors: {index: tensors}, version)
        -> (Manifest, cid)
    load_manifest(store, cid) -> Manifest
    fetch_shard(store, manifest, index) -> dict[name, Tensor]
    fetch_tensors(store, manifest) -> dict[name, Tensor]
    assemble_files(store, manifest) -> dict[file name, bytes]
    assemble_model_dir(store, manifest, out_dir) -> Path
    load_version(store, manifest) -> (model, tokenizer)     via a temporary directory
    bundle_files(files) -> bytes;  unbundle_files(data) -> dict[str, bytes]
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from krill.errors import ModelError, PayloadError
from krill.model.manifest import MAX_MANIFEST_BYTES, Manifest, ParameterEntry, ShardEntry, canonical_json
from krill.model.shards import (
    WEIGHT_INDEX,
    num_layers_of,
    plan_shards,
    read_model_tensors,
    shard_from_bytes,
    shard_to_bytes,
)
from krill.store.unixfs import ObjectTooLargeError

BUNDLE_FORMAT = "krill-files"
MAX_BUNDLE_FILE_BYTES = 64 * 1024 * 1024
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
           "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "int64": "I64", "int32": "I32",
           "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


def _dtype_name(tensor) -> str:
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ModelError(f"dtype: tensors of {name} cannot be sharded")
    return _DTYPES[name]


def _is_weight_file(name: str) -> bool:
    return name.endswith(".safetensors") or name == WEIGHT_INDEX or name.endswith(".bin")


def read_model_dir(directory: str | Path) -> tuple[dict, dict[str, Any], dict[str, bytes]]:
    """Tensors, parsed config.json and the other small files of a local HF model directory."""
    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ModelError(f"model directory: {directory} has no config.json")
    architecture = json.loads(config_path.read_text())
    aux = {p.name: p.read_bytes() for p in sorted(directory.iterdir())
           if p.is_file() and p.name != "config.json" and not _is_weight_file(p.name)
           and _SAFE_NAME.match(p.name)}
    return read_model_tensors(directory), architecture, aux


def bundle_files(files: dict[str, bytes]) -> bytes:
    """Canonical JSON bundle of small files (name -> base64 content)."""
    for name in files:
        if not _SAFE_NAME.match(name) or name == "config.json" or _is_weight_file(name):
            raise ModelError(f"bundle: file name {name!r} is not allowed in a file bundle")
    return canonical_json({"format": BUNDLE_FORMAT, "schema_version": 1,
                           "files": {k: base64.b64encode(v).decode() for k, v in sorted(files.items())}})


def unbundle_files(data: bytes) -> dict[str, bytes]:
    """The files of a bundle, validated (names, sizes, encoding)."""
    from krill.payload.canonical import loads_bounded

    raw = loads_bounded(data, 4, "bundle")  # {"files": {name: base64}} is two levels deep
    if not isinstance(raw, dict) or raw.get("format") != BUNDLE_FORMAT or raw.get("schema_version") != 1:
        raise PayloadError("expected a krill-files bundle, schema_version 1", field="bundle.format")
    if set(raw) != {"format", "schema_version", "files"} or not isinstance(raw["files"], dict):
        raise PayloadError("expected exactly format, schema_version and files", field="bundle")
    out = {}
    for name, content in raw["files"].items():
        if not _SAFE_NAME.match(name) or name == "config.json" or _is_weight_file(name):
            raise PayloadError(f"file name {name!r} is not allowed", field="bundle.files")
        try:
            out[name] = base64.b64decode(content, validate=True)
        except (TypeError, ValueError):
            raise PayloadError(f"{name}: not base64", field="bundle.files") from None
        if len(out[name]) > MAX_BUNDLE_FILE_BYTES:
            raise PayloadError(f"{name}: larger than {MAX_BUNDLE_FILE_BYTES} bytes", field="bundle.files")
    return out


def _add(store, data: bytes) -> str:
    from krill.store.cid import file_cid

    cid = file_cid(data)
    stored = store.add(data, pin=True)  # a version's weights, manifest and tokenizer outlive any garbage collection
    if stored != cid:
        raise ModelError(f"store: answered CID {stored} for content whose CID is {cid}")
    return cid


def _shard_entry(store, index: int, tensors: dict) -> ShardEntry:
    data = shard_to_bytes(tensors)
    params = [ParameterEntry(name=k, shape=list(v.shape), dtype=_dtype_name(v)) for k, v in tensors.items()]
    return ShardEntry(index=index, cid=_add(store, data), sha256=hashlib.sha256(data).hexdigest(),
                      size=len(data), parameters=params)


def _publish_manifest(store, manifest: Manifest) -> tuple[Manifest, str]:
    return manifest, _add(store, manifest.canonical_bytes())


def publish_model(store, tensors: dict, architecture: dict[str, Any], aux_files: dict[str, bytes],
                  num_shards: int, version: int = 0, parent: str | None = None) -> tuple[Manifest, str]:
    """Split `tensors` into `num_shards` shards, store them and a manifest; return it and its CID."""
    plan = plan_shards(tensors, num_layers_of(architecture, tensors), num_shards)
    shards = [_shard_entry(store, i, {n: tensors[n] for n in names}) for i, names in enumerate(plan)]
    tokenizer = _add(store, bundle_files(aux_files))
    return _publish_manifest(store, Manifest(version=version, parent=parent, architecture=architecture,
                                             tokenizer=tokenizer, shards=shards))


def publish_model_dir(store, directory: str | Path, num_shards: int, version: int = 0,
                      parent: str | None = None) -> tuple[Manifest, str]:
    """`publish_model` of a local HF model directory (a base model, version 0, in float32: module docstring)."""
    tensors, architecture, aux = read_model_dir(directory)
    if version == 0:
        tensors, architecture = widened_to_float32(tensors, architecture)
    return publish_model(store, tensors, architecture, aux, num_shards, version=version, parent=parent)


def widened_to_float32(tensors: dict, architecture: dict[str, Any]) -> tuple[dict, dict[str, Any]]:
    """Floating tensors narrower than float32 widened to it (exact), and the config's dtype to match."""
    import torch

    narrow = {t for t in (torch.float16, torch.bfloat16, getattr(torch, "float8_e4m3fn", None),
                          getattr(torch, "float8_e5m2", None)) if t is not None}
    if not any(t.dtype in narrow for t in tensors.values()):
        return tensors, architecture
    wide = {n: t.to(torch.float32) if t.dtype in narrow else t for n, t in tensors.items()}
    return wide, {**architecture, **{k: "float32" for k in ("torch_dtype", "dtype") if k in architecture}}


def publish_update(store, parent: Manifest, parent_cid: str, shard_tensors: dict[int, dict],
                   version: int) -> tuple[Manifest, str]:
    """The next version: shards in `shard_tensors` replaced (same names, shapes, dtypes), others kept."""
    if version <= parent.version:
        raise ModelError(f"version: {version} does not follow the parent's {parent.version}")
    shards = list(parent.shards)
    for index, tensors in sorted(shard_tensors.items()):
        if not 0 <= index < parent.num_shards:
            raise ModelError(f"shard: index {index} outside 0..{parent.num_shards - 1}")
        entry = _shard_entry(store, index, {n: tensors[n] for n in parent.shard_names(index) if n in tensors})
        if entry.parameters != parent.shards[index].parameters or len(tensors) != len(entry.parameters):
            raise ModelError(f"shard {index}: tensors differ from the parent's in names, shapes or dtypes")
        shards[index] = entry
    return _publish_manifest(store, Manifest(version=version, parent=parent_cid, architecture=parent.architecture,
                                             tokenizer=parent.tokenizer, shards=shards))


def load_manifest(store, cid: str) -> Manifest:
    """Fetch and validate the manifest stored under `cid` (at most `MAX_MANIFEST_BYTES` are read)."""
    from krill.store.cid import file_cid

    try:
        data = store.get(cid, max_bytes=MAX_MANIFEST_BYTES)
    except ObjectTooLargeError:
        raise ModelError(f"manifest: {cid} is larger than a manifest may be ({MAX_MANIFEST_BYTES} bytes)") from None
    if file_cid(data) != cid:
        raise ModelError(f"manifest: content fetched for {cid} does not hash to it")
    return Manifest.from_bytes(data)


def fetch_shard(store, manifest: Manifest, index: int) -> dict:
    """The tensors of shard `index`, checked against the manifest (digest, names, shapes, dtypes)."""
    import torch

    entry = manifest.shards[index]
    try:
        data = store.get(entry.cid, max_bytes=entry.size)
    except ObjectTooLargeError:
        raise ModelError(f"shard {index}: {entry.cid} holds more than the manifest's size of {entry.size} bytes") from None
    if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
        raise ModelError(f"shard {index}: content of {entry.cid} does not match the manifest's sha256/size")
    tensors = shard_from_bytes(data)
    got = sorted((k, list(v.shape), _dtype_name(v)) for k, v in tensors.items())
    want = sorted((p.name, p.shape, p.dtype) for p in entry.parameters)
    if got != want:
        raise ModelError(f"shard {index}: tensors differ from the manifest's names, shapes or dtypes")
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ModelError(f"shard {index}: tensor {name!r} holds NaN or infinite weights")
    return {p.name: tensors[p.name] for p in entry.parameters}


def fetch_tensors(store, manifest: Manifest) -> dict:
    """Every tensor of the model version, shard by shard."""
    tensors: dict = {}
    for index in range(manifest.num_shards):
        tensors.update(fetch_shard(store, manifest, index))
    return tensors


def assemble_files(store, manifest: Manifest) -> dict[str, bytes]:
    """The files of a plain HF model directory for this version (name -> bytes)."""
    from safetensors.torch import save

    from krill.store.cid import file_cid

    bundle = store.get(manifest.tokenizer)
    if file_cid(bundle) != manifest.tokenizer:
        raise ModelError(f"tokenizer: content fetched for {manifest.tokenizer} does not hash to it")
    files = unbundle_files(bundle)
    tensors = fetch_tensors(store, manifest)
    files["model.safetensors"] = save(tensors, metadata={"format": "pt"})
    files["config.json"] = (json.dumps(manifest.architecture, indent=2, sort_keys=True) + "\n").encode()
    return files


def assemble_model_dir(store, manifest: Manifest, out_dir: str | Path) -> Path:
    """Write this version as a plain HF model directory (loadable by `from_pretrained`)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, data in assemble_files(store, manifest).items():
        (out_dir / name).write_bytes(data)
    return out_dir


def load_version(store, manifest: Manifest):
    """The model and tokenizer of a version, loaded like any local HF directory."""
    import tempfile

    from krill.model.build import load_model

    with tempfile.TemporaryDirectory(prefix="krill-version-") as tmp:
        return load_model(assemble_model_dir(store, manifest, tmp))
