"""Charts as inline SVG drawn on the server: no script, no CDN, no network, nothing to load.

Design decisions:
- Pages must work offline and under a Content-Security-Policy that allows no script, so charts
  are SVG markup generated here and inlined in the page. Colours are presentation attributes
  (`stroke=`, `fill=`), which a CSP does not block, unlike `style=` attributes.
- Every text that goes into the markup is escaped (`markupsafe.escape`), numbers are formatted by
  us, and the result is `Markup` so the template engine does not escape it twice.
- Missing points (a version without an eval, a NaN reward) are left out, never drawn as zero:
  the line joins the versions that have a figure, each marked with a dot while there are few.
- Axis ticks and positions are total over finite figures: `nice_ticks` gives at least two finite,
  increasing ticks covering the range in at most count + 3 steps (a step is never below the values'
  float spacing, spans are taken in halves so none overflows), so a flat series at 1e16 or a reward
  of -1e308 draws a chart instead of hanging or failing the overview.
- Each chart has a `<title>` and an `aria-label`, and the page shows the same figures as a table
  or in the JSON API, so nothing is only in a picture.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

from markupsafe import Markup, escape

WIDTH, HEIGHT = 640, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 28, 34
PALETTE = ("#1f6feb", "#d1242f", "#1a7f37", "#9a6700")
_FLOAT_MAX = sys.float_info.max


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About `count` round tick values covering [lo, hi]: at least two, strictly increasing and finite,
    for any finite input (a span wider than the largest float, a range narrower than its values' float
    spacing, subnormal values); non-finite input gives [0, 1]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    lo, hi = float(lo), float(hi)
    if hi <= lo:
        width = abs(lo) or 1.0
        lo, hi = (lo, lo + width) if math.isfinite(lo + width) else (lo - width, lo)
    n = max(1, count)
    # Halves: hi - lo itself overflows for a span wider than the largest float. A step below the values'
    # float spacing would leave `start + i * step` where it was: the step is at least 4 ulps.
    raw = min((hi / 2 - lo / 2) / n * 2, _FLOAT_MAX)
    raw = max(raw, 4 * math.ulp(max(abs(lo), abs(hi))))
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = next((c for m in (1, 2, 2.5, 5, 10) if math.isfinite(c := m * magnitude) and c >= raw), raw)
    digits = 12 - math.floor(math.log10(step))  # round away float noise (0.6000000000000001), 12 digits
    start = math.floor(lo / step) * step
    if start > lo:  # lo / step underflowed to -0.0
        start -= step
    start = max(start, -_FLOAT_MAX)
    ticks: list[float] = []
    for i in range(n + 3):  # step >= (hi - lo) / n and start > lo - step: n + 2 ticks reach hi
        exact = start + i * step
        if not math.isfinite(exact):  # i * step alone passed the largest float
            exact = min((start / 2 + i * (step / 2)) * 2, _FLOAT_MAX)
        tick = _rounded(exact, digits)
        if (not ticks and tick > lo) or (exact >= hi and tick < hi):
            tick = exact  # rounding must not uncover an end
        if not ticks or tick > ticks[-1]:
            ticks.append(tick)
        if exact >= hi:
            break
    return ticks


def _rounded(value: float, digits: int) -> float:
    try:
        return round(value, digits)
    except OverflowError:  # rounded up past the largest float
        return value


def _fraction(value: float, lo: float, hi: float) -> float:
    """Where `value` lies between `lo` and `hi` (0 at lo, 1 at hi), in halves so that no difference of
    finite values overflows; 0 when the range is empty."""
    span = hi / 2 - lo / 2
    return (value / 2 - lo / 2) / span if span > 0 else 0.0


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 10_000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def _frame(title: str, x_label: str, xs: tuple[float, float], ys: list[float], body: list[str],
           legend: list[tuple[str, str]]) -> Markup:
    x0, x1 = xs
    y0, y1 = ys[0], ys[-1]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" '
           f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(title)}">',
           f"<title>{escape(title)}</title>",
           f'<text x="{LEFT}" y="16" font-size="13" font-weight="600" fill="#24292f">{escape(title)}</text>']
    for tick in ys:
        y = TOP + plot_h - _fraction(tick, y0, y1) * plot_h
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#d0d7de" '
                   f'stroke-width="1"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end" fill="#57606a">'
                   f"{escape(_fmt(tick))}</text>")
    for tick in nice_ticks(x0, x1, 6):
        if x0 <= tick <= x1 and float(tick).is_integer():
            x = LEFT + _fraction(tick, x0, x1) * plot_w
            out.append(f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 15}" font-size="11" text-anchor="middle" '
                       f'fill="#57606a">{escape(_fmt(tick))}</text>')
    out.append(f'<text x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 4}" font-size="11" text-anchor="middle" '
               f'fill="#57606a">{escape(x_label)}</text>')
    out.extend(body)
    for i, (name, colour) in enumerate(legend):
        x = WIDTH - RIGHT - 130 * (len(legend) - i)
        out.append(f'<rect x="{x}" y="7" width="10" height="10" fill="{colour}"/>'
                   f'<text x="{x + 14}" y="16" font-size="11" fill="#24292f">{escape(name)}</text>')
    out.append("</svg>")
    return Markup("".join(out))


def _empty(title: str) -> Markup:
    return Markup(f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} 60" width="{WIDTH}" '
                  f'height="60" role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>'
                  f'<text x="{LEFT}" y="16" font-size="13" font-weight="600" fill="#24292f">{escape(title)}</text>'
                  f'<text x="{LEFT}" y="42" font-size="12" fill="#57606a">no data yet</text></svg>')


def line_chart(title: str, series: dict[str, Sequence[tuple[float, float | None]]], x_label: str = "version",
               y_range: tuple[float, float] | None = None) -> Markup:
    """Lines over x through the points that have a finite y."""
    points = [(x, y) for pts in series.values() for x, y in pts if y is not None and math.isfinite(y)]
    if not points:
        return _empty(title)
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    lo, hi = y_range if y_range else (min(p[1] for p in points), max(p[1] for p in points))
    ys = nice_ticks(min(lo, 0.0) if lo >= 0 and y_range is None else lo, hi)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    body, legend = [], []
    for i, (name, pts) in enumerate(series.items()):
        colour = PALETTE[i % len(PALETTE)]
        legend.append((name, colour))
        drawn = [(LEFT + _fraction(x, x0, x1) * plot_w, TOP + plot_h - _fraction(y, ys[0], ys[-1]) * plot_h)
                 for x, y in pts if y is not None and math.isfinite(y)]
        if len(drawn) > 1:
            body.append(f'<polyline class="series" fill="none" stroke="{colour}" stroke-width="2" '
                        f'points="{" ".join(f"{px:.1f},{py:.1f}" for px, py in drawn)}"/>')
        if len(drawn) <= 60:
            body.extend(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.5" fill="{colour}"/>' for px, py in drawn)
    return _frame(title, x_label, (x0, x1), ys, body, legend if len(series) > 1 else [])


def stacked_bars(title: str, xs: Sequence[int], stacks: dict[str, Sequence[float | None]],
                 x_label: str = "version") -> Markup:
    """One bar per x, stacked from the given series (e.g. accepted and rejected contributions)."""
    if not xs:
        return _empty(title)
    totals = [sum((s[i] or 0) for s in stacks.values()) for i in range(len(xs))]
    ys = nice_ticks(0.0, max(totals) or 1.0)
    x0, x1 = min(xs) - 0.5, max(xs) + 0.5
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    bar_w = max(1.0, plot_w / (x1 - x0) * 0.8)
    body, legend = [], []
    base = [0.0] * len(xs)
    for k, (name, values) in enumerate(stacks.items()):
        colour = PALETTE[k % len(PALETTE)]
        legend.append((name, colour))
        for i, x in enumerate(xs):
            value = values[i] or 0
            if value <= 0:
                continue
            h = value / ys[-1] * plot_h
            y = TOP + plot_h - (base[i] / ys[-1] * plot_h) - h
            px = LEFT + (x - x0) / (x1 - x0) * plot_w - bar_w / 2
            body.append(f'<rect class="bar" x="{px:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                        f'fill="{colour}"><title>{escape(name)} at {x}: {escape(_fmt(value))}</title></rect>')
            base[i] += value
    return _frame(title, x_label, (x0, x1), ys, body, legend)


def overview_charts(series: list[dict]) -> dict[str, Markup]:
    """The overview's charts from `overview.series` points."""
    def line(key):
        return [(p["version"], p[key]) for p in series]

    metric_points = [p for p in series if p["accepted"] is not None]
    return {
        "accuracy": line_chart("Eval accuracy", {"accuracy": line("accuracy")}, y_range=(0.0, 1.0)),
        "reward": line_chart("Mean reward", {"mean reward": line("mean_reward")}),
        "contributions": stacked_bars("Contributions per version", [p["version"] for p in metric_points],
                                      {"accepted": [p["accepted"] for p in metric_points],
                                       "rejected": [p["rejected"] for p in metric_points]}),
        "throughput": line_chart("Throughput (sampled tokens / s)", {"tokens/s": line("tokens_per_s")}),
    }
