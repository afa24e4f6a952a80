"""Gradient compression on a shared coordinate mask (DESIGN §6).

Design decisions:
- The mask is public, not chosen by the worker: for version v, tensor `name`, it is the top
  coordinates of |reference| (the previous aggregate, or the optimizer momentum, both public)
  plus a random share drawn with seed H(run, v, name) for exploration. Every worker sends
  values on the same coordinates, so a coordinate-wise trimmed mean compares like with like;
  independent per-worker top-k masks would make most coordinates zero for most workers and
  the trimmed mean would discard the update. A public mask also means indices never travel.
- `dense_versions` (default 0) makes the first versions send every coordinate. Measured
  2026-12-06 (2 cores): in process (`krill train local`, seeds 0-2) 30% held-out accuracy came at
  versions 30/25/15 with 15 dense versions against 35/30/40 from a sparse start, but in time the
  dense versions' cost (twice a sparse one) ate the gain (10/10/15 s against 10/10/10). In four
  default demos with 15 dense versions 30% came 3 s sooner (14.9-15.4 s against 17-20) and 50%
  10-20 s later (72-78 s against 53-68 in the eleven sparse-start demos since 03:24). The gain is
  not the mask's coverage (the momentum starts on version 0's random quarter): fresh random masks
  for the first 5, 10 or 20 versions reached 30% at versions 35-40, as the sparse start did; it is
  updating every coordinate, at 4x the bytes. So the default stays sparse, and is left out of the
  spec's encoding (run ids of earlier specs are unchanged); the option is there for runs whose
  early versions are cheap next to their bytes.
- Ties in |reference| are broken by coordinate index (as a stable sort would; found in linear
  time from the k-th largest value), and the exploration draw
  uses a CPU `torch.Generator`, so every party derives the identical mask.
- Values travel as fp16, bf16, or int8 in blocks with one float32 scale per block
  (scale = max|x| / 127, round to nearest): a handful of outliers only cost precision in their
  own block. Decoding refuses what the encoder never writes: int8 -128 (times the largest
  accepted scale it was -inf, which then failed the whole shard's aggregation), parts other than
  the codec's, and keys not named `<tensor>/<part>` (a bare ValueError before).
- A compressed shard is a safetensors blob (values, scales); `compression_ratio` is measured
  from bytes, dense float32 safetensors over compressed safetensors.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_serializer
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from krill.errors import PayloadError


class CompressionConfig(BaseModel):
    """How gradient shards are compressed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    density: float = Field(0.1, gt=0.0, le=1.0, description="Fraction of each tensor's coordinates sent.")
    explore_fraction: float = Field(0.25, ge=0.0, le=1.0,
                                    description="Share of the mask drawn at random (seeded) rather than by |reference|.")
    dtype: Literal["fp16", "bf16", "int8"] = Field("int8", description="Encoding of the values on the mask.")
    block_size: int = Field(256, ge=8, le=1 << 20, description="Values per int8 block (one float32 scale each).")
    dense_versions: int = Field(0, ge=0, le=1_000_000,
                                description="Versions 0 .. n-1 send every coordinate (4x the bytes of a 25% mask); "
                                            "the shared mask applies from version n.")

    @model_serializer(mode="wrap")
    def _omit_sparse_start(self, handler):
        """A sparse start (the default) is left out of the encoding, so run specs published before the
        option existed keep their bytes, their canonical form and their run id."""
        data = handler(self)
        if self.dense_versions == 0:
            data.pop("dense_versions", None)
        return data


