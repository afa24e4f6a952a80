"""Canonical JSON: one byte string per value, identical on every machine and Python version.

Design decisions:
- Sorted keys, no whitespace (`,` and `:`), UTF-8 (not `\\u` escapes for non-ASCII), no floats at
  all: exact quantities (temperatures, probabilities) travel as integer milli-units, so no float
  formatting difference between platforms can change a digest. Allowed values: objects with
  string keys, arrays, strings, integers within +-2**64, booleans and null.
- Decoding is strict and bounded: input over the cap is refused before parsing, duplicate keys,
  floats, NaN/Infinity, deep nesting and strings UTF-8 cannot encode (a `\\ud800` escape decodes
  to an unpaired surrogate) are refused, and the input must re-encode to exactly the same bytes
  (`NonCanonicalError` otherwise), so a signed header has exactly one digest.
"""

from __future__ import annotations

import json
import re
from typing import Any

from krill.payload.errors import (
    MalformedPayloadError,
    NonCanonicalError,
    PayloadTooLargeError,
    SchemaError,
    refield,
)

MAX_DEPTH = 16
INT_BOUND = 1 << 64
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _check(value: Any, path: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise SchemaError(f"nested deeper than {MAX_DEPTH} levels", field=path)
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        _check_utf8(value, path)
        return
    if isinstance(value, int):
        if not -INT_BOUND < value < INT_BOUND:
            raise SchemaError("integer out of the range +-2**64", field=path)
        return
    if isinstance(value, float):
        raise SchemaError("floats are not allowed in canonical JSON; use integer milli-units", field=path)
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check(item, f"{path}[{i}]", depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise SchemaError(f"object key {key!r} is not a string", field=path)
            _check_utf8(key, path)
            _check(item, f"{path}.{key}" if path else key, depth + 1)
        return
    raise SchemaError(f"{type(value).__name__} cannot be encoded", field=path)


def _check_utf8(text: str, path: str) -> None:
    """Refuse a string UTF-8 cannot encode: JSON's `\\ud800` escapes decode to unpaired surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SchemaError(f"string holds an unpaired UTF-16 surrogate (U+{ord(text[exc.start]):04X}), "
                          "which is not valid UTF-8", field=path) from None


def canonical_json(value: Any) -> bytes:
    """The canonical encoding of `value`."""
    _check(value, "", 0)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def _no_float(text: str) -> Any:
    raise SchemaError(f"float {text[:20]} is not allowed; use integer milli-units")


def _no_constant(text: str) -> Any:
    raise SchemaError(f"{text} is not allowed")


def _pairs(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise SchemaError(f"duplicate key {key!r}")
        out[key] = value
    return out


_SPECIAL = re.compile(r'[\[\]{}"\\]')


def check_depth(text: str, max_depth: int, field: str) -> None:
    """Refuse nesting deeper than `max_depth` before any recursive parser sees the text.

    One left-to-right pass over the brackets, quotes and backslashes, tracking whether it is inside
    a string and which character a backslash escapes, so the cost is linear whatever the input (a
    regex that removed strings first restarted at every quote of an unterminated string: quadratic)
    and a deeply nested bomb costs neither recursion nor memory. Brackets inside a string do not
    count. A string that never closes (it reaches the end, or a backslash before a newline or the
    end) is not a string: its brackets count, and its quotes do not open strings.
    """
    depth = 0
    in_string = False
    pending = peak = 0  # bracket walk inside the open string: counted only if it never closes
    escaped = -1  # index of the character the last backslash in the string escapes
    for match in _SPECIAL.finditer(text):
        at, char = match.start(), match.group()
        if in_string:
            if char in "[{":
                pending += 1
                peak = max(peak, pending)
            elif char in "]}":
                pending -= 1
            elif at == escaped:
                pass
            elif char == '"':
                in_string = False
            elif at + 1 < len(text) and text[at + 1] != "\n":
                escaped = at + 1
            else:  # unterminated: everything since the opening quote is plain text after all
                in_string = False
                if depth + peak > max_depth:
                    raise MalformedPayloadError(f"nesting deeper than {max_depth}", field=field)
                depth += pending
        elif char == '"':
            in_string, pending, peak = True, 0, 0
        elif char in "[{":
            depth += 1
            if depth > max_depth:
                raise MalformedPayloadError(f"nesting deeper than {max_depth}", field=field)
        elif char in "]}":
            depth -= 1
    if in_string and depth + peak > max_depth:
        raise MalformedPayloadError(f"nesting deeper than {max_depth}", field=field)


def loads_bounded(text: str | bytes, max_depth: int, field: str) -> Any:
    """`json.loads` of untrusted text that is not canonical JSON (safetensors metadata, bundles):
    nesting past `max_depth` is refused before the parser sees it (its C code recurses once per
    level, and under web3's raised recursion limit a deep enough document overflows the C stack
    instead of raising), and every parse fault is a `MalformedPayloadError` naming `field`."""
    try:
        if isinstance(text, bytes | bytearray | memoryview):
            text = bytes(text).decode("utf-8", errors="strict")
        check_depth(text, max_depth, field)
        value = json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MalformedPayloadError(f"not valid JSON: {str(exc)[:120]}", field=field) from None
    if _SURROGATE_ESCAPE.search(text):  # only then can a string be one UTF-8 cannot encode
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise MalformedPayloadError("a string holds an unpaired UTF-16 surrogate, which is not valid UTF-8",
                                        field=field) from None
    return value


def parse_canonical(data: bytes, max_bytes: int, field: str = "json") -> Any:
    """Decode canonical JSON of at most `max_bytes`; refuse anything not in canonical form."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise MalformedPayloadError(f"expected bytes, got {type(data).__name__}", field=field)
    data = bytes(data)
    if len(data) > max_bytes:
        raise PayloadTooLargeError(f"{len(data)} bytes, over the cap of {max_bytes}", field=field)
    try:
        text = data.decode("utf-8", errors="strict")
        check_depth(text, MAX_DEPTH, field)
        value = json.loads(text, parse_float=_no_float, parse_constant=_no_constant, object_pairs_hook=_pairs)
    except SchemaError as exc:
        raise refield(exc, field) from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MalformedPayloadError(f"not valid JSON: {str(exc)[:120]}", field=field) from None
    try:
        again = canonical_json(value)
    except SchemaError as exc:
        raise refield(exc, field) from None
    if again != data:
        raise NonCanonicalError("not in canonical form (sorted keys, no spaces, UTF-8, no escapes "
                                "beyond what JSON requires)", field=field)
    return value
