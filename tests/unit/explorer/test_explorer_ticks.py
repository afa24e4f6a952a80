"""Chart ticks and positions are total: finite, increasing ticks for any finite range, in bounded time.

Before: `nice_ticks(1e16, 1e16 + 2)` never returned (a step below the float spacing of 1e16 left the
running value where it was), `nice_ticks(-1e308, 1e308)` raised OverflowError (the span overflowed),
and `nice_ticks(0, 1e-13)` rounded every tick to 0.0, so the chart divided by a zero tick range.
"""

from __future__ import annotations

import math
import signal
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from krill.explorer.charts import line_chart, nice_ticks, stacked_bars

MAX = sys.float_info.max
EXTREMES = [(1e16, 1e16 + 2), (-1e308, 1e308), (-MAX, MAX), (MAX, MAX), (-MAX, -MAX), (0.0, 1e-13),
            (0.0, 5e-324), (-5e-324, 5e-324), (1e300, 1e300 * (1 + 2**-52)), (2.0**63, 2.0**63 + 4096),
            (0.0, 1.0), (3.0, 3.0), (0.0, 0.0), (-1e-320, -1e-320), (5.0, 1.0)]


def _in_5s(fn, *args):
    """`fn(*args)`, failing with TimeoutError instead of hanging the suite when it does not return."""
    def expired(signum, frame):
        raise TimeoutError(f"{fn.__name__}{args!r} did not return in 5 s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(5)
    try:
        return fn(*args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _check(lo: float, hi: float, count: int) -> None:
    ticks = _in_5s(nice_ticks, lo, hi, count)
    assert len(ticks) >= 2 and all(math.isfinite(t) for t in ticks), (lo, hi, ticks)
    assert all(a < b for a, b in zip(ticks, ticks[1:], strict=False)), (lo, hi, ticks)
    assert len(ticks) <= max(1, count) + 3, (lo, hi, ticks)
    assert ticks[0] <= lo <= ticks[-1] and (hi <= lo or ticks[-1] >= hi), (lo, hi, ticks)


@pytest.mark.parametrize(("lo", "hi"), EXTREMES)
def test_extreme_ranges_give_finite_increasing_covering_ticks(lo, hi):
    for count in (1, 5, 6):
        _check(lo, hi, count)


@settings(max_examples=400, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False), st.floats(allow_nan=False, allow_infinity=False),
       st.integers(0, 12))
def test_any_finite_range_gives_finite_increasing_covering_ticks(lo, hi, count):
    _check(lo, hi, count)


def test_round_ranges_keep_round_ticks_and_non_finite_input_gives_two():
    assert _in_5s(nice_ticks, 0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(0.1, 0.3) == [0.1, 0.15, 0.2, 0.25, 0.3]
    assert nice_ticks(-1e308, 1e308) == [-1e308, -5e307, 0.0, 5e307, 1e308]
    assert nice_ticks(0, 1e-13) == [0.0, 2e-14, 4e-14, 6e-14, 8e-14, 1e-13]
    assert nice_ticks(float("nan"), 1.0) == nice_ticks(0.0, float("inf")) == [0.0, 1.0]


@pytest.mark.parametrize(("lo", "hi"), [(-1e308, 1e308), (1e16, 1e16 + 2), (0.0, 1e-13), (-MAX, MAX)])
def test_charts_of_extreme_values_draw_finite_coordinates(lo, hi):
    chart = str(_in_5s(line_chart, "reward", {"r": [(0, lo), (1, hi), (2, lo / 2 + hi / 2)]}))
    assert chart.count("<circle") == 3 and "nan" not in chart and "inf" not in chart
    bars = str(_in_5s(stacked_bars, "per version", [1], {"accepted": [abs(hi) or 1.0]}))
    assert 'class="bar"' in bars and "nan" not in bars and "inf" not in bars
