"""A version's public gradient masks as one published blob: one bit per coordinate.

Design decisions:
- The masks of version v are a deterministic function of public state (DESIGN §6: the AdamW
  momentum after v's step plus a seeded random share), so publishing them adds no trust: the
  coordinator stores them with the version and names their sha256 in the aggregation record,
  and `krill audit` derives them again from the momentum and compares. What it saves is the
  momentum's transport: a worker or verifier that only needs the masks fetches 1 bit per
  coordinate instead of the AdamW state (2 x 32 bits per coordinate: both moments, as the
  state is stored), and skips the top-k selection.
- Format: safetensors, one uint8 tensor per parameter name holding its mask as a little-endian
  bitmap (`numpy.packbits(..., bitorder="little")`, padding bits zero), and one metadata key
  (format, run, version). safetensors lays tensors out by name, and with a single metadata key
  the bytes are a function of the masks alone, as a content-addressed blob must be.
- Decoding checks everything a mask must satisfy that does not need the momentum: the names and
  sizes of the version's tensors, zero padding, and exactly as many coordinates as the spec's
  compression gives at that version (`mask_size`: all of them during its dense versions, else the
  density). So a bad blob can never make a worker send a gradient of the wrong length; only which
  coordinates were chosen is left to the audit.
"""

from __future__ import annotations

import json
import math

import numpy as np
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from krill.errors import PayloadError
from krill.payload.canonical import loads_bounded
from krill.rl.compression import CompressionConfig, flat_indices, mask_size

MASKS_FORMAT = "krill-masks/1"
_META_KEY = "krill-masks"


def encode_masks(masks: dict[str, torch.Tensor], shapes: dict[str, torch.Size], run: str, version: int) -> bytes:
    """The blob of `masks` (name -> sorted flat int64 indices) for tensors of `shapes`."""
    if set(masks) != set(shapes):
        raise PayloadError(f"masks and tensors differ in names: {sorted(set(masks) ^ set(shapes))[:3]}", field="masks")
    tensors = {}
    for name in sorted(shapes):
        bits = np.zeros(math.prod(shapes[name]), dtype=bool)
        bits[masks[name].numpy()] = True
        tensors[name] = torch.from_numpy(np.packbits(bits, bitorder="little"))
    meta = {"format": MASKS_FORMAT, "run": run, "version": int(version)}
    return st_save(tensors, metadata={_META_KEY: json.dumps(meta, sort_keys=True)})


def decode_masks(blob: bytes, shapes: dict[str, torch.Size], config: CompressionConfig, run: str,
                 version: int) -> dict[str, torch.Tensor]:
    """The masks in `blob`, checked against the version's tensors and the spec's density."""
    try:
        tensors = st_load(blob)
        size = int.from_bytes(blob[:8], "little")
        header = loads_bounded(blob[8:8 + size], 4, "masks")  # safetensors read it already
        meta = loads_bounded(header.get("__metadata__", {}).get(_META_KEY, "{}"), 4, "masks")
    except Exception as exc:  # safetensors raises its own error type for malformed headers
        raise PayloadError(f"not a safetensors mask blob: {exc}", field="masks") from None
    if not isinstance(meta, dict) or meta.get("format") != MASKS_FORMAT:
        raise PayloadError(f"metadata is not {MASKS_FORMAT}", field="masks")
    if meta.get("run") != run or meta.get("version") != int(version):
        raise PayloadError(f"masks of run {str(meta.get('run'))[:16]}… version {meta.get('version')}, "
                           f"expected run {run[:16]}… version {version}", field="masks")
    if set(tensors) != set(shapes):
        raise PayloadError(f"mask names differ from the model's: {sorted(set(tensors) ^ set(shapes))[:3]}",
                           field="masks")
    out = {}
    for name in sorted(shapes):
        numel, packed = math.prod(shapes[name]), tensors[name]
        if packed.dtype != torch.uint8 or packed.dim() != 1 or packed.numel() != math.ceil(numel / 8):
            raise PayloadError(f"expected {math.ceil(numel / 8)} uint8 bytes, got {tuple(packed.shape)} "
                               f"{packed.dtype}", field=f"masks/{name}")
        bits = np.unpackbits(packed.numpy(), bitorder="little")
        if bits[numel:].any():
            raise PayloadError("padding bits are set", field=f"masks/{name}")
        chosen = torch.from_numpy(bits[:numel].astype(bool))
        want = mask_size(numel, config, version)
        if int(chosen.sum()) != want:
            raise PayloadError(f"{int(chosen.sum())} coordinates, the spec's compression gives {want} at version {version}",
                               field=f"masks/{name}")
        out[name] = flat_indices(chosen)
    return out
