import enum

import pytest
import torch
from pydantic import TypeAdapter

from krill.rl.aggregate import (
    AggregationError,
    AggregationRule,
    CenteredClipRule,
    ClipMixTrimRule,
    MeanRule,
    MedianRule,
    TrimmedMeanRule,
    aggregate,
    clip_norms,
    default_rule,
)


class Fault(enum.Enum):
    SIGN_FLIP = "sign-flip"
    SCALED = "scaled"
    NOISE = "noise"
    CONSTANT = "constant"


def _updates(fault: Fault, n=10, byzantine=2, d=500, seed=0):
    gen = torch.Generator().manual_seed(seed)
    signal = torch.randn(d, generator=gen)
    honest = signal + 0.5 * torch.randn(n - byzantine, d, generator=gen)
    own = signal + 0.5 * torch.randn(byzantine, d, generator=gen)
    bad = {
        Fault.SIGN_FLIP: -4.0 * own,
        Fault.SCALED: 50.0 * own,
        Fault.NOISE: 30.0 * torch.randn(byzantine, d, generator=gen),
        Fault.CONSTANT: torch.full((byzantine, d), -10.0),
    }[fault]
    return torch.cat([honest, bad]), honest.mean(0)


def _rel_err(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("fault", list(Fault))
def test_default_rule_stays_close_to_the_honest_mean_under_20_percent_attackers(fault):
    x, honest_mean = _updates(fault)
    w = torch.ones(len(x))
    robust, stats = aggregate(x, w, ClipMixTrimRule())
    plain, _ = aggregate(x, w, MeanRule())
    assert _rel_err(robust, honest_mean) < 0.3
    assert _rel_err(plain, honest_mean) > 1.0
    assert stats.rule == "clip-mix-trim" and len(stats.trimmed_fractions) == len(x)
    for rule in (TrimmedMeanRule(), MedianRule(), CenteredClipRule(iterations=5)):
        assert _rel_err(aggregate(x, w, rule)[0], honest_mean) < 0.6, rule.type


def test_trimmed_mean_by_hand_and_weighted():
    x = torch.tensor([[1.0], [2.0], [3.0], [4.0], [100.0]])
    out, stats = aggregate(x, torch.ones(5), TrimmedMeanRule(trim_fraction=0.2))
    assert float(out) == pytest.approx(3.0)
    assert stats.trimmed_fractions == [1.0, 0.0, 0.0, 0.0, 1.0]
    # weights 1,1,1,1,4 (total 8): trim 1.6 at each end -> 1 loses all, 2 keeps 0.4, 100 keeps 2.4
    out, stats = aggregate(x, torch.tensor([1.0, 1, 1, 1, 4]), TrimmedMeanRule(trim_fraction=0.2))
    assert float(out) == pytest.approx((0.4 * 2 + 3 + 4 + 2.4 * 100) / 4.8)
    assert stats.trimmed_fractions == pytest.approx([1.0, 0.6, 0.0, 0.0, 0.4])


def test_weighted_mean_median_and_rules_from_config():
    x = torch.tensor([[0.0, 10.0], [1.0, 20.0], [2.0, 30.0]])
    w = torch.tensor([1.0, 1.0, 2.0])
    assert aggregate(x, w, MeanRule())[0].tolist() == pytest.approx([1.25, 22.5])
    assert aggregate(x, w, MedianRule())[0].tolist() == [1.0, 20.0]  # lower weighted median
    adapter = TypeAdapter(AggregationRule)
    rule = adapter.validate_python({"type": "trimmed-mean", "trim_fraction": 0.1})
    assert isinstance(rule, TrimmedMeanRule) and rule.trim_fraction == 0.1
    assert isinstance(adapter.validate_python({"type": "clip-mix-trim"}), ClipMixTrimRule)
    with pytest.raises(ValueError):
        adapter.validate_python({"type": "krum"})


def test_deterministic_and_order_of_equal_submissions_irrelevant():
    x, _ = _updates(Fault.SCALED, seed=3)
    w = torch.linspace(0.5, 1.0, len(x))
    a, _ = aggregate(x, w, ClipMixTrimRule())
    b, _ = aggregate(x.clone(), w.clone(), ClipMixTrimRule())
    assert torch.equal(a, b)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))
    c, _ = aggregate(x[perm], w[perm], TrimmedMeanRule())
    assert torch.allclose(c, aggregate(x, w, TrimmedMeanRule())[0], atol=1e-6)


def test_bad_inputs_rejected():
    with pytest.raises(AggregationError, match="weights"):
        aggregate(torch.zeros(3, 2), torch.zeros(3), MeanRule())
    with pytest.raises(AggregationError, match="NaN"):
        aggregate(torch.tensor([[float("nan")]]), torch.ones(1), MeanRule())
    with pytest.raises(AggregationError, match="shape"):
        aggregate(torch.zeros(3, 2), torch.ones(2), MeanRule())


