"""Pagination and request-parameter parsing shared by every list of the explorer.

Design decisions:
- Every list is paginated (`?page=&per_page=`): `per_page` defaults to the configured page size
  and is capped, so no request can ask the database for an unbounded result. A page past the end
  is an empty page, not an error (the total says where the end is).
- Parameters are parsed strictly and never reach SQL as text: a malformed value is a
  `BadRequest` (HTTP 400) naming the parameter; values become Python ints and fixed-format
  strings that SQLAlchemy binds as parameters.
- Totals come from `SELECT count(*)` over the same filtered statement, so page counts agree with
  the rows shown.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from krill.errors import KrillError

MAX_PARAM_CHARS = 200
_HEX32 = re.compile(r"^(0x)?[0-9a-fA-F]{64}$")
MAX_INDEX_INT = (1 << 63) - 1
_ADDRESS = re.compile(r"^(0x)?[0-9a-fA-F]{40}$")


class BadRequest(KrillError, ValueError):
    """A request parameter that cannot be used (HTTP 400)."""


class NotFound(KrillError, LookupError):
    """Nothing at this address (HTTP 404)."""


@dataclass(frozen=True)
class PageRequest:
    page: int
    per_page: int

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.per_page


@dataclass
class Page:
    """One page of a list: its items (JSON-ready dicts) and where it sits in the whole."""

    items: list[dict[str, Any]]
    page: int
    per_page: int
    total: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.per_page))

    def to_json(self) -> dict[str, Any]:
        return {"items": self.items, "page": self.page, "per_page": self.per_page, "total": self.total,
                "pages": self.pages}


def int_param(params: Mapping[str, str], name: str, default: int, lo: int, hi: int | None = None) -> int:
    """An integer query parameter in [lo, hi] (values above `hi` are capped to it; without `hi`, values
    past the index's signed 64-bit columns are refused rather than handed to the database)."""
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    if len(raw) > 20 or not re.fullmatch(r"[0-9]+", raw):
        raise BadRequest(f"parameter {name!r} must be a whole number, got {raw[:40]!r}")
    value = int(raw)
    if value < lo:
        raise BadRequest(f"parameter {name!r} must be at least {lo}, got {value}")
    if hi is None and value > MAX_INDEX_INT:
        raise BadRequest(f"parameter {name!r} must be at most {MAX_INDEX_INT} (the index's integer range), got {value}")
    return value if hi is None else min(value, hi)


def page_request(params: Mapping[str, str], default_size: int, max_size: int) -> PageRequest:
    return PageRequest(page=int_param(params, "page", 1, 1, 10**9),
                       per_page=int_param(params, "per_page", min(default_size, max_size), 1, max_size))


def choice_param(params: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str | None:
    """An optional parameter that must be one of `choices`."""
    raw = params.get(name)
    if raw is None or raw == "":
        return None
    if raw not in choices:
        raise BadRequest(f"parameter {name!r} must be one of {', '.join(choices)}, got {raw[:40]!r}")
    return raw


def hex32_value(raw: str, what: str) -> str:
    """A bytes32 value (run id, digest) in the index's spelling: 64 lowercase hex, no prefix."""
    if not isinstance(raw, str) or not _HEX32.fullmatch(raw):
        raise BadRequest(f"{what} must be 64 hexadecimal characters, got {str(raw)[:80]!r}")
    return raw.removeprefix("0x").lower()


def address_value(raw: str) -> str:
    """An address in the index's spelling: 0x + 40 lowercase hex."""
    if not isinstance(raw, str) or not _ADDRESS.fullmatch(raw):
        raise BadRequest(f"an address is 40 hexadecimal characters (0x...), got {str(raw)[:80]!r}")
    return "0x" + raw.removeprefix("0x").lower()


def paginate(session: Session, stmt: Select, request: PageRequest, row: Callable[[Any], dict[str, Any]],
             scalars: bool = True) -> Page:
    """Run `stmt` (already ordered) for one page; `row` turns each result into a JSON-ready dict."""
    total = session.scalar(select(func.count()).select_from(stmt.order_by(None).subquery())) or 0
    paged = stmt.limit(request.per_page).offset(request.offset)
    results = session.scalars(paged) if scalars else session.execute(paged)
    return Page([row(r) for r in results], request.page, request.per_page, int(total))
