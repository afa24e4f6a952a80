"""The gradient-shard payload: one shard's gradient, as values on the version's shared mask.

Design decisions:
- For version v every tensor of a shard has a public coordinate mask (DESIGN §6); a worker sends
  only the values at those coordinates, in mask order, so tensor `name` is 1-D of the mask's length.
  The caller passes the expected lengths (from the manifest and the mask) and anything else is
  refused: the set of names, every length, the dtype the codec implies.
- Codecs: `fp32`, `fp16`, `bf16` (one tensor per name), and `int8-block` (tensor `name` as int8 in
  [-127, 127] plus `name::scale`, one float32 scale per block of `block_size` values; value =
  q x scale). Decoding always yields float32 so aggregation does not care about the codec.
- NaN and infinity are refused on decode (a NaN would poison a trimmed mean's sort) and on encode
  (an fp16 overflow becomes infinity: the worker must clip first). bf16 and int8 blocks cover every
  finite float32: a value that bf16 rounding would carry to infinity is written as the largest
  finite bf16 (one bf16 step away), and an int8 block scale that 127 x would overflow is taken one
  float32 step smaller, so the encoder never writes a shard its peers refuse.
- Metadata names the format version, shard, codec and block size; a file for another shard is a
  `ContextMismatchError`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from krill.payload.errors import (
    ContextMismatchError,
    NonFiniteError,
    SchemaError,
    ShapeError,
    UnsupportedVersionError,
    ValueRangeError,
)
from krill.payload.limits import PayloadLimits
from krill.payload.tensors import encode_safetensors, float_to_bf16_bits, parse_safetensors

FORMAT = "krill-grad"
VERSION = "1"
CODECS = {"fp32": "F32", "fp16": "F16", "bf16": "BF16", "int8-block": "I8"}
SCALE_SUFFIX = "::scale"
DEFAULT_BLOCK = 256


@dataclass(frozen=True, eq=False)
class GradientShard:
    shard: int
    codec: str
    values: dict[str, np.ndarray]  # name -> float32 values on the mask (decoded)
    block_size: int = DEFAULT_BLOCK

    def encode(self) -> bytes:
        """Compress with the codec and write safetensors (deterministic bytes)."""
        where = f"grad-{self.shard}"
        if self.codec not in CODECS:
            raise SchemaError(f"unknown codec {self.codec!r}; one of {sorted(CODECS)}", field=f"{where}.codec")
        if not 1 <= self.block_size <= 1 << 20:
            raise SchemaError("block_size must be in [1, 2**20]", field=f"{where}.block_size")
        tensors: dict[str, tuple[str, np.ndarray]] = {}
        for name, values in self.values.items():
            values = np.asarray(values, dtype=np.float32)
            if values.ndim != 1:
                raise ShapeError("values on a mask are 1-D", field=f"{where}.{name}")
            if not np.isfinite(values).all():
                raise NonFiniteError("NaN or infinity in the gradient", field=f"{where}.{name}")
            if self.codec == "fp32":
                tensors[name] = ("F32", values)
            elif self.codec == "fp16":
                with np.errstate(over="ignore"):
                    half = values.astype(np.float16)
                if not np.isfinite(half).all():
                    raise NonFiniteError("value overflows fp16; clip before encoding", field=f"{where}.{name}")
                tensors[name] = ("F16", half)
            elif self.codec == "bf16":
                bits = float_to_bf16_bits(values)
                bits[(bits & 0x7FFF) == 0x7F80] -= 1  # rounded past the largest finite bf16: saturate
                tensors[name] = ("BF16", bits)
            else:
                q, scale = quantize_int8_blocks(values, self.block_size)
                tensors[name] = ("I8", q)
                tensors[name + SCALE_SUFFIX] = ("F32", scale)
        metadata = {"format": FORMAT, "version": VERSION, "shard": str(self.shard), "codec": self.codec,
                    "block_size": str(self.block_size)}
        return encode_safetensors(tensors, metadata)


def quantize_int8_blocks(values: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-block int8: scale = max|x| / 127 per block, q = round(x / scale)."""
    n_blocks = -(-len(values) // block_size)
    padded = np.zeros(n_blocks * block_size, dtype=np.float32)
    padded[:len(values)] = values
    blocks = padded.reshape(n_blocks, block_size) if n_blocks else padded.reshape(0, block_size)
    scale = (np.abs(blocks).max(axis=1) / 127.0).astype(np.float32) if n_blocks else np.zeros(0, np.float32)
    with np.errstate(over="ignore"):  # a block max near float32's largest: 127 x its rounded-up scale is infinity
        over = ~np.isfinite(scale * np.float32(127))
    scale[over] = np.nextafter(scale[over], np.float32(0))
    safe = np.where(scale > 0, scale, 1.0).astype(np.float32)
    q = np.clip(np.rint(blocks / safe[:, None]), -127, 127).astype(np.int8).reshape(-1)[:len(values)]
    return q, scale


def _dequantize(q: np.ndarray, scale: np.ndarray, block_size: int) -> np.ndarray:
    """q x its block's scale, in float32. Memory and time follow len(q), never `block_size`: the block
    size comes from the untrusted metadata (up to 2**20), and repeating each scale that often made a
    few hundred bytes of shard allocate 4 MiB per tensor."""
    out = q.astype(np.float32)
    full = len(q) - len(q) % block_size
    with np.errstate(over="ignore"):  # an overflow is infinity, which the caller refuses
        out[:full].reshape(-1, block_size)[...] *= scale[:full // block_size, None]
        if full < len(q):
            out[full:] *= scale[-1]
    return out


def decode_gradient_shard(data: bytes, expected: Mapping[str, int], limits: PayloadLimits, shard: int,
                          codecs: tuple[str, ...] = tuple(CODECS)) -> GradientShard:
    """Parse and validate an untrusted grad-<shard>.safetensors against the mask lengths `expected`."""
    where = f"grad-{shard}"
    st = parse_safetensors(data, limits.max_grad_bytes, limits.max_safetensors_header_bytes, limits.max_tensors, where)
    meta = st.metadata
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise UnsupportedVersionError(f"format {meta.get('format')!r} version {meta.get('version')!r}; expected "
                                      f"{FORMAT} {VERSION}", field=f"{where}.__metadata__")
    if meta.get("shard") != str(shard):
        raise ContextMismatchError(f"file is for shard {meta.get('shard')!r}, expected {shard}",
                                   field=f"{where}.__metadata__.shard")
    codec = meta.get("codec")
    if codec not in CODECS or codec not in codecs:
        raise SchemaError(f"codec {str(codec)[:20]!r} not accepted; one of {list(codecs)}", field=f"{where}.__metadata__.codec")
    block_text = meta.get("block_size", "")
    # ASCII digits only, length bounded before int(): str.isdigit() also takes "²" (which int() refuses
    # with a bare ValueError) and "١" (which it reads as 1), and int() refuses over 4300 digits.
    if re.fullmatch(r"[0-9]{1,8}", block_text) is None or not 1 <= int(block_text) <= 1 << 20:
        raise SchemaError(f"block_size {block_text[:20]!r} is not a decimal integer in [1, 2**20]",
                          field=f"{where}.__metadata__.block_size")
    block_size = int(block_text)
    names = set(st.tensors)
    wanted = set(expected) | ({n + SCALE_SUFFIX for n in expected} if codec == "int8-block" else set())
    if names != wanted:
        missing, extra = sorted(wanted - names), sorted(names - wanted)
        raise SchemaError(f"tensor names differ from the manifest: missing {missing[:3]}, unexpected {extra[:3]}",
                          field=where)
    values: dict[str, np.ndarray] = {}
    for name, length in expected.items():
        array = st.array(name, CODECS[codec])
        if array.shape != (length,):
            raise ShapeError(f"{array.shape[0]} values, the mask has {length}", field=f"{where}.{name}")
        if codec == "int8-block":
            n_blocks = -(-length // block_size)
            scale = st.array(name + SCALE_SUFFIX, "F32")
            if scale.shape != (n_blocks,):
                raise ShapeError(f"{scale.shape[0]} scales, expected {n_blocks}", field=f"{where}.{name}{SCALE_SUFFIX}")
            if not np.isfinite(scale).all():
                raise NonFiniteError("NaN or infinity in scales", field=f"{where}.{name}{SCALE_SUFFIX}")
            if (scale < 0).any():
                raise ValueRangeError("negative scale", field=f"{where}.{name}{SCALE_SUFFIX}")
            if (array == -128).any():
                raise ValueRangeError("int8 value -128 (the codec is symmetric, [-127, 127])", field=f"{where}.{name}")
            decoded = _dequantize(array, scale, block_size)
        else:
            decoded = array.astype(np.float32)
        if not np.isfinite(decoded).all():
            raise NonFiniteError("NaN or infinity in the gradient", field=f"{where}.{name}")
        values[name] = decoded
    return GradientShard(shard, codec, values, block_size)
