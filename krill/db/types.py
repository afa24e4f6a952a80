"""Column types and value spellings shared by every Krill table.

Design decisions:
- Token amounts are uint256 and exceed 64 bits: `Uint` is NUMERIC(78, 0) on PostgreSQL
  (exact, summable in SQL) and decimal TEXT on SQLite, whose NUMERIC affinity would silently turn
  large integers into doubles. Python always sees `int`.
- One spelling per kind of value, so rows written by different processes join and compare:
  bytes32 values (run ids, digests, keys, randomness) are 64 lowercase hex characters without a
  prefix, as in signed headers; addresses are 0x + 40 lowercase hex; transaction hashes are
  0x + 64 lowercase hex, as block explorers print them. `hex32`, `address` and `tx_hash` turn any
  accepted input into that spelling or raise `DatabaseValueError` naming the field.
- Messages (fetch errors, rejection reasons, notes) quote untrusted input: a header's file name or a
  safetensors tensor name may hold NUL (JSON `\\u0000`), which PostgreSQL text cannot store, or a lone
  UTF-16 surrogate (`\\ud800`), which neither backend's driver can encode. Either failed the whole
  write transaction (the indexer's header batch, the coordinator's ingest pass) on every pass, so one
  hostile commit stopped the role. `Message` columns write such characters as their backslash escapes
  (`\\x00`, `\\ud800`) on every backend, so both backends hold the same rows.
"""

from __future__ import annotations

import re
from decimal import Decimal

from sqlalchemy import Numeric, String, Text
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

from krill.db.errors import DatabaseValueError

UINT256_MAX = 2**256 - 1
_HEX32 = re.compile(r"^(0x)?[0-9a-fA-F]{64}$")
_ADDRESS = re.compile(r"^(0x)?[0-9a-fA-F]{40}$")


class Uint(TypeDecorator):
    """An unsigned integer up to 2**256 - 1 (token amounts, uint64 nonces and seeds): NUMERIC(78, 0) on
    PostgreSQL, decimal text elsewhere."""

    impl = String(78)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(Numeric(78, 0, asdecimal=True))
        return dialect.type_descriptor(String(78))

    def process_bind_param(self, value, dialect: Dialect):
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= UINT256_MAX:
            raise DatabaseValueError(f"uint column: expected an integer in [0, 2**256), got {value!r}")
        return Decimal(value) if dialect.name == "postgresql" else str(value)

    def process_result_value(self, value, dialect: Dialect):
        return None if value is None else int(value)


class Message(TypeDecorator):
    """Free text that may quote untrusted input: NUL and lone surrogates are stored as backslash escapes."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value, dialect: Dialect):
        return None if value is None else storable_text(value)


def storable_text(value: str) -> str:
    """`value` with NUL written as `\\x00` and lone surrogates as `\\udXXX`: text every backend stores."""
    value = value.replace("\x00", "\\x00")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def hex32(value: bytes | str, field: str) -> str:
    """A bytes32 value as 64 lowercase hex characters (no prefix)."""
    if isinstance(value, bytes | bytearray):
        if len(value) != 32:
            raise DatabaseValueError(f"{field}: expected 32 bytes, got {len(value)}")
        return bytes(value).hex()
    if isinstance(value, str) and _HEX32.match(value):
        return value.removeprefix("0x").lower()
    raise DatabaseValueError(f"{field}: expected 32 bytes or 64 hex characters, got {value!r:.80}")


def address(value: str, field: str = "address") -> str:
    """An Ethereum address as 0x + 40 lowercase hex characters."""
    if isinstance(value, str) and _ADDRESS.match(value):
        return "0x" + value.removeprefix("0x").lower()
    raise DatabaseValueError(f"{field}: expected an address (40 hex characters), got {value!r:.80}")


def tx_hash(value: bytes | str, field: str = "tx_hash") -> str:
    """A transaction hash as 0x + 64 lowercase hex characters."""
    return "0x" + hex32(value, field)