def test_trimmed_mean_pairwise_and_sort_paths_agree(monkeypatch):
    import krill.rl.aggregate as agg

    g = torch.Generator().manual_seed(7)
    for n in (2, 5, 8, 16):
        x = torch.randint(-4, 5, (n, 300), generator=g).double()  # many ties
        w = torch.rand(n, generator=g, dtype=torch.float64) + 0.1
        subsets = agg.weighted_trimmed_mean(x, w, 0.2)
        monkeypatch.setattr(agg, "_SUBSET_MAX", 0)
        pairwise = agg.weighted_trimmed_mean(x, w, 0.2)
        monkeypatch.setattr(agg, "_PAIRWISE_MAX", 0)
        by_sort = agg.weighted_trimmed_mean(x, w, 0.2)
        monkeypatch.undo()
        for other in (subsets, pairwise):
            assert torch.allclose(other[0], by_sort[0], atol=1e-12) and torch.allclose(other[1], by_sort[1], atol=1e-12)
        assert torch.allclose(pairwise[1].sum(dim=0), torch.full((300,), float(w.sum()) * 0.6, dtype=torch.float64))


def test_trimmed_mean_counted_path_agrees_with_the_sort_path(monkeypatch):
    """Few distinct weights (counted per weight value) against the stable sort, ties included."""
    import krill.rl.aggregate as agg

    g = torch.Generator().manual_seed(11)
    for n, levels in ((2, (1.0,)), (5, (1.0, 0.5)), (8, (1.0, 0.5, 1 / 3)), (16, (0.7, 0.2, 0.1))):
        x = torch.randint(-4, 5, (n, 300), generator=g).double()  # many ties
        w = torch.tensor([levels[int(k)] for k in torch.randint(0, len(levels), (n,), generator=g)],
                         dtype=torch.float64)
        monkeypatch.setattr(agg, "_SUBSET_MAX", 0)
        counted = agg.weighted_trimmed_mean(x, w, 0.2)
        monkeypatch.setattr(agg, "_COUNTED_MAX_VALUES", 0)
        pairwise = agg.weighted_trimmed_mean(x, w, 0.2)
        monkeypatch.setattr(agg, "_PAIRWISE_MAX", 0)
        by_sort = agg.weighted_trimmed_mean(x, w, 0.2)
        monkeypatch.undo()
        for other in (pairwise, by_sort):
            assert torch.allclose(counted[0], other[0], atol=1e-12) and torch.allclose(counted[1], other[1], atol=1e-12)


@pytest.mark.parametrize("n, levels", [(8, None), (8, (1.0, 0.5, 1 / 3)), (13, (1.0, 0.5, 1 / 3)), (20, None)])
def test_trimmed_mean_gives_each_coordinate_the_same_bits_whatever_the_width(monkeypatch, n, levels):
    """A coordinate's result does not depend on where it sits in the tensor (vector body or tail)."""
    import krill.rl.aggregate as agg

    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, 4099, generator=g, dtype=torch.float64)
    if levels is None:
        w = torch.rand(n, generator=g, dtype=torch.float64) + 0.1
    else:
        w = torch.tensor([levels[i % len(levels)] for i in range(n)], dtype=torch.float64)
    whole, kept = agg.weighted_trimmed_mean(x, w, 0.2)
    for lo, hi in ((0, 3), (5, 17), (4090, 4099), (1000, 1031)):
        part, part_kept = agg.weighted_trimmed_mean(x[:, lo:hi].contiguous(), w, 0.2)
        assert torch.equal(part, whole[lo:hi]) and torch.equal(part_kept, kept[:, lo:hi])


def _by_value(x, c):
    """Submission indices in the order of their values at coordinate c, ties by index."""
    return sorted(range(x.shape[0]), key=lambda i: (float(x[i, c]), i))


