"""The fixed-tree reductions (`krill.rl.fixed_sum`): their bits are the algorithm's, not a kernel's."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from krill.rl import fixed_sum
from krill.rl.aggregate import (
    CenteredClipRule,
    MeanRule,
    MedianRule,
    TrimmedMeanRule,
    aggregate,
    default_rule,
)
from krill.rl.fixed_sum import tree_reference


def _awkward(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """float32 rows mixing zeros, subnormals, large values and ordinary ones."""
    x = rng.standard_normal((n, d)) * 10.0 ** rng.integers(-6, 6, size=(n, d))
    kind = rng.integers(0, 8, size=(n, d))
    x[kind == 0] = 0.0
    x[kind == 1] = rng.standard_normal((int((kind == 1).sum()),)) * 1e-41  # float32 subnormals
    x[kind == 2] = rng.standard_normal((int((kind == 2).sum()),)) * 1e37  # near float32's largest
    return x.astype(np.float32)


SIZES = [0, 1, 2, 3, 5, 8, 13, 64, 100, 1000, 1025]


@pytest.mark.parametrize("d", SIZES)
def test_sums_and_norms_equal_the_tree_in_python_floats(d):
    rng = np.random.default_rng(d)
    x = _awkward(rng, 3, d)
    t = torch.from_numpy(x)
    rows = [[float(v) for v in row] for row in x]
    assert fixed_sum.row_sums(t).tolist() == [tree_reference(r) for r in rows]
    assert fixed_sum.row_norms(t).tolist() == [math.sqrt(tree_reference([v * v for v in r])) for r in rows]
    assert fixed_sum.tree_sum(t[0]) == tree_reference(rows[0])
    parts = [t[0], t[1, : d // 2].reshape(-1, 1), t[2]]  # any shapes, summed in the order given
    expect = 0.0
    for p in parts:
        expect += tree_reference([float(v) ** 2 for v in p.flatten()])
    assert fixed_sum.sum_of_squares(parts) == expect
    assert fixed_sum.norm_of(iter(parts)) == math.sqrt(expect)


@pytest.mark.parametrize("d", [1, 7, 1000, 1025])
def test_distances_equal_the_tree_in_python_floats_and_are_symmetric(d):
    x = torch.from_numpy(_awkward(np.random.default_rng(100 + d), 5, d)).double()
    x[3] = x[1]  # a zero distance
    rows = x.tolist()
    dist = fixed_sum.pairwise_distances(x)
    for i in range(5):
        for j in range(5):
            if i != j:
                a, b = rows[min(i, j)], rows[max(i, j)]
                assert dist[i, j].item() == math.sqrt(tree_reference([(q - p) * (q - p) for p, q in zip(a, b, strict=True)]))
    assert torch.equal(dist, dist.T) and dist[1, 3].item() == 0.0 and dist.diagonal().eq(0).all()


def test_blocks_of_rows_give_the_same_bits(monkeypatch):
    """Rows are summed a block at a time; the block size changes nothing (here 3 rows per block of 10)."""
    x = torch.from_numpy(_awkward(np.random.default_rng(7), 10, 1000)).double()
    whole = fixed_sum.row_norms(x), fixed_sum.pairwise_distances(x), fixed_sum.row_sums(x)
    monkeypatch.setattr(fixed_sum, "_BUFFER_BYTES", 3 * 512 * 8)
    blocks = fixed_sum.row_norms(x), fixed_sum.pairwise_distances(x), fixed_sum.row_sums(x)
    assert all(torch.equal(a, b) for a, b in zip(whole, blocks, strict=True))


def test_float64_sums_keep_subnormals_and_signed_zeros_as_the_tree_does():
    values = [5e-324, -5e-324, 1e-310, -0.0, 1e308, 1e308, -1e308]
    t = torch.tensor(values, dtype=torch.float64)
    assert fixed_sum.tree_sum(t) == tree_reference(values)
    assert math.copysign(1.0, fixed_sum.tree_sum(torch.tensor([-0.0, -0.0, -0.0], dtype=torch.float64))) == \
        math.copysign(1.0, tree_reference([-0.0, -0.0, -0.0]))


_DIGEST = """
import hashlib, sys, numpy as np, torch
from krill.rl import fixed_sum
from krill.rl.aggregate import aggregate, default_rule
from krill.rl.optimizer import AdamWConfig, ShardAdamW
rng = np.random.default_rng(5)
x = torch.from_numpy((rng.standard_normal((9, 40_003)) * np.logspace(-3, 1, 9)[:, None]).astype(np.float32))
w = torch.from_numpy(rng.random(9) + 0.5)
out = []
for threads in (1, 2):
    torch.set_num_threads(threads)
    agg, stats = aggregate(x, w, default_rule())
    grads = {"a": x[0].clone(), "b": x[1, :999].clone()}
    norm = ShardAdamW({k: torch.zeros_like(v) for k, v in grads.items()}, AdamWConfig(), "fixed-tree").step(grads)
    parts = [fixed_sum.row_norms(x.double()), fixed_sum.pairwise_distances(x.double()), agg]
    out.append(hashlib.sha256(b"".join(p.numpy().tobytes() for p in parts)).hexdigest()
               + repr((stats.norm, stats.trimmed_fractions, fixed_sum.tree_sum(w), norm)))
