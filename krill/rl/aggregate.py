"""Robust aggregation of n submitted updates into one, with pluggable rules.

Design decisions:
- Rules are pydantic configs selected by `type` (a discriminated union), and the config goes
  into the aggregation record, so anyone can recompute a version with the same rule.
- Default rule (`clip-mix-trim`): clip every update's norm to `clip_multiplier` x the median
  non-zero norm (a scaled attacker can then do no more than a typical honest worker; `clip_basis`
  names the median used, and the plain median of specs published before it stays theirs), nearest-neighbour
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
- Reductions over coordinates (norms, distances) and the sum of the weights follow the rule's
  `reductions`: a new run's `fixed-tree` (`krill.rl.fixed_sum`: a fixed tree of elementwise
  operations, the same bits on every CPU) or `torch`'s kernels, whose order depends on the CPU's
  vector width (runs published before the option, left out of the encoding, so they recompute as
  they were folded, on a CPU like theirs). The fold (`krill.protocol.step`) reads the same field for
  the optimizer's gradient norm and the update norm.
- Weights must be finite with a positive finite sum, and the aggregate must come out finite (weights
  near float64's range made the weighted sums overflow: [1e308, 1e308] gave NaN), else `AggregationError`.
- Statistics name what was thrown away: per submission the fraction of its coordinate weight
  trimmed, how many were norm-clipped.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_serializer

from krill.errors import KrillError
from krill.rl import fixed_sum
from krill.rl.fixed_sum import Reductions


class AggregationError(KrillError, ValueError):
    """Updates or weights that cannot be aggregated."""


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    reductions: Reductions = Field(
        "torch", description="How the fold sums over coordinates (norms, distances, the weights' sum, the optimizer's "
                             "gradient norm, the update norm): `fixed-tree` (`krill.rl.fixed_sum`, the same bits on "
                             "every CPU; every new run's: `default_rule`, `rule_over_run_default`) or `torch`'s kernels, "
                             "whose order depends on the CPU (the class default, left out of the encoding so specs "
                             "published before the option keep their bytes and their meaning).")

    # Fields left out of the encoding at these values: what specs published before each option meant.
    _OMITTED_AT: ClassVar[dict[str, object]] = {"reductions": "torch"}

    @model_serializer(mode="wrap")
    def _omit_earlier_meanings(self, handler):
        """Options added after runs were published are left out of the encoding at the value those runs
        meant, so their specs and records keep their bytes, their run id and their meaning."""
        data = handler(self)
        for name, before in self._OMITTED_AT.items():
            if getattr(self, name) == before:
                data.pop(name, None)
        if "reductions" in data:  # after the rule's own fields, where a reader looks last
            data["reductions"] = data.pop("reductions")
        return data

    @property
    def fixed(self) -> bool:
        """Whether the fold reduces by `krill.rl.fixed_sum`'s tree."""
        return self.reductions == "fixed-tree"


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
    clip_multiplier: float = Field(1.0, gt=0.0, le=100.0,
                                   description="Norms are clipped to this x the median of the non-zero norms.")
    clip_basis: Literal["median", "nonzero-median"] = Field(
        "median", description="What the clip limit is a multiple of: the lower median of all norms (the class "
                              "default, left out of the encoding so earlier specs keep their bytes) or of the "
                              "non-zero ones (every new run's: `default_rule`).")

    # The plain median (the only basis before the option existed) is left out too.
    _OMITTED_AT: ClassVar[dict[str, object]] = {"reductions": "torch", "clip_basis": "median"}


def default_rule() -> ClipMixTrimRule:
    """A new run's rule: clip-mix-trim clipping to the median of the non-zero norms (with all norms, half
    the submissions being zero, as groups that all scored alike give, set the limit to 0), reducing by
    the fixed tree (the same bits on every CPU)."""
    return ClipMixTrimRule(clip_basis="nonzero-median", reductions="fixed-tree")


def rule_over_run_default(table):
    """A rule table as a new run reads it: a clip-mix-trim table that does not name `clip_basis`, and any
    table that does not name `reductions`, get the run default's (`default_rule`), as partial compression
    and optimizer tables do (`krill.rl.run_defaults`). Published specs are decoded without this (they
    name what they used)."""
    if not isinstance(table, dict):
        return table
    if table.get("type", "clip-mix-trim") == "clip-mix-trim" and "clip_basis" not in table:
        table = {"type": "clip-mix-trim", **table, "clip_basis": default_rule().clip_basis}
    if "reductions" not in table:
        table = {**table, "reductions": default_rule().reductions}
    return table


