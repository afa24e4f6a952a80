"""`tolerance-edge`: rows the attack produces pass the verifier's own gradient comparison at the
default run's tolerances, fail it a little beyond the edge, and are the admissible rows least
along the honest mean."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import krill.protocol.work as work
from krill.calibration.table import verifier_tolerances
from krill.payload.limits import PayloadLimits
from krill.protocol.spec import RunSpec, VerifySpec
from krill.rl.attacks import (
    AttackParams,
    byzantine_updates,
    max_admissible_deviation,
    max_admissible_orthogonal,
)

CID = "bafkreifjjcie6lypi6ny7amxnfftagclbuxndqonfipmb64f2km2devei4"
NAMES = ("a.weight", "b.weight")
SPLIT = 300  # shard of two tensors: the first SPLIT values, then the rest


def _spec() -> RunSpec:
    return RunSpec(name="edge", base_manifest_cid=CID, limits=PayloadLimits(vocab_size=16))


def _check(spec: RunSpec, verify: VerifySpec, claimed: torch.Tensor, recomputed: torch.Tensor, monkeypatch):
    """`check_gradient` itself, its recomputation replaced by `recomputed` (the comparison is the verifier's)."""
    split = lambda row: {NAMES[0]: row[:SPLIT].numpy(), NAMES[1]: row[SPLIT:].numpy()}  # noqa: E731
    monkeypatch.setattr(work, "gradient_values", lambda *args, **kw: {0: split(recomputed)})
    batch = SimpleNamespace(rewards=np.zeros(1, np.float32))
    monkeypatch.setattr(work, "rollouts_from_payload", lambda batch: None)
    return work.check_gradient(spec, None, batch, split(claimed), 0, None, None, 0, verify)


def _rows(seed: int, k: int = 6, f: int = 3, d: int = 800):
    gen = torch.Generator().manual_seed(seed)
    mu = 0.5 * torch.randn(d, generator=gen)
    honest = mu + torch.randn(k, d, generator=gen)
    own = mu + torch.randn(f, d, generator=gen)
    return honest, own


def test_the_attacks_default_tolerances_are_a_default_runs():
    spec = _spec()
    verify = verifier_tolerances(spec)  # the looser of the spec's and the shipped table's, as a verifier applies
    p = AttackParams()
    assert (p.min_cosine, p.norm_rel_tol) == (verify.grad_min_cosine, verify.grad_norm_rel_tol)
    assert (p.min_cosine, p.norm_rel_tol) == (VerifySpec().grad_min_cosine, VerifySpec().grad_norm_rel_tol)
    assert spec.compression.dtype == "int8"
    # the formulas of the module docstring, at c = 0.99909, rho = 0.012
    assert max_admissible_deviation(0.99909, 0.012) == pytest.approx(0.044563, abs=1e-6)
    assert max_admissible_orthogonal(0.99909, 0.012) == pytest.approx(0.043164, abs=1e-6)


@pytest.mark.parametrize("seed", range(3))
def test_rows_pass_the_verifiers_check_at_the_edge_and_fail_just_beyond(seed, monkeypatch):
    spec = _spec()
    verify = verifier_tolerances(spec)
    honest, own = _rows(seed)
    rows = byzantine_updates("tolerance-edge", honest, 3, torch.Generator().manual_seed(0), own=own)
    beyond = byzantine_updates("tolerance-edge", honest, 3, torch.Generator().manual_seed(0), AttackParams(edge=1.01),
                               own=own)
    for g, bad, too_far in zip(own, rows, beyond, strict=True):
        outcome = _check(spec, verify, bad, g, monkeypatch)
        assert outcome.ok, outcome.detail
        # at the edge: cosine and norm within 1e-4 of each budget (the attack's float32 safety)
        assert outcome.figures["cosine"] == pytest.approx(verify.grad_min_cosine, abs=2e-4 * (1 - verify.grad_min_cosine))
        assert outcome.figures["rel_norm_diff"] == pytest.approx(verify.grad_norm_rel_tol, rel=2e-4)
        # the deviation is the largest the check admits at the norm the attack chose (r = 1 -/+ rho)
        c, rho = verify.grad_min_cosine, verify.grad_norm_rel_tol
        deviation = float((bad.double() - g.double()).norm() / g.double().norm())
        assert 0.999 * math.sqrt(rho ** 2 + 2 * (1 - rho) * (1 - c)) <= deviation <= max_admissible_deviation(c, rho)
        assert not _check(spec, verify, too_far, g, monkeypatch).ok


def test_each_row_is_the_admissible_row_least_along_the_honest_mean(monkeypatch):
    """No random admissible row (on the cosine and norm bounds or inside them) has a smaller inner
    product with the honest mean than the attack's."""
    honest, own = _rows(5, d=200)
    mu = honest.double().mean(0)
    rows = byzantine_updates("tolerance-edge", honest, 3, torch.Generator().manual_seed(0), own=own).double()
    gen = torch.Generator().manual_seed(1)
    c, rho = AttackParams().min_cosine, AttackParams().norm_rel_tol
    for g, bad in zip(own.double(), rows, strict=True):
        assert float(mu @ bad) < float(mu @ g)  # it works against the honest direction
        unit = g / g.norm()
        for _ in range(500):
            e = torch.randn(200, generator=gen, dtype=torch.float64)
            e = e - (e @ unit) * unit
            e = e / e.norm()
            cos_t = 1 - (1 - c) * float(torch.rand(1, generator=gen)) ** 0.1
            r = 1 + rho * (2 * float(torch.rand(1, generator=gen)) - 1)
            other = r * g.norm() * (cos_t * unit + math.sqrt(1 - cos_t ** 2) * e)
            assert float(mu @ bad) <= float(mu @ other) + 1e-9


def test_without_own_rows_honest_rows_stand_in_and_degenerate_cases_stay_admissible():
    honest, _ = _rows(0, k=2, f=1)
    rows = byzantine_updates("tolerance-edge", honest, 3, torch.Generator().manual_seed(0)).double()
    for i, bad in enumerate(rows):
        g = honest[i % 2].double()
        cosine = float(bad @ g / (bad.norm() * g.norm()))
        assert cosine >= AttackParams().min_cosine and abs(float(bad.norm() / g.norm()) - 1) <= AttackParams().norm_rel_tol
    # one observed row: the mean is the row itself, a seeded orthogonal direction is taken
    one = honest[:1]
    a = byzantine_updates("tolerance-edge", one, 2, torch.Generator().manual_seed(3))
    assert torch.equal(a, byzantine_updates("tolerance-edge", one, 2, torch.Generator().manual_seed(3)))
    cosine = float(a[0].double() @ one[0].double() / (a[0].double().norm() * one[0].double().norm()))
    assert AttackParams().min_cosine <= cosine < 1 - 0.99 * (1 - AttackParams().min_cosine)
    # a zero own gradient admits only zero; a 1-d row only the norm slack
    zero = byzantine_updates("tolerance-edge", honest, 1, torch.Generator(), own=torch.zeros(1, honest.shape[1]))
    assert torch.equal(zero, torch.zeros_like(zero))
    scalar = byzantine_updates("tolerance-edge", torch.tensor([[2.0]]), 1, torch.Generator())
    assert float(scalar) == pytest.approx(2.0 * (1 - 0.012 * (1 - 1e-4)))
