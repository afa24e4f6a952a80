"""Robust aggregation of n submitted updates into one, with pluggable rules.

Design decisions:
- Rules are pydantic configs selected by `type` (a discriminated union), and the config goes
  into the aggregation record, so anyone can recompute a version with the same rule.
- Default rule (`clip-mix-trim`): clip every update's norm to `clip_multiplier` x the median
  norm (a scaled attacker can then do no more than a typical honest worker), nearest-neighbour
  mixing (replace each update by the mean of its n - f nearest updates, NNM, Allouah et al.
  2023: it shrinks the honest spread so the trimmed mean keeps more of the signal), then a
  coordinate-wise trimmed mean removing the fraction f/n of weight at each end.
- Weighted where the rule allows it (weights = trust x staleness weight): the weighted mean,
  the weighted median, and the trimmed mean, which trims weight *mass* (partial weights at
  the cut), so with equal weights it is the ordinary trimmed mean. Centred clipping weighs
  its steps. Nearest-neighbour mixing is unweighted (it only picks neighbours).
- Deterministic: float64 throughout, orders with ties broken by submission index, fixed
  iteration counts, sums over submissions accumulated row by row in index order (no BLAS
  reduction whose order could differ between machines). The result is returned as float32.
- Statistics name what was thrown away: per submission the fraction of its coordinate weight
  trimmed, how many were norm-clipped.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from krill.errors import KrillError


class AggregationError(KrillError, ValueError):
    """Updates or weights that cannot be aggregated."""


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MeanRule(_Rule):
    """Weighted mean (not robust: a single attacker moves it arbitrarily)."""

    type: Literal["mean"] = "mean"


class MedianRule(_Rule):
    """Coordinate-wise weighted median."""

    type: Literal["median"] = "median"


class TrimmedMeanRule(_Rule):
    """Coordinate-wise trimmed mean: drop `trim_fraction` of the weight at each end."""

    type: Literal["trimmed-mean"] = "trimmed-mean"
    trim_fraction: float = Field(0.2, ge=0.0, lt=0.5, description="Weight fraction trimmed at each end.")


class CenteredClipRule(_Rule):
    """Centred clipping (Karimireddy et al. 2021), started from the coordinate-wise median."""

    type: Literal["centered-clipping"] = "centered-clipping"
    tau: float | None = Field(None, gt=0.0, description="Clip radius; default: the median distance to the start.")
    iterations: int = Field(3, ge=1, le=100, description="Fixed number of clipping iterations.")


class ClipMixTrimRule(_Rule):
    """Norm clipping, then nearest-neighbour mixing, then coordinate-wise trimmed mean (the default)."""

    type: Literal["clip-mix-trim"] = "clip-mix-trim"
    trim_fraction: float = Field(0.2, ge=0.0, lt=0.5,
                                 description="Assumed Byzantine fraction: f = floor(trim_fraction * n).")
    clip_multiplier: float = Field(1.0, gt=0.0, le=100.0, description="Norms are clipped to this x the median norm.")


AggregationRule = Annotated[MeanRule | MedianRule | TrimmedMeanRule | CenteredClipRule | ClipMixTrimRule,
                            Field(discriminator="type")]


class AggregationStats(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rule: str
    n: int
    trimmed_fractions: list[float] = Field(description="Per submission: fraction of its weight trimmed, averaged over coordinates.")
    clipped: int = Field(0, description="Submissions whose norm was clipped.")
    norm: float = Field(description="L2 norm of the aggregate.")


def _check(updates: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if updates.ndim != 2 or updates.shape[0] < 1:
        raise AggregationError(f"updates: expected [n, d] with n >= 1, got {tuple(updates.shape)}")
    if weights.shape != (updates.shape[0],):
        raise AggregationError(f"weights: expected shape ({updates.shape[0]},), got {tuple(weights.shape)}")
    if not torch.isfinite(updates).all():
        raise AggregationError("updates: contain NaN or infinity")
    x = updates.to(torch.float64)
    w = weights.to(torch.float64)
    if not torch.isfinite(w).all() or (w < 0).any() or float(w.sum()) <= 0:
        raise AggregationError("weights: must be finite, non-negative, with a positive sum")
    return x, w


def weighted_trimmed_mean(x: torch.Tensor, w: torch.Tensor, trim: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Coordinate-wise trimmed mean of x [n, d] (float64); returns (mean [d], kept weight [n, d]).

    Per coordinate the submissions are ordered by value (ties by index); each keeps the part of
    its weight that lies between `trim` x total weight from the bottom and from the top. The
    weight below each submission comes from pairwise comparisons for n <= 16 (n(n-1)/2 vector
    comparisons beat a sort along a short axis) and from a stable sort above that; the mean is
    summed in submission order either way. When the weights take at most three distinct values
    (equal trust, a few staleness levels: the usual case), the comparisons only count, per
    weight value, the submissions below (one byte per coordinate), and the weight below is
    sum over values of count x value: a third of the float64 work.
    """
    n, d = x.shape
    wl = [float(v) for v in w]
    values = sorted(set(wl))
    if n <= _PAIRWISE_MAX and len(values) <= _COUNTED_MAX_VALUES:
        cls = [values.index(v) for v in wl]
        counts = torch.zeros(len(values), n, d, dtype=torch.uint8)
        before = torch.empty(d, dtype=torch.bool)
        for i in range(n):
            for j in range(i):
                torch.le(x[j], x[i], out=before)  # j sorts before i (ties: the lower index first)
                counts[cls[j], i].add_(before)
                counts[cls[i], j].add_(before.logical_not_())
        lower = counts[0].to(torch.float64).mul_(values[0])
        for c in range(1, len(values)):
            lower.add_(counts[c].to(torch.float64), alpha=values[c])
    elif n <= _PAIRWISE_MAX:
        # lower[j] starts at the weight of every later submission and loses those that sort after j.
        lower = torch.tensor([sum(wl[j + 1:]) for j in range(n)], dtype=torch.float64).unsqueeze(1).repeat(1, d)
        before = torch.empty(d, dtype=torch.bool)
        ones = torch.empty(d, dtype=torch.float64)  # `before` as 0/1 (adding a bool tensor converts slowly)
        for i in range(n):
            for j in range(i):
                torch.le(x[j], x[i], out=before)  # j sorts before i (ties: the lower index first)
                ones.copy_(before)
                lower[i].add_(ones, alpha=wl[j])
                lower[j].add_(ones, alpha=-wl[i])
    else:
        order = torch.sort(x, dim=0, stable=True).indices
        ws = w.index_select(0, order.reshape(-1)).view(n, d)
        lower = torch.zeros_like(ws).scatter(0, order, torch.cumsum(ws, dim=0) - ws)
    total = float(w.sum())
    cut = trim * total
    kept = torch.clamp(torch.minimum(lower + w.unsqueeze(1), torch.tensor(total - cut, dtype=torch.float64))
                       - torch.clamp(lower, min=cut), min=0.0)
    num = torch.zeros(d, dtype=torch.float64)
    den = torch.zeros(d, dtype=torch.float64)
    for i in range(n):  # row by row, in submission order
        num += kept[i] * x[i]
        den += kept[i]
    return num / den, kept


