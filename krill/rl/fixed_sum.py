"""Sums over coordinates whose bits do not depend on the CPU: norms, distances and sums by a fixed tree.

Design decisions:
- torch's reductions (`sum`, `norm`, `cdist`) add in an order set by the kernel: the vector width
  (AVX2, AVX-512, NEON, the generic kernel) decides how many partial sums there are and how they are
  combined, so the same inputs give different last bits on different CPUs. The fold's norms feed the
  clip limit, the neighbour order, the optimizer's clip scale and the recorded statistics, and the
  audit compares those bits, so an auditor on another CPU failed an honest version.
- Here every reduction is built only from elementwise IEEE double operations (one subtraction, one
  multiplication, one addition per element and step, each rounded on its own; never a fused
  multiply-add) in an order fixed by the algorithm, so the result is the same on every CPU, thread
  count and torch kernel. The order, for a row of d values v_0 .. v_{d-1} in float64: with P the
  least power of two >= d and h = P / 2, first v_k = v_k + v_{k+h} for every k with k + h < d (the
  other v_k, k < h, are kept as they are: zero padding, without its turning -0.0 into +0.0); then
  while h > 1, h = h / 2 and v_k = v_k + v_{k+h} for every k < h. The sum is v_0 (0.0 for d = 0).
  A square root is `math.sqrt` of that float64 (correctly rounded everywhere).
- Values: a float32 input is widened to float64 exactly; a norm adds squares (a float32 value's
  square is exact in float64), a distance adds (a_k - b_k)^2 with the difference and the square each
  rounded in float64. `tree_reference` computes the same tree in Python floats: the tests compare
  the two bit for bit, which shows the bits are the algorithm's and not a kernel's.
- The tree is summed in place in a float64 buffer: a block of rows whose first-level values fit in
  `_BUFFER_BYTES`, or one row when a row alone is larger (d float64 values at most), so an [n, d]
  float64 copy of the input is never made on its behalf.
- A sum over several tensors (the optimizer's gradient norm, the update norm) sums each tensor by
  the tree and adds the per-tensor results left to right in the order given.
- Cost: a row's tree makes about four passes over memory where `norm`/`cdist` make one (row norms
  2x, distances 2x at n = 16, d = 1M with the 4 MB buffer; 6x with 32 MB), about 1.1x on a whole
  `aggregate` with the default rule (one thread: n = 16, d = 1M, 0.92 s against 1.01 s).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

import torch

Reductions = Literal["torch", "fixed-tree"]
"""How a fold reduces over coordinates: torch's kernels (the CPU sets the order) or this module's tree."""

_BUFFER_BYTES = 4 << 20  # a block of rows at a time (float64): 4 MB stays in cache, 3x faster than 32 MB


def _tree_rows(buf: torch.Tensor) -> torch.Tensor:
    """Halving tree along the last axis of buf [r, L] (L a power of two), in place; returns [r]."""
    width = buf.shape[1]
    while width > 1:
        width //= 2
        buf[:, :width].add_(buf[:, width:2 * width])
    return buf[:, 0]


def _reduce_rows(a: torch.Tensor, minus: torch.Tensor | None, square: bool) -> torch.Tensor:
    """Per row of a [m, d], the tree sum of a_k, a_k^2 or (a_k - minus_k)^2, as float64 [m].

    The first level of the tree (v_k + v_{k+h}) is taken while filling the buffer: the first h
    values go into it and the last d - h are added on, so the padding is never written.
    """
    m, d = a.shape
    out = torch.zeros(m, dtype=torch.float64)
    if d == 0 or m == 0:
        return out
    if minus is not None and (a.dtype != torch.float64 or minus.dtype != torch.float64):
        raise TypeError("distances are taken in float64: convert both operands first")
    half = 1 << ((d - 1).bit_length() - 1) if d > 1 else 1  # h = P / 2 (d = 1: the one value)
    rows = max(1, _BUFFER_BYTES // (8 * half))
    buf = torch.empty(min(rows, m), half, dtype=torch.float64)
    rest = torch.empty(min(rows, m), d - half, dtype=torch.float64) if d > half else None
    for lo in range(0, m, rows):
        hi = min(m, lo + rows)
        for target, cols in ((buf[:hi - lo], slice(0, half)), (None if rest is None else rest[:hi - lo], slice(half, d))):
            if target is None:
                continue
            if minus is not None:
                torch.sub(a[lo:hi, cols], minus[cols], out=target)
            else:
                target.copy_(a[lo:hi, cols])
            if square:
                target.mul_(target)
        if rest is not None:
            buf[:hi - lo, :d - half].add_(rest[:hi - lo])
        out[lo:hi] = _tree_rows(buf[:hi - lo])
    return out


def tree_sum(v: torch.Tensor) -> float:
    """The tree sum of the values of v (any shape, widened to float64)."""
    return float(_reduce_rows(v.reshape(1, -1), None, square=False)[0])


def row_sums(a: torch.Tensor) -> torch.Tensor:
    """The tree sum of each row of a [n, d], float64 [n]."""
    return _reduce_rows(a, None, square=False)


def row_norms(a: torch.Tensor) -> torch.Tensor:
    """The Euclidean norm of each row of a [n, d], float64 [n]: sqrt of the tree sum of its squares."""
    return torch.tensor([math.sqrt(s) for s in _reduce_rows(a, None, square=True).tolist()], dtype=torch.float64)


def sum_of_squares(tensors: Iterable[torch.Tensor]) -> float:
    """The squares of every tensor's values, each tensor summed by the tree, the results added in order."""
    total = 0.0
    for t in tensors:
        total += float(_reduce_rows(t.reshape(1, -1), None, square=True)[0])
    return total


def norm_of(tensors: Iterable[torch.Tensor]) -> float:
    """The Euclidean norm of several tensors together: sqrt of `sum_of_squares`."""
    return math.sqrt(sum_of_squares(tensors))


def pairwise_distances(x: torch.Tensor) -> torch.Tensor:
    """Euclidean distances between the rows of x [n, d] (float64), [n, n] float64.

    Each pair is computed once, as (x_j - x_i) for j > i, and mirrored: (a - b)^2 and (b - a)^2 are
    the same double, so the matrix is symmetric bit for bit.
    """
    n = x.shape[0]
    dist = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n - 1):
        sums = _reduce_rows(x[i + 1:], x[i], square=True).tolist()
        row = torch.tensor([math.sqrt(s) for s in sums], dtype=torch.float64)
        dist[i, i + 1:] = row
        dist[i + 1:, i] = row
    return dist


def tree_reference(values: list[float]) -> float:
    """The tree of this module in Python floats (for tests): the first level adds the last d - h values
    onto the first ones, then the halving tree."""
    v = [float(x) for x in values]
    if len(v) <= 1:
        return v[0] if v else 0.0
    width = 1 << ((len(v) - 1).bit_length() - 1)  # h = P / 2
    v = [v[k] + v[k + width] if k + width < len(v) else v[k] for k in range(width)]
    while width > 1:
        width //= 2
        v = [v[k] + v[k + width] for k in range(width)]
    return v[0]
