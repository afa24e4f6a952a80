"""Gradient compression on a shared coordinate mask (DESIGN §6).

Design decisions:
- The mask is public, not chosen by the worker: for version v, tensor `name`, it is the top
  coordinates of |reference| (the previous aggregate, or the optimizer momentum, both public)
  plus a random share drawn with seed H(run, v, name) for exploration. Every worker sends
  values on the same coordinates, so a coordinate-wise trimmed mean compares like with like;
  independent per-worker top-k masks would make most coordinates zero for most workers and
  the trimmed mean would discard the update. A public mask also means indices never travel.
- Ties in |reference| are broken by coordinate index (stable sort), and the exploration draw
  uses a CPU `torch.Generator`, so every party derives the identical mask.
- Values travel as fp16, bf16, or int8 in blocks with one float32 scale per block
  (scale = max|x| / 127, round to nearest): a handful of outliers only cost precision in their
  own block.
- A compressed shard is a safetensors blob (values, scales); `compression_ratio` is measured
  from bytes, dense float32 safetensors over compressed safetensors.
"""

from __future__ import annotations

import hashlib
import math
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
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


def mask_seed(run: str, version: int, name: str) -> int:
    """Seed of the exploration share of a mask: H(run, version, tensor name), 63 bits."""
    digest = hashlib.sha256(f"krill-mask\x00{run}\x00{int(version)}\x00{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def shared_mask(name: str, numel: int, reference: torch.Tensor | None, config: CompressionConfig,
                run: str, version: int) -> torch.Tensor:
    """Sorted int64 flat indices of the coordinates sent for tensor `name` at `version`."""
    k = max(1, math.ceil(config.density * numel))
    if k >= numel:
        return torch.arange(numel, dtype=torch.int64)
    k_explore = k if reference is None else int(round(config.explore_fraction * k))
    chosen = torch.zeros(numel, dtype=torch.bool)
    if k - k_explore > 0:
        ref = reference.detach().reshape(-1).abs().to(torch.float32)
        if ref.numel() != numel:
            raise PayloadError(f"reference has {ref.numel()} coordinates, tensor has {numel}", field=name)
        order = torch.sort(ref, descending=True, stable=True).indices
        chosen[order[:k - k_explore]] = True
    if k_explore > 0:
        generator = torch.Generator(device="cpu").manual_seed(mask_seed(run, version, name))
        rest = torch.nonzero(~chosen).flatten()
        pick = torch.randperm(len(rest), generator=generator)[:k_explore]
        chosen[rest[pick]] = True
    return torch.nonzero(chosen).flatten()


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


def decode_values(parts: dict[str, torch.Tensor], n: int, config: CompressionConfig) -> torch.Tensor:
    """Inverse of `encode_values` (float32 [n]); rejects payloads of the wrong size or type."""
    if config.dtype in ("fp16", "bf16"):
        v = parts.get("v")
        want = torch.float16 if config.dtype == "fp16" else torch.bfloat16
        if v is None or v.dtype != want or v.numel() != n:
            raise PayloadError(f"expected {n} {config.dtype} values", field="v")
        out = v.to(torch.float32)
    else:
        q, s = parts.get("q"), parts.get("s")
        blocks = math.ceil(n / config.block_size)
        if q is None or q.dtype != torch.int8 or q.numel() != n:
            raise PayloadError(f"expected {n} int8 values", field="q")
        if s is None or s.dtype != torch.float32 or s.numel() != blocks:
            raise PayloadError(f"expected {blocks} float32 block scales", field="s")
        padded = torch.zeros(blocks * config.block_size, dtype=torch.float32)
        padded[:n] = q.to(torch.float32)
        out = (padded.view(blocks, config.block_size) * s.unsqueeze(1)).reshape(-1)[:n]
    if not torch.isfinite(out).all():
        raise PayloadError("values contain NaN or infinity", field="values")
    return out


def compress(grads: dict[str, torch.Tensor], masks: dict[str, torch.Tensor], config: CompressionConfig) -> bytes:
    """A safetensors blob of each tensor's values on its mask (keys `<name>/<part>`)."""
    tensors: dict[str, torch.Tensor] = {}
    for name in sorted(grads):
        if name not in masks:
            raise PayloadError("no mask for this tensor", field=name)
        values = grads[name].reshape(-1)[masks[name]]
        for part, t in encode_values(values, config).items():
            tensors[f"{name}/{part}"] = t
    # A single metadata key: safetensors writes a metadata map in hash order (non-deterministic bytes).
    return st_save(tensors, metadata={"format": f"krill-masked-grad/1;dtype={config.dtype}"})


def decompress_values(blob: bytes, masks: dict[str, torch.Tensor], config: CompressionConfig) -> dict[str, torch.Tensor]:
    """Values on each mask (float32 [k]), validated against the public masks."""
    try:
        tensors = st_load(blob)
    except Exception as exc:  # safetensors raises several types on malformed input
        raise PayloadError(f"not a safetensors blob: {exc}", field="gradient") from exc
    names = {key.rsplit("/", 1)[0] for key in tensors}
    if names != set(masks):
        raise PayloadError(f"tensors {sorted(names ^ set(masks))[:3]} do not match the mask set", field="gradient")
    out = {}
    for name, idx in masks.items():
        parts = {key.rsplit("/", 1)[1]: t for key, t in tensors.items() if key.rsplit("/", 1)[0] == name}
        out[name] = decode_values(parts, idx.numel(), config)
    return out


def densify(values: dict[str, torch.Tensor], masks: dict[str, torch.Tensor],
            shapes: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
    """Scatter masked values back into dense float32 tensors (zeros off the mask)."""
    out = {}
    for name, shape in shapes.items():
        dense = torch.zeros(math.prod(shape), dtype=torch.float32)
        dense[masks[name]] = values[name]
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
