"""Template filters: how amounts, hashes, ratios and numbers are shown on the pages.

Design decisions:
- Amounts travel as decimal strings of base units (see `krill.explorer.overview`); pages show them
  as tokens with 18 decimals cut to four, exactly (integer arithmetic, no float rounding).
- Hashes and addresses are shortened for reading, with the full value kept in the `title`
  attribute and in every link, so nothing is lost by the shortening.
- Filters return plain strings; the template engine escapes them.
"""

from __future__ import annotations

import math
from typing import Any

TOKEN_DECIMALS = 18


def tokens(value: Any, places: int = 4) -> str:
    """'1234567000000000000000' -> '1,234.567' (trailing zeros dropped)."""
    if value is None or value == "":
        return "–"
    n = int(value)
    whole, frac = divmod(n, 10**TOKEN_DECIMALS)
    frac_text = f"{frac:0{TOKEN_DECIMALS}d}"[:places].rstrip("0")
    return f"{whole:,}" + (f".{frac_text}" if frac_text else "")


def short(value: Any, keep: int = 10) -> str:
    """A hash, CID or address shortened to its head and tail."""
    if value is None:
        return "–"
    text = str(value)
    return text if len(text) <= 2 * keep + 1 else f"{text[:keep]}…{text[-6:]}"


def num(value: Any, digits: int = 3) -> str:
    """A float to `digits` significant places; None and NaN as a dash."""
    if value is None:
        return "–"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "–"
        return f"{value:.{digits}g}" if abs(value) < 10_000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def pct(value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{100 * float(value):.1f}%"


def bps(value: Any) -> str:
    return "–" if value is None else f"{int(value) / 100:g}%"


def ppm(value: Any) -> str:
    return "–" if value is None else f"{int(value) / 10_000:g}%"


FILTERS = {"tokens": tokens, "short": short, "num": num, "pct": pct, "bps": bps, "ppm": ppm}