def mask_seed(run: str, version: int, name: str) -> int:
    """Seed of the exploration share of a mask: H(run, version, tensor name), 63 bits."""
    digest = hashlib.sha256(f"krill-mask\x00{run}\x00{int(version)}\x00{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def flat_indices(mask: torch.Tensor) -> torch.Tensor:
    """Sorted int64 indices of the true entries of a flat boolean tensor: `torch.nonzero(mask).flatten()`,
    through numpy's `flatnonzero`, five times faster on CPU (masks are derived by every party for
    every version)."""
    return torch.from_numpy(np.flatnonzero(mask.reshape(-1).numpy()))


def _top_mask(values: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask of the k largest values, ties broken by lower index: the first k of a stable descending sort.

    Computed from the k-th largest value (numpy's introselect, linear time and 5x faster than
    torch's `kthvalue` at 64k values) instead of a full sort: every value above it, then the
    lowest indices among those equal to it (usually all of them: one).
    """
    n = values.numel()
    if k >= n:
        return torch.ones(n, dtype=torch.bool)
    values = values.detach().reshape(-1).contiguous()
    threshold = torch.from_numpy(np.partition(values.numpy(), n - k)[n - k:n - k + 1].copy()).reshape(())
    chosen = values > threshold
    missing = k - int(chosen.sum())
    if missing > 0:
        ties = values == threshold
        if int(ties.sum()) == missing:
            chosen |= ties
        else:
            chosen[flat_indices(ties)[:missing]] = True
    return chosen


def _top_indices(values: torch.Tensor, k: int) -> torch.Tensor:
    """Sorted indices of `_top_mask(values, k)`."""
    return flat_indices(_top_mask(values, k))


def mask_size(numel: int, config: CompressionConfig, version: int) -> int:
    """How many of a tensor's `numel` coordinates its mask at `version` holds: all of them for the first
    `dense_versions` versions, then ceil(density x numel), at least one."""
    if version < config.dense_versions:
        return numel
    return min(numel, max(1, math.ceil(config.density * numel)))


def shared_mask(name: str, numel: int, reference: torch.Tensor | None, config: CompressionConfig,
                run: str, version: int) -> torch.Tensor:
    """Sorted int64 flat indices of the coordinates sent for tensor `name` at `version`."""
    k = mask_size(numel, config, version)
    if k >= numel:
        return torch.arange(numel, dtype=torch.int64)
    k_explore = k if reference is None else int(round(config.explore_fraction * k))
    if k - k_explore > 0:
        ref = reference.detach().reshape(-1).abs().to(torch.float32)
        if ref.numel() != numel:
            raise PayloadError(f"reference has {ref.numel()} coordinates, tensor has {numel}", field=name)
        chosen = _top_mask(ref, k - k_explore)
    else:
        chosen = torch.zeros(numel, dtype=torch.bool)
    if k_explore > 0:
        generator = torch.Generator(device="cpu").manual_seed(mask_seed(run, version, name))
        rest = flat_indices(~chosen)
        pick = torch.randperm(len(rest), generator=generator)[:k_explore]
        chosen[rest[pick]] = True
    return flat_indices(chosen)


def shared_masks(shapes: dict[str, torch.Size], references: dict[str, torch.Tensor] | None,
                 config: CompressionConfig, run: str, version: int) -> dict[str, torch.Tensor]:
    refs = references or {}
    return {name: shared_mask(name, math.prod(shape), refs.get(name), config, run, version)
            for name, shape in sorted(shapes.items())}


def encode_values(values: torch.Tensor, config: CompressionConfig) -> dict[str, torch.Tensor]:
    """Encode a 1-D float tensor: {'v': values} or, for int8, {'q': int8 values, 's': block scales}."""
    values = values.detach().to(torch.float32).reshape(-1)
    if config.dtype == "fp16":
        return {"v": values.to(torch.float16)}
    if config.dtype == "bf16":
        return {"v": values.to(torch.bfloat16)}
    n = values.numel()
    blocks = math.ceil(n / config.block_size)
    padded = torch.zeros(blocks * config.block_size, dtype=torch.float32)
    padded[:n] = values
    padded = padded.view(blocks, config.block_size)
    scales = padded.abs().amax(dim=1) / 127.0
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.clamp(torch.round(padded / safe.unsqueeze(1)), -127, 127).to(torch.int8)
    return {"q": q.reshape(-1)[:n].contiguous(), "s": scales}


def _encode_int8_many(values: list[torch.Tensor], block_size: int) -> list[dict[str, torch.Tensor]]:
    """`encode_values` (int8) of several tensors with one pass over all their blocks: the same bytes."""
    counts = [v.numel() for v in values]
    blocks = [math.ceil(n / block_size) for n in counts]
    pieces = []
    for v, n, b in zip(values, counts, blocks, strict=True):
        pieces.append(v.to(torch.float32))
        pieces.append(torch.zeros(b * block_size - n, dtype=torch.float32))
    padded = torch.cat(pieces).view(-1, block_size)
    scales = padded.abs().amax(dim=1) / 127.0
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.clamp(torch.round(padded / safe.unsqueeze(1)), -127, 127).to(torch.int8)
    out = []
    for qi, si, n in zip(torch.split(q, blocks), torch.split(scales, blocks), counts, strict=True):
        out.append({"q": qi.reshape(-1)[:n].contiguous(), "s": si.contiguous()})
    return out


def _decode_int8_many(parts: dict[str, dict[str, torch.Tensor]], counts: dict[str, int],
                      block_size: int) -> dict[str, torch.Tensor]:
    """`decode_values` (int8) of several tensors with one pass over all their blocks: the same values."""
    pieces, scales, blocks = [], [], []
    for name, n in counts.items():
        q, s = parts[name].get("q"), parts[name].get("s")
        b = math.ceil(n / block_size)
        if q is None or q.dtype != torch.int8 or q.numel() != n:
            raise PayloadError(f"expected {n} int8 values", field=f"{name}/q")
        if s is None or s.dtype != torch.float32 or s.numel() != b:
            raise PayloadError(f"expected {b} float32 block scales", field=f"{name}/s")
        if set(parts[name]) != {"q", "s"}:
            raise PayloadError(f"unexpected parts {sorted(set(parts[name]) - {'q', 's'})}", field=name)
        pieces.append(q.reshape(-1))
        pieces.append(torch.zeros(b * block_size - n, dtype=torch.int8))
        scales.append(s.reshape(-1))
        blocks.append(b)
    if not pieces:
        return {}
    scale = torch.cat(scales)
    if not bool((torch.isfinite(scale) & (scale.abs() <= _MAX_INT8_SCALE)).all()):
        bad = next(name for name, s in zip(counts, scales, strict=True)
                   if not bool((torch.isfinite(s) & (s.abs() <= _MAX_INT8_SCALE)).all()))
        raise PayloadError("block scales contain NaN, infinity or values too large to decode", field=f"{bad}/s")
    q = torch.cat(pieces)
    if bool((q == -128).any()):  # times the largest accepted scale, -128 is -inf
        bad = next(name for name in counts if bool((parts[name]["q"] == -128).any()))
        raise PayloadError("int8 value -128 (the codec is symmetric, [-127, 127])", field=f"{bad}/q")
    values = q.to(torch.float32).view(-1, block_size) * scale.unsqueeze(1)
    return {name: v.reshape(-1)[:n] for (name, n), v in zip(counts.items(), torch.split(values, blocks), strict=True)}


def decode_values(parts: dict[str, torch.Tensor], n: int, config: CompressionConfig) -> torch.Tensor:
    """Inverse of `encode_values` (float32 [n]); rejects payloads of the wrong size or type."""
    if config.dtype in ("fp16", "bf16"):
        v = parts.get("v")
        want = torch.float16 if config.dtype == "fp16" else torch.bfloat16
        if v is None or v.dtype != want or v.numel() != n:
            raise PayloadError(f"expected {n} {config.dtype} values", field="v")
        if set(parts) != {"v"}:
            raise PayloadError(f"unexpected parts {sorted(set(parts) - {'v'})}", field="v")
        out = v.to(torch.float32)
    else:
        q, s = parts.get("q"), parts.get("s")
        blocks = math.ceil(n / config.block_size)
        if q is None or q.dtype != torch.int8 or q.numel() != n:
            raise PayloadError(f"expected {n} int8 values", field="q")
        if s is None or s.dtype != torch.float32 or s.numel() != blocks:
            raise PayloadError(f"expected {blocks} float32 block scales", field="s")
        if set(parts) != {"q", "s"}:
            raise PayloadError(f"unexpected parts {sorted(set(parts) - {'q', 's'})}", field="q")
        if bool((q == -128).any()):
            raise PayloadError("int8 value -128 (the codec is symmetric, [-127, 127])", field="q")
        # Values in [-127, 127] times finite scales of at most float32 max / 127 are finite: checking the
        # scales suffices (-128 x that scale overflowed to -inf, hence the symmetric range above).
        if not bool((torch.isfinite(s) & (s.abs() <= _MAX_INT8_SCALE)).all()):
            raise PayloadError("block scales contain NaN, infinity or values too large to decode", field="s")
        padded = torch.zeros(blocks * config.block_size, dtype=torch.float32)
        padded[:n] = q.to(torch.float32)
        return (padded.view(blocks, config.block_size) * s.unsqueeze(1)).reshape(-1)[:n]
    if not torch.isfinite(out).all():
        raise PayloadError("values contain NaN or infinity", field="values")
    return out


_MAX_INT8_SCALE = torch.finfo(torch.float32).max / 127


def compress(grads: dict[str, torch.Tensor], masks: dict[str, torch.Tensor], config: CompressionConfig) -> bytes:
    """A safetensors blob of each tensor's values on its mask (keys `<name>/<part>`)."""
    tensors: dict[str, torch.Tensor] = {}
    names = sorted(grads)
    for name in names:
        if name not in masks:
            raise PayloadError("no mask for this tensor", field=name)
    values = [grads[name].detach().reshape(-1).index_select(0, masks[name]) for name in names]
    encoded = _encode_int8_many(values, config.block_size) if config.dtype == "int8" and values else \
        [encode_values(v, config) for v in values]
    for name, parts in zip(names, encoded, strict=True):
        for part, t in parts.items():
            tensors[f"{name}/{part}"] = t
    # A single metadata key: safetensors writes a metadata map in hash order (non-deterministic bytes).
    return _safetensors_bytes(tensors, {"format": f"krill-masked-grad/1;dtype={config.dtype}"})


# safetensors' dtype names, in the order its writer lays tensors out (larger first, then by name).
_ST_DTYPES = {torch.float32: ("F32", 3), torch.bfloat16: ("BF16", 2), torch.float16: ("F16", 1), torch.int8: ("I8", 0)}


def _safetensors_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """The bytes `safetensors.torch.save(tensors, metadata=metadata)` writes, for 1-D tensors of `_ST_DTYPES`.

    Written here in one copy: the library's writer converts every tensor through numpy and copies
    the buffer twice more, which was a third of `compress` (0.53 of 1.46 ms per shard blob of the
    default model). tests/unit/rl/test_compression.py checks the bytes against the library's.
    """
    order = sorted(tensors, key=lambda name: (-_ST_DTYPES[tensors[name].dtype][1], name))
    header: dict[str, object] = {"__metadata__": metadata}
    parts = []
    offset = 0
    for name in order:
        t = tensors[name].detach().reshape(-1).contiguous()
        data = t.view(torch.uint8).numpy() if t.numel() else b""
        header[name] = {"dtype": _ST_DTYPES[t.dtype][0], "shape": [t.numel()], "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        parts.append(data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return b"".join([len(text).to_bytes(8, "little"), text, *parts])


def decompress_values(blob: bytes, masks: dict[str, torch.Tensor], config: CompressionConfig) -> dict[str, torch.Tensor]:
    """Values on each mask (float32 [k]), validated against the public masks."""
    try:
        tensors = st_load(blob)
    except Exception as exc:  # safetensors raises several types on malformed input
        raise PayloadError(f"not a safetensors blob: {exc}", field="gradient") from exc
    bad = next((key for key in tensors if "/" not in key), None)
    if bad is not None:
        raise PayloadError(f"tensor {bad[:64]!r} is not named <tensor>/<part>", field="gradient")
    names = {key.rsplit("/", 1)[0] for key in tensors}
    if names != set(masks):
        raise PayloadError(f"tensors {sorted(names ^ set(masks))[:3]} do not match the mask set", field="gradient")
    grouped: dict[str, dict[str, torch.Tensor]] = {name: {} for name in masks}
    for key, t in tensors.items():
        name, part = key.rsplit("/", 1)
        grouped[name][part] = t
    if config.dtype == "int8":
        return _decode_int8_many(grouped, {name: idx.numel() for name, idx in masks.items()}, config.block_size)
    return {name: decode_values(grouped[name], idx.numel(), config) for name, idx in masks.items()}


def densify(values: dict[str, torch.Tensor], masks: dict[str, torch.Tensor],
            shapes: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
    """Scatter masked values back into dense float32 tensors (zeros off the mask)."""
    out = {}
    for name, shape in shapes.items():
        dense = torch.zeros(math.prod(shape), dtype=torch.float32)
        dense.index_copy_(0, masks[name], values[name])
        out[name] = dense.view(shape)
    return out


def decompress(blob: bytes, masks: dict[str, torch.Tensor], shapes: dict[str, torch.Size],
               config: CompressionConfig) -> dict[str, torch.Tensor]:
    return densify(decompress_values(blob, masks, config), masks, shapes)


def dense_bytes(grads: dict[str, torch.Tensor]) -> int:
    """Size of the uncompressed float32 safetensors encoding, the baseline of the ratio."""
    return len(st_save({k: v.detach().float().contiguous() for k, v in grads.items()}))


def compression_ratio(grads: dict[str, torch.Tensor], blob: bytes) -> float:
    return dense_bytes(grads) / max(len(blob), 1)