print(out[0] if out[0] == out[1] else "THREADS DIFFER")
"""


def test_the_bits_do_not_depend_on_the_kernel_or_the_thread_count():
    """The generic kernel (ATEN_CPU_CAPABILITY=default) and this machine's, 1 and 2 threads, give one result."""
    results = []
    for capability in ("default", None):
        env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
        if capability:
            env["ATEN_CPU_CAPABILITY"] = capability
        run = subprocess.run([sys.executable, "-c", _DIGEST], env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        results.append(run.stdout.strip())
    assert "THREADS DIFFER" not in results and results[0] == results[1]


def test_the_fixed_fold_agrees_with_torchs_to_rounding():
    """Same arithmetic, another order: the aggregate and the statistics agree to rounding (on values
    without near-ties, whose order a last bit could flip)."""
    rng = np.random.default_rng(11)
    x = torch.from_numpy((rng.standard_normal((9, 3001)) * np.logspace(-2, 1, 9)[:, None]).astype(np.float32))
    w = torch.tensor([1.0, 0.5, 2.0, 1.0, 1.0, 0.25, 1.0, 3.0, 1.0], dtype=torch.float64)
    for rule in (default_rule(), MeanRule(), MedianRule(), TrimmedMeanRule(), CenteredClipRule()):
        new, s_new = aggregate(x, w, rule.model_copy(update={"reductions": "fixed-tree"}))
        old, s_old = aggregate(x, w, rule.model_copy(update={"reductions": "torch"}))
        torch.testing.assert_close(new, old, rtol=1e-5, atol=1e-6)
        assert s_new.clipped == s_old.clipped and math.isclose(s_new.norm, s_old.norm, rel_tol=1e-9)
        assert s_new.trimmed_fractions == pytest.approx(s_old.trimmed_fractions, abs=1e-6)


def test_the_optimizers_gradient_norm_is_the_trees_over_sorted_names():
    from krill.rl.optimizer import AdamWConfig, ShardAdamW

    x = _awkward(np.random.default_rng(3), 2, 1001)
    grads = {"b": torch.from_numpy(x[0]), "a": torch.from_numpy(x[1, :777]).reshape(7, 111)}
    params = {k: torch.zeros_like(v) for k, v in grads.items()}
    expect = 0.0
    for name in ("a", "b"):
        expect += tree_reference([float(v) ** 2 for v in grads[name].flatten()])
    assert ShardAdamW(params, AdamWConfig(), "fixed-tree").step(grads) == math.sqrt(expect)