AggregationRule = Annotated[MeanRule | MedianRule | TrimmedMeanRule | CenteredClipRule | ClipMixTrimRule,
                            Field(discriminator="type")]


class AggregationStats(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rule: str
    n: int
    trimmed_fractions: list[float] = Field(description="Per submission: fraction of its weight trimmed, averaged over coordinates.")
    clipped: int = Field(0, description="Submissions whose norm was clipped.")
    norm: float = Field(description="L2 norm of the aggregate.")


def _all_finite(x: torch.Tensor) -> bool:
    """No NaN or infinity in x: its least and greatest values (NaN propagates into both) are finite.

    One pass without a mask the size of x: 0.2 ms instead of 2.7 ms for `isfinite().all()` on
    8 x 132k float32.
    """
    return x.numel() == 0 or bool(torch.isfinite(torch.stack(torch.aminmax(x))).all())


def _check(updates: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if updates.ndim != 2 or updates.shape[0] < 1:
        raise AggregationError(f"updates: expected [n, d] with n >= 1, got {tuple(updates.shape)}")
    if weights.shape != (updates.shape[0],):
        raise AggregationError(f"weights: expected shape ({updates.shape[0]},), got {tuple(weights.shape)}")
    if not _all_finite(updates):
        raise AggregationError("updates: contain NaN or infinity")
    x = updates.to(torch.float64)
    w = weights.to(torch.float64)
    if not torch.isfinite(w).all() or (w < 0).any() or not 0.0 < float(w.sum()) < math.inf:
        raise AggregationError("weights: must be finite, non-negative, with a positive finite sum")
    return x, w


def weighted_trimmed_mean(x: torch.Tensor, w: torch.Tensor, trim: float,
                          total: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Coordinate-wise trimmed mean of x [n, d] (float64); returns (mean [d], kept weight [n, d]).

    Per coordinate the submissions are ordered by value (ties by index); each keeps the part of
    its weight that lies between `trim` x total weight from the bottom and from the top. The
    weight below each submission comes from pairwise comparisons for n <= 16 (n(n-1)/2 vector
    comparisons beat a sort along a short axis) and from a stable sort above that; the mean is
    summed in submission order either way. Up to 8 submissions, the comparisons record which
    others sort below (one byte per coordinate) and the kept weight is looked up per subset
    (`_subset_kept`); up to 16 with at most three distinct weights (equal trust, a few staleness
    levels), they count the submissions below per weight value and look up per count
    (`_counted_kept`). Both tables are computed in Python floats. `total`: the weights' sum
    (default: torch's).
    """
    n = x.shape[0]
    wl = [float(v) for v in w]
    values = sorted(set(wl))
    total = float(w.sum()) if total is None else total
    cut = trim * total
    if n <= _SUBSET_MAX:
        kept = _subset_kept(x, wl, cut, total - cut)
    elif n <= _PAIRWISE_MAX and len(values) <= _COUNTED_MAX_VALUES:
        kept = _counted_kept(x, wl, values, cut, total - cut)
    elif n <= _PAIRWISE_MAX:
        kept = _pairwise_kept(x, w, cut, total - cut)
    else:
        kept = _sorted_kept(x, w, cut, total - cut)
    return _kept_mean(x, kept), kept


def _pairwise_kept(x: torch.Tensor, w: torch.Tensor, cut: float, top: float) -> torch.Tensor:
    """Kept weight [n, d] for n <= 16 submissions with any weights, from n(n-1)/2 vector comparisons."""
    n, d = x.shape
    wl = [float(v) for v in w]
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
    return _kept_weight(lower, w.unsqueeze(1), cut, top)


def _kept_weight(lower: torch.Tensor, weight: torch.Tensor, cut: float, top: float) -> torch.Tensor:
    """The part of each weight that lies between `cut` and `top`, given the weight `lower` below it:
    min(lower + weight, top) - max(lower, cut), at least 0 (`lower` is clamped in place)."""
    return (lower + weight).clamp_(max=top).sub_(lower.clamp_(min=cut)).clamp_(min=0.0)


def _by_coordinate(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [n, d] as [d, n] (each coordinate's n values contiguous) and their stable ascending order.

    Sorting the short contiguous rows of the transposed copy is 1.4-1.6x faster than sorting x along
    its first axis (one thread, n = 8-64, d = 65k-1M), and it gives the same indices."""
    xt = x.T.contiguous()
    return xt, torch.sort(xt, dim=1, stable=True).indices


def _sorted_kept(x: torch.Tensor, w: torch.Tensor, cut: float, top: float) -> torch.Tensor:
    """Kept weight [n, d] for any n and weights, from each coordinate's stable sort.

    The weight below each sorted position is the running sum of the weights before it (one
    float64 addition after another, in sorted order); the kept weight is computed at the sorted
    position and scattered back to its submission.
    """
    order = _by_coordinate(x)[1]
    ws = w[order]
    lower = torch.cumsum(ws, dim=1).sub_(ws)
    kept = _kept_weight(lower, ws, cut, top)
    return torch.empty_like(kept).scatter_(1, order, kept).T.contiguous()


def _kept_mean(x: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """sum_i kept_i x_i / sum_i kept_i per coordinate, summed row by row in submission order."""
    num = torch.zeros(x.shape[1], dtype=torch.float64)
    den = torch.zeros(x.shape[1], dtype=torch.float64)
    for i in range(x.shape[0]):
        num += kept[i] * x[i]
        den += kept[i]
    return num / den


def _kept_table(lower: list[float], w: float, cut: float, top: float) -> torch.Tensor:
    """Kept weight of a submission of weight `w` for each possible weight below it (Python floats)."""
    kept = [min(b + w, top) - max(b, cut) for b in lower]
    return torch.tensor([k if k > 0.0 else 0.0 for k in kept], dtype=torch.float64)


def _below_keys(x: torch.Tensor, place: Callable[[int, int], int]) -> torch.Tensor:
    """Per submission i and coordinate, the sum of `place(i, j)` over the submissions j sorting below i
    (ties: the lower index first), in one byte: the key `_subset_kept` and `_counted_kept` look up."""
    n, d = x.shape
    key = torch.zeros(n, d, dtype=torch.uint8)
    before = torch.empty(d, dtype=torch.bool)
    for i in range(n):
        for j in range(i):
            torch.le(x[j], x[i], out=before)  # j sorts before i
            key[i].add_(before, alpha=place(i, j))
            key[j].add_(before.logical_not_(), alpha=place(j, i))
    return key


def _subset_kept(x: torch.Tensor, wl: list[float], cut: float, top: float) -> torch.Tensor:
    """Kept weight [n, d] for n <= 8 submissions with any weights.

    Per coordinate, which of the other n - 1 submissions sort below submission i is one byte (bit
    b: the b-th other submission, in index order). The weight below for each of the 2^(n-1)
    subsets is their weights summed in index order in Python floats, and the kept weight is looked
    up from it: one small table per submission instead of float64 work per coordinate.
    """
    n, d = x.shape
    key = _below_keys(x, lambda i, j: 1 << (j if j < i else j - 1))  # bit of j among i's others
    kept = torch.empty(n, d, dtype=torch.float64)
    for i in range(n):
        others = wl[:i] + wl[i + 1:]
        lower = [0.0] * (1 << (n - 1))
        for mask in range(1, len(lower)):
            top_bit = mask.bit_length() - 1  # the subset's highest index is added last
            rest = mask & ~(1 << top_bit)
            lower[mask] = lower[rest] + others[top_bit] if rest else others[top_bit]
        torch.index_select(_kept_table(lower, wl[i], cut, top), 0, key[i].to(torch.int32), out=kept[i])
    return kept


def _counted_kept(x: torch.Tensor, wl: list[float], values: list[float], cut: float, top: float) -> torch.Tensor:
    """Kept weight [n, d] when the weights take at most three distinct `values` (n <= 16).

    The weight below submission i at a coordinate is fixed by how many submissions of each weight
    value sort below it. The pairwise comparisons count those into one byte per coordinate (a
    mixed-radix key: radix (m_c + 1) per value class c of m_c submissions, at most 6 x 6 x 7 keys
    for n = 16). Each key's weight below and kept weight are computed once, in Python floats: the
    weight below is ((c_0 v_0) + c_1 v_1) + c_2 v_2, every product and sum rounded on its own, so
    the bits do not depend on whether a torch build fuses multiply-adds (this one's kernels do).
    """
    n, d = x.shape
    cls = [values.index(v) for v in wl]
    sizes = [cls.count(c) for c in range(len(values))]
    radix = [1]
    for m in sizes[:-1]:
        radix.append(radix[-1] * (m + 1))
    keys = radix[-1] * (sizes[-1] + 1)
    key = _below_keys(x, lambda i, j: radix[cls[j]])
    lower = []
    for k in range(keys):
        below = 0.0
        for c, v in enumerate(values):
            count = (k // radix[c]) % (sizes[c] + 1)
            below = count * v if c == 0 else below + count * v
        lower.append(below)
    tables = [_kept_table(lower, v, cut, top) for v in values]
    kept = torch.empty(n, d, dtype=torch.float64)
    for i in range(n):
        torch.index_select(tables[cls[i]], 0, key[i].to(torch.int32), out=kept[i])
    return kept


_SUBSET_MAX = 8  # 2^7 subsets of the others: one byte
_PAIRWISE_MAX = 16
_COUNTED_MAX_VALUES = 3  # 16 submissions in 3 classes give at most 252 keys: one byte


def weighted_median(x: torch.Tensor, w: torch.Tensor, total: float | None = None) -> torch.Tensor:
    """Coordinate-wise weighted median (lower median on exact half splits) of x [n, d]; `total`: the
    weights' sum (default: torch's). The running sums are one addition after another (`cumsum`)."""
    xt, order = _by_coordinate(x)
    cum = torch.cumsum(w[order], dim=1)
    first = (cum >= 0.5 * (w.sum() if total is None else total)).to(torch.int64).argmax(dim=1, keepdim=True)
    return xt.gather(1, order.gather(1, first)).squeeze(1)


def _ordered_sum(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """sum_i w_i x_i accumulated row by row in index order: the same bits on every machine."""
    out = torch.zeros(x.shape[1], dtype=torch.float64)
    for i in range(x.shape[0]):
        out += w[i] * x[i]
    return out


def _norms(x: torch.Tensor, fixed: bool) -> torch.Tensor:
    """The rows' Euclidean norms [n]: by the fixed tree (`fixed`) or torch's kernel."""
    return fixed_sum.row_norms(x) if fixed else x.norm(dim=1)


def clip_norms(x: torch.Tensor, multiplier: float, nonzero: bool = True,
               fixed: bool = False) -> tuple[torch.Tensor, int]:
    """Scale every row whose norm exceeds `multiplier` x the lower median of the non-zero norms
    (`nonzero`, a new run's basis) or of all norms (runs published before the option). `fixed`: the
    norms by `krill.rl.fixed_sum` (a new run's), else by torch's kernel.

    Zero rows (a group whose samples all scored alike has no gradient) carry no direction and
    are left out of the median: with them in, half the submissions being zero set the limit to
    0 and scaled every other update away, so the version learned nothing from its signal.
    """
    norms = _norms(x, fixed)
    basis = torch.sort(norms[norms > 0] if nonzero else norms).values
    if len(basis) == 0:
        return x.clone(), 0
    limit = multiplier * basis[(len(basis) - 1) // 2]
    scale = torch.where(norms > limit, limit / norms.clamp(min=1e-300), torch.ones_like(norms))
    return x * scale.unsqueeze(1), int((norms > limit).sum())


def _distances(x: torch.Tensor) -> torch.Tensor:
    """Euclidean distances between the rows of x [n, d], [n, n]: `torch.cdist` without the matrix
    product, for each pair once (row i against the rows after it) and mirrored.

    A distance does not depend on the order of its pair, so the mirrored matrix has the bits of the
    full `cdist`, which computes every pair twice: half its time (n = 17-64, one thread).
    """
    n = x.shape[0]
    dist = torch.zeros(n, n, dtype=x.dtype)
    for i in range(n - 1):
        row = torch.cdist(x[i:i + 1], x[i + 1:], compute_mode="donot_use_mm_for_euclid_dist")[0]
        dist[i, i + 1:] = row
        dist[i + 1:, i] = row
    return dist


def nearest_neighbour_mixing(x: torch.Tensor, f: int, fixed: bool = False) -> torch.Tensor:
    """Replace each row by the mean of its n - f nearest rows (itself included); `fixed`: distances by
    `krill.rl.fixed_sum` (a new run's), else by `torch.cdist`."""
    n = x.shape[0]
    if f == 0 or n <= 1:
        return x
    dist = fixed_sum.pairwise_distances(x) if fixed else _distances(x)
    nearest = [tuple(sorted(row)) for row in torch.sort(dist, dim=1, stable=True).indices[:, :n - f].tolist()]
    # Each sum runs over its rows in index order, as `_ordered_sum`, in place in its output row;
    # rows with the same neighbours share one sum (a copy), which is most rows when f is small.
    # The sums go one block of columns at a time, so a row's block stays in cache while its
    # neighbours are added (each coordinate's additions keep their order: the same bits).
    first: dict[tuple[int, ...], int] = {}
    for i, rows in enumerate(nearest):
        first.setdefault(rows, i)
    out = torch.empty_like(x)
    for lo in range(0, x.shape[1], _MIX_BLOCK):
        block = x[:, lo:lo + _MIX_BLOCK]
        for rows, i in first.items():
            acc = out[i, lo:lo + _MIX_BLOCK].zero_()
            for j in rows:
                acc += block[j]
    for i, rows in enumerate(nearest):
        if first[rows] != i:
            out[i].copy_(out[first[rows]])
    return out.div_(n - f)


_MIX_BLOCK = 32768  # columns per block of the mixing sums: 256 KB of float64 (1.3-1.8x faster than whole rows)


def centered_clipping(x: torch.Tensor, w: torch.Tensor, tau: float | None, iterations: int,
                      fixed: bool = False) -> torch.Tensor:
    total = fixed_sum.tree_sum(w) if fixed else w.sum()
    v = weighted_median(x, w, total)
    if tau is None:
        tau = float(torch.sort(_norms(x - v, fixed)).values[(x.shape[0] - 1) // 2])
    for _ in range(iterations):
        diff = x - v
        norms = _norms(diff, fixed)
        scale = torch.clamp(tau / norms.clamp(min=1e-300), max=1.0) if tau > 0 else torch.zeros_like(norms)
        v = v + _ordered_sum(diff, w * scale) / total
    return v


def aggregate(updates: torch.Tensor, weights: torch.Tensor, rule: BaseModel) -> tuple[torch.Tensor, AggregationStats]:
    """Aggregate updates [n, d] with weights [n] by `rule`: (aggregate [d] float32, statistics)."""
    if not isinstance(rule, _Rule):
        raise AggregationError(f"rule: unknown aggregation rule {type(rule).__name__}")
    x, w = _check(updates, weights)
    n = x.shape[0]
    fixed = rule.fixed
    total = fixed_sum.tree_sum(w) if fixed else None  # None: torch's w.sum(), where each function takes it
    clipped = 0
    trimmed = torch.zeros(n, dtype=torch.float64)
    if isinstance(rule, MeanRule):
        out = _ordered_sum(x, w) / (w.sum() if total is None else total)
    elif isinstance(rule, MedianRule):
        out = weighted_median(x, w, total)
    elif isinstance(rule, TrimmedMeanRule):
        out, kept = weighted_trimmed_mean(x, w, rule.trim_fraction, total)
        trimmed = 1.0 - _row_means(kept, fixed) / w.clamp(min=1e-300)
    elif isinstance(rule, CenteredClipRule):
        out = centered_clipping(x, w, rule.tau, rule.iterations, fixed)
    elif isinstance(rule, ClipMixTrimRule):
        f = int(rule.trim_fraction * n)
        xc, clipped = clip_norms(x, rule.clip_multiplier, nonzero=rule.clip_basis == "nonzero-median", fixed=fixed)
        mixed = nearest_neighbour_mixing(xc, f, fixed)
        out, kept = weighted_trimmed_mean(mixed, w, f / n, total)
        trimmed = 1.0 - _row_means(kept, fixed) / w.clamp(min=1e-300)
    else:
        raise AggregationError(f"rule: unknown aggregation rule {type(rule).__name__}")
    result = out.to(torch.float32)
    if not _all_finite(result):  # finite updates times weights near float64's range can still overflow
        raise AggregationError("weights: so large that the weighted sums overflow; scale them down")
    trimmed = torch.where(w > 0, trimmed, torch.ones_like(trimmed))
    stats = AggregationStats(rule=rule.type, n=n, trimmed_fractions=[round(float(t), 6) for t in trimmed],
                             clipped=clipped, norm=fixed_sum.norm_of([out]) if fixed else float(out.norm()))
    return result, stats


def _row_means(kept: torch.Tensor, fixed: bool) -> torch.Tensor:
    """Each row's mean of kept [n, d]: the tree sum over d (`fixed`), or torch's mean."""
    return fixed_sum.row_sums(kept) / kept.shape[1] if fixed else kept.mean(dim=1)
