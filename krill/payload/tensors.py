"""A strict, bounded reader and a deterministic writer for the safetensors format.

Design decisions:
- Payload tensors travel as safetensors (8-byte little-endian header length, JSON header, packed
  data), which any safetensors library reads. We parse untrusted files ourselves instead of handing
  them to a library first: every length is checked against the caps before anything is allocated,
  the header must be plain JSON with no duplicates, every tensor's byte range must match its dtype
  and shape, and the ranges must tile the data section exactly (no gaps, overlaps or trailing
  bytes). Failures are `PayloadError`s naming the file and tensor. Arrays are zero-copy views.
- The writer is ours too, so that one set of tensors always gives the same bytes (tensors in name
  order, header JSON sorted and padded with spaces to 8 bytes as the format specifies) and so that
  bf16, which numpy lacks, can be written from its raw 16-bit patterns.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import numpy as np

from krill.payload.canonical import check_depth
from krill.payload.errors import (
    DtypeError,
    MalformedPayloadError,
    PayloadTooLargeError,
    SchemaError,
    ShapeError,
)

DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "I8": np.dtype("i1"), "U8": np.dtype("u1"), "I32": np.dtype("<i4"), "I64": np.dtype("<i8"),
}
MAX_NAME = 256
MAX_RANK = 8


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class SafetensorsFile:
    metadata: dict[str, str]
    tensors: dict[str, TensorInfo]
    buffer: memoryview
    field: str

    def array(self, name: str, dtype: str, rank: int | None = 1) -> np.ndarray:
        """Tensor `name` as a numpy array, checking its dtype and rank; BF16 comes back as float32."""
        info = self.tensors.get(name)
        if info is None:
            raise SchemaError("missing tensor", field=f"{self.field}.{name}")
        if info.dtype != dtype:
            raise DtypeError(f"dtype {info.dtype}, expected {dtype}", field=f"{self.field}.{name}")
        if rank is not None and len(info.shape) != rank:
            raise ShapeError(f"shape {list(info.shape)}, expected rank {rank}", field=f"{self.field}.{name}")
        raw = np.frombuffer(self.buffer, dtype=DTYPES[dtype], count=_numel(info.shape), offset=info.begin)
        if dtype == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        return raw.reshape(info.shape)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _pairs(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _reject_float(text: str):
    raise ValueError(f"unexpected number {text[:20]}")


def parse_safetensors(data: bytes, max_bytes: int, max_header_bytes: int, max_tensors: int,
                      field: str) -> SafetensorsFile:
    """Check the framing of an untrusted safetensors file; return its metadata and tensor index."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise MalformedPayloadError(f"expected bytes, got {type(data).__name__}", field=field)
    if len(data) > max_bytes:
        raise PayloadTooLargeError(f"{len(data)} bytes, over the cap of {max_bytes}", field=field)
    if len(data) < 8:
        raise MalformedPayloadError("shorter than the 8-byte header length", field=field)
    (header_len,) = struct.unpack_from("<Q", data, 0)
    if header_len > max_header_bytes:
        raise PayloadTooLargeError(f"header of {header_len} bytes, over the cap of {max_header_bytes}", field=field)
    if 8 + header_len > len(data):
        raise MalformedPayloadError("header length runs past the end of the file", field=field)
    try:
        text = bytes(data[8:8 + header_len]).decode("utf-8")
        check_depth(text, 4, field)  # {name: {"shape": [...]}}: three levels deep at most
        header = json.loads(text, object_pairs_hook=_pairs,
                            parse_float=_reject_float, parse_constant=_reject_float)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MalformedPayloadError(f"header is not valid JSON: {str(exc)[:120]}", field=field) from None
    if not isinstance(header, dict):
        raise MalformedPayloadError("header is not a JSON object", field=field)
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise SchemaError("__metadata__ must map strings to strings", field=field)
    if len(header) > max_tensors:
        raise PayloadTooLargeError(f"{len(header)} tensors, over the cap of {max_tensors}", field=field)
    buffer = memoryview(bytes(data))[8 + header_len:]
    tensors = {name: _tensor_info(name, entry, len(buffer), field) for name, entry in header.items()}
    position = 0
    for info in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if info.begin != position:
            raise MalformedPayloadError(f"tensor data is not contiguous at byte {position} ({info.name} starts at "
                                        f"{info.begin})", field=field)
        position = info.end
    if position != len(buffer):
        raise MalformedPayloadError(f"{len(buffer) - position} bytes after the last tensor", field=field)
    return SafetensorsFile(metadata, tensors, buffer, field)


def _tensor_info(name, entry, buffer_len: int, field: str) -> TensorInfo:
    where = f"{field}.{name}"
    if not name or len(name) > MAX_NAME:
        raise SchemaError(f"tensor name of length {len(name)} (1..{MAX_NAME} allowed)", field=field)
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise SchemaError("entry must have exactly dtype, shape and data_offsets", field=where)
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise DtypeError(f"unsupported dtype {str(dtype)[:16]!r}", field=where)
    if (not isinstance(shape, list) or len(shape) > MAX_RANK
            or not all(type(d) is int and 0 <= d < 1 << 40 for d in shape)):
        raise ShapeError(f"shape must be a list of at most {MAX_RANK} non-negative integers", field=where)
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(type(o) is int and 0 <= o <= buffer_len for o in offsets) or offsets[0] > offsets[1]):
        raise MalformedPayloadError("data_offsets must be [begin, end] within the data section", field=where)
    if _numel(tuple(shape)) * DTYPES[dtype].itemsize != offsets[1] - offsets[0]:
        raise ShapeError(f"shape {shape} of {dtype} needs {_numel(tuple(shape)) * DTYPES[dtype].itemsize} bytes, "
                         f"data_offsets give {offsets[1] - offsets[0]}", field=where)
    return TensorInfo(name, dtype, tuple(shape), offsets[0], offsets[1])


def encode_safetensors(tensors: dict[str, tuple[str, np.ndarray]], metadata: dict[str, str]) -> bytes:
    """Deterministic safetensors bytes from name -> (dtype, array); BF16 arrays hold raw uint16 bits."""
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    chunks = []
    position = 0
    for name in sorted(tensors):
        dtype, array = tensors[name]
        raw = np.ascontiguousarray(array, dtype=DTYPES[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(np.shape(array)), "data_offsets": [position, position + len(raw)]}
        chunks.append(raw)
        position += len(raw)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def float_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (round to nearest even), returned as uint16 bit patterns."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)