def test_the_sort_paths_give_the_bits_of_a_per_coordinate_reference():
    """Above 16 submissions the trimmed mean, and the median at any n, come from a sort: against
    one Python loop per coordinate (running weight sums in sorted order, the mean summed in
    submission order), equal to the last bit, ties and signed zeros included."""
    import krill.rl.aggregate as agg

    g = torch.Generator().manual_seed(13)
    for n in (3, 17, 20, 33):
        x = torch.randn(n, 40, generator=g, dtype=torch.float64)
        x[:, :10] = torch.randint(-2, 3, (n, 10), generator=g).double()
        x[: n // 2, 10] = -0.0
        w = torch.rand(n, generator=g, dtype=torch.float64) + 0.1
        total = float(w.sum())
        cut = 0.2 * total
        want_kept = torch.zeros(n, 40, dtype=torch.float64)
        want_median = torch.zeros(40, dtype=torch.float64)
        for c in range(40):
            running = 0.0
            median_found = False
            for i in _by_value(x, c):
                running += float(w[i])
                lower = running - float(w[i])
                want_kept[i, c] = max(min(lower + float(w[i]), total - cut) - max(lower, cut), 0.0)
                if not median_found and running >= 0.5 * total:
                    want_median[c], median_found = x[i, c], True
        num = torch.zeros(40, dtype=torch.float64)
        den = torch.zeros(40, dtype=torch.float64)
        for i in range(n):
            num += want_kept[i] * x[i]
            den += want_kept[i]
        want_mean = num / den
        if n > agg._PAIRWISE_MAX:
            mean, kept = agg.weighted_trimmed_mean(x, w, 0.2)
            assert torch.equal(kept, want_kept) and torch.equal(mean, want_mean), n
        assert torch.equal(agg.weighted_median(x, w), want_median), n


@pytest.mark.parametrize("block", [32768, 64])
def test_nearest_neighbour_mixing_shares_sums_without_changing_them(monkeypatch, block):
    """One sum per distinct neighbour set, block by block of columns (257 columns: one block, or five
    with a tail), gives the bits of summing each row's neighbours from zero in index order; the
    distances, each pair computed once, are the bits of the full `cdist`."""
    import krill.rl.aggregate as agg
    from krill.rl.aggregate import _distances, nearest_neighbour_mixing

    monkeypatch.setattr(agg, "_MIX_BLOCK", block)

    g = torch.Generator().manual_seed(9)
    for n, f in ((2, 1), (5, 1), (8, 1), (10, 3), (16, 3), (33, 6)):
        x = torch.randn(n, 257, generator=g, dtype=torch.float64)
        x[1] = x[0]  # equal rows: equal neighbour sets
        x[:, :4] = -0.0
        dist = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist")
        assert torch.equal(_distances(x), dist)
        nearest = torch.sort(dist, dim=1, stable=True).indices[:, :n - f]
        want = torch.zeros_like(x)
        for i in range(n):
            for j in sorted(nearest[i].tolist()):
                want[i] += x[j]
        got = nearest_neighbour_mixing(x, f)
        assert torch.equal(got, want / (n - f)) and torch.equal(torch.signbit(got), torch.signbit(want / (n - f)))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_single_non_finite_coordinate_is_rejected(bad):
    x = torch.randn(8, 1001, generator=torch.Generator().manual_seed(1))
    x[5, 977] = bad
    with pytest.raises(AggregationError, match="NaN or infinity"):
        aggregate(x, torch.ones(8), ClipMixTrimRule())


def test_zero_updates_do_not_set_the_clip_limit_to_zero():
    # Two groups scored alike (no gradient) and two carry signal of equal norm: the signal must
    # survive. With the zero rows in the median, the limit was 0 and the version learned nothing.
    x = torch.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 0.0], [4.0, 3.0]])
    out, stats = aggregate(x, torch.ones(4), default_rule())
    assert stats.clipped == 0
    assert torch.allclose(out, aggregate(x, torch.ones(4), MeanRule())[0])
    assert float(out.norm()) > 0


def test_clip_limit_is_the_median_of_the_non_zero_norms():
    x = torch.tensor([[0.0], [1.0], [2.0], [30.0], [0.0]])
    clipped_rows, clipped = clip_norms(x, 1.0)
    assert clipped == 1 and clipped_rows.flatten().tolist() == [0.0, 1.0, 2.0, 2.0, 0.0]
    zeros = torch.zeros(3, 2)
    assert clip_norms(zeros, 1.0)[1] == 0 and bool((clip_norms(zeros, 1.0)[0] == 0).all())


def test_a_rule_published_with_the_plain_median_still_folds_with_it():
    x = torch.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 0.0], [4.0, 3.0]])
    old, stats = aggregate(x, torch.ones(4), ClipMixTrimRule())  # the class default: the plain median
    assert stats.clipped == 2 and float(old.norm()) == 0.0
    assert clip_norms(x, 1.0, nonzero=False)[1] == 2



@pytest.mark.parametrize("weights", [[1e308, 1e308], [1e300, 1e300]])
@pytest.mark.parametrize("rule", [MeanRule(), TrimmedMeanRule(), ClipMixTrimRule()], ids=lambda r: r.type)
def test_weights_whose_sums_overflow_are_refused_not_folded_into_nan(weights, rule):
    # [1e308, 1e308] sums to inf and gave a NaN aggregate; [1e300, 1e300] times 3e38 overflowed the weighted sum.
    updates = torch.tensor([[3e38, 1.0], [3e38, 2.0]])
    with pytest.raises(AggregationError, match="weights"):
        aggregate(updates, torch.tensor(weights, dtype=torch.float64), rule)