_PAIRWISE_MAX = 16
_COUNTED_MAX_VALUES = 3


def weighted_median(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise weighted median (lower median on exact half splits) of x [n, d]."""
    order = torch.sort(x, dim=0, stable=True).indices
    xs = torch.gather(x, 0, order)
    cum = torch.cumsum(w[order], dim=0)
    first = (cum >= 0.5 * w.sum()).to(torch.int64).argmax(dim=0)
    return xs.gather(0, first.unsqueeze(0)).squeeze(0)


def _ordered_sum(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """sum_i w_i x_i accumulated row by row in index order: the same bits on every machine."""
    out = torch.zeros(x.shape[1], dtype=torch.float64)
    for i in range(x.shape[0]):
        out += w[i] * x[i]
    return out


def clip_norms(x: torch.Tensor, multiplier: float) -> tuple[torch.Tensor, int]:
    norms = x.norm(dim=1)
    limit = multiplier * torch.sort(norms).values[(len(norms) - 1) // 2]
    scale = torch.where(norms > limit, limit / norms.clamp(min=1e-300), torch.ones_like(norms))
    return x * scale.unsqueeze(1), int((norms > limit).sum())


def nearest_neighbour_mixing(x: torch.Tensor, f: int) -> torch.Tensor:
    """Replace each row by the mean of its n - f nearest rows (itself included)."""
    n = x.shape[0]
    if f == 0 or n <= 1:
        return x
    dist = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist")
    nearest = torch.sort(dist, dim=1, stable=True).indices[:, :n - f]
    out = torch.zeros_like(x)
    for i in range(n):
        for j in sorted(nearest[i].tolist()):  # in index order, as `_ordered_sum`
            out[i] += x[j]
    return out / (n - f)


def centered_clipping(x: torch.Tensor, w: torch.Tensor, tau: float | None, iterations: int) -> torch.Tensor:
    v = weighted_median(x, w)
    if tau is None:
        tau = float(torch.sort((x - v).norm(dim=1)).values[(x.shape[0] - 1) // 2])
    for _ in range(iterations):
        diff = x - v
        norms = diff.norm(dim=1)
        scale = torch.clamp(tau / norms.clamp(min=1e-300), max=1.0) if tau > 0 else torch.zeros_like(norms)
        v = v + _ordered_sum(diff, w * scale) / w.sum()
    return v


def aggregate(updates: torch.Tensor, weights: torch.Tensor, rule: BaseModel) -> tuple[torch.Tensor, AggregationStats]:
    """Aggregate updates [n, d] with weights [n] by `rule`: (aggregate [d] float32, statistics)."""
    x, w = _check(updates, weights)
    n = x.shape[0]
    clipped = 0
    trimmed = torch.zeros(n, dtype=torch.float64)
    if isinstance(rule, MeanRule):
        out = _ordered_sum(x, w) / w.sum()
    elif isinstance(rule, MedianRule):
        out = weighted_median(x, w)
    elif isinstance(rule, TrimmedMeanRule):
        out, kept = weighted_trimmed_mean(x, w, rule.trim_fraction)
        trimmed = 1.0 - kept.mean(dim=1) / w.clamp(min=1e-300)
    elif isinstance(rule, CenteredClipRule):
        out = centered_clipping(x, w, rule.tau, rule.iterations)
    elif isinstance(rule, ClipMixTrimRule):
        f = int(rule.trim_fraction * n)
        xc, clipped = clip_norms(x, rule.clip_multiplier)
        mixed = nearest_neighbour_mixing(xc, f)
        out, kept = weighted_trimmed_mean(mixed, w, f / n)
        trimmed = 1.0 - kept.mean(dim=1) / w.clamp(min=1e-300)
    else:
        raise AggregationError(f"rule: unknown aggregation rule {type(rule).__name__}")
    trimmed = torch.where(w > 0, trimmed, torch.ones_like(trimmed))
    stats = AggregationStats(rule=rule.type, n=n, trimmed_fractions=[round(float(t), 6) for t in trimmed],
                             clipped=clipped, norm=float(out.norm()))
    return out.to(torch.float32), stats
