"""Byzantine gradient attacks: what a coalition of dishonest workers submits instead of gradients.

Design decisions:
- Omniscient attackers, the standard threat model of the robust-aggregation literature: the
  coalition sees the honest rows of the same version and shard (`honest`, [k, d]) and all its
  members submit rows computed from them. Every attack is a pure function of those rows, the
  parameters and a seeded `torch.Generator` (only `noise` draws from it), so a benchmark cell
  is reproducible.
- Statistics are taken over the honest rows, unweighted, in float64; rows come back float32,
  the dtype of decompressed gradients. The coordinate-wise standard deviation of ALIE is the
  population one (divide by k), so a single observed row (k = 1) gives std 0 and ALIE sends
  the mean.
- The attacks, with mu the honest mean and sigma the coordinate-wise std over honest rows:
  - `sign-flip`: -mu (sign flipping, e.g. Allen-Zhu et al. 2021, "Byzantine-resilient
    non-convex SGD"; Li et al. 2019, RSA).
  - `scale`: scale x mu, scale = 10 by default (a boosted update, Bhagoji et al. 2019).
  - `noise`: mu + e, e ~ N(0, (noise_std x rms(mu))^2) per coordinate, independent per row,
    rms(mu) = sqrt(mean_j mu_j^2) (the Gaussian attack, e.g. Blanchard et al. 2017 / Xie et al.
    2018, scaled to the signal so the figure does not depend on the model).
  - `alie`: mu - z sigma ("A little is enough", Baruch et al. 2019). With n workers of which f
    are Byzantine, s = floor(n/2 + 1) - f honest workers must be won over and
    z = Phi^-1((n - s) / n); s is taken >= 1 so z stays finite when f >= n/2.
  - `ipm`: -epsilon x mu, epsilon = 0.5 (inner-product manipulation, Xie et al. 2020, "Fall
    of empires"): the aggregate's inner product with mu is pushed negative once robust rules
    keep the Byzantine rows.
  - `mimic`: a copy of honest row 0 (Karimireddy et al. 2022, bucketing paper): over-weighs one
    honest worker's data, invisible to any distance-based filter.
  - `tolerance-edge`: each Byzantine worker does its honest work and sends its own honest
    gradient g moved as far against the honest mean as the verifier's gradient check admits,
    so a replay of the commit passes and it is never slashed (below).
- `tolerance-edge`, the largest perturbation the gradient check admits. The check
  (`krill.protocol.work.check_gradient`) passes a claimed shard gradient g' against the
  recomputed g when cos(g', g) >= c and ||g'| - |g|| <= rho |g| (c = `grad_min_cosine`,
  rho = `grad_norm_rel_tol`; a verifier uses the looser of the run spec's and the shipped
  calibration table's, `verifier_tolerances`: c = 0.99909, rho = 0.012 for a default run, whose
  codec is int8 and whose spec defaults are that table's `[verify]`). Write
  g' = r |g| (cos t g^ + sin t e^) with e^ a unit vector orthogonal to g: the check admits exactly
  cos t >= c and |r - 1| <= rho. Hence, with s = sqrt(1 - c^2):
    largest part orthogonal to g:  |g'_perp| <= (1 + rho) s |g|                   (0.0432 |g|)
    largest deviation:             |g' - g|  <= sqrt(rho^2 + 2 (1 + rho)(1 - c)) |g|  (0.0446 |g|)
  the deviation's maximum is at r = 1 + rho, cos t = c. A zero g admits only g' = 0 (the check
  passes two zero gradients, and a non-zero one against zero has cosine 0).
- `tolerance-edge`, the direction. The coalition sees the honest mean mu (omniscient, as for the
  other attacks) and spends the whole budget to minimise mu . g', the first-order effect of its
  row on the update along the honest direction (what IPM and sign-flip aim at, kept admissible).
  With m_par = mu . g^ and m_perp = |mu_perp| (mu's part orthogonal to g), over the admissible set
  mu . g' = r |g| (cos t m_par + sin t e^ . mu_perp) is least at e^ = -mu_perp / m_perp,
  cos t = c, and r = 1 - rho when c m_par - s m_perp > 0, else r = 1 + rho. (The sign flip of g
  itself has no part orthogonal to g; mu_perp is the only direction the coalition knows to point
  against progress.) When mu has no part orthogonal to g (one observed row, or g parallel to mu)
  every orthogonal direction does as well: a seeded random one. `AttackParams.edge` scales both
  budgets (1: the edge; above 1 the row fails the check); the attack aims 1e-4 of each budget
  inside the edge so the float32 row still passes.
- `tolerance-edge`, the attacker's own gradient: `own` rows [f, d] when given (the benchmark
  passes the Byzantine workers' decoded honest rows); else honest row i mod k stands in for
  Byzantine row i's own gradient. A real attacker then encodes g' with the run's codec, whose
  rounding costs a little of the budget (honest int8 rounding is at most a tenth of it by the
  calibration's margin), so figures from rows that skip the codec bound the harm from above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from krill.errors import KrillError

GRADIENT_ATTACKS: tuple[str, ...] = ("sign-flip", "scale", "noise", "alie", "ipm", "mimic", "tolerance-edge")
OWN_GRADIENT_ATTACKS: frozenset[str] = frozenset({"tolerance-edge"})
"""Attacks a Byzantine worker mounts on its own honest gradient (it does the honest work first)."""
EDGE_SAFETY = 1e-4
"""`tolerance-edge` aims this fraction of each budget inside the check's edge (float32 rounding)."""
_VERIFY_DEFAULTS = {"grad_min_cosine": 0.99909, "grad_norm_rel_tol": 0.012}  # = VerifySpec's; a test holds them equal


class AttackError(KrillError, ValueError):
    """An unknown attack or inputs an attack cannot use."""


@dataclass(frozen=True)
class AttackParams:
    """Strength of each attack (see the module docstring for the definitions)."""

    scale: float = 10.0
    """`scale`: multiply the honest mean by this."""
    noise_std: float = 1.0
    """`noise`: std of the added Gaussian noise, in units of the honest mean's RMS per coordinate."""
    alie_z: float | None = None
    """`alie`: mean - z * std; None: z from n and f as in Baruch et al. 2019."""
    ipm_epsilon: float = 0.5
    """`ipm`: send -epsilon x the honest mean."""
    min_cosine: float = _VERIFY_DEFAULTS["grad_min_cosine"]
    """`tolerance-edge`: the gradient check's least cosine c (default: a default run's)."""
    norm_rel_tol: float = _VERIFY_DEFAULTS["grad_norm_rel_tol"]
    """`tolerance-edge`: the gradient check's largest relative norm difference rho (default: a default run's)."""
    edge: float = 1.0
    """`tolerance-edge`: fraction of the admissible angle gap (1 - c) and norm slack rho used (1: the edge)."""


def max_admissible_deviation(min_cosine: float, norm_rel_tol: float) -> float:
    """Largest |g' - g| / |g| the gradient check admits: sqrt(rho^2 + 2 (1 + rho)(1 - c))."""
    return math.sqrt(norm_rel_tol ** 2 + 2.0 * (1.0 + norm_rel_tol) * (1.0 - min_cosine))


def max_admissible_orthogonal(min_cosine: float, norm_rel_tol: float) -> float:
    """Largest |g'_perp| / |g| (the part of g' orthogonal to g) the check admits: (1 + rho) sqrt(1 - c^2)."""
    return (1.0 + norm_rel_tol) * math.sqrt(max(1.0 - min_cosine ** 2, 0.0))


def tolerance_edge_rows(own: torch.Tensor, mu: torch.Tensor, generator: torch.Generator,
                        params: AttackParams = AttackParams()) -> torch.Tensor:
    """own [f, d], mu [d] (float64): each own row moved to the admissible g' least along mu (module docstring)."""
    if not -1.0 < params.min_cosine <= 1.0 or params.norm_rel_tol < 0 or params.edge < 0:
        raise AttackError(f"tolerance-edge: needs -1 < min_cosine <= 1, norm_rel_tol >= 0 and edge >= 0, got "
                          f"{params.min_cosine}, {params.norm_rel_tol}, {params.edge}")
    use = params.edge * (1.0 - EDGE_SAFETY)
    cos_t = 1.0 - use * (1.0 - params.min_cosine)
    if cos_t < -1.0:
        raise AttackError(f"tolerance-edge: edge {params.edge} leaves the cosine below -1")
    sin_t = math.sqrt(max(1.0 - cos_t * cos_t, 0.0))
    slack = use * params.norm_rel_tol
    out = torch.zeros_like(own, dtype=torch.float64)
    for i, g in enumerate(own.to(torch.float64)):
        norm = float(g.norm())
        if norm == 0.0:
            continue  # a zero gradient admits only zero
        unit = g / norm
        m_par = float(mu @ unit)
        perp = mu - m_par * unit
        m_perp = float(perp.norm())
        if m_perp > 1e-12 * float(mu.norm()):
            e, sin_i, cos_i = -perp / m_perp, sin_t, cos_t
        else:  # nothing of mu is orthogonal to g: every orthogonal direction does as well
            m_perp = 0.0
            e = torch.randn(g.shape, generator=generator, dtype=torch.float64)
            e = e - float(e @ unit) * unit
            e_norm = float(e.norm())
            # d = 1 has no orthogonal direction: only the norm slack is left
            e, sin_i, cos_i = (e / e_norm, sin_t, cos_t) if e_norm > 0 else (torch.zeros_like(g), 0.0, 1.0)
        r = 1.0 - slack if cos_i * m_par - sin_i * m_perp > 0 else 1.0 + slack
        out[i] = r * norm * (cos_i * unit + sin_i * e)
    return out.to(torch.float32)


def alie_z(n_total: int, n_byzantine: int) -> float:
    """Baruch et al.'s z for n workers of which f are Byzantine: Phi^-1((n - s) / n), s = floor(n/2 + 1) - f."""
    s = max(n_total // 2 + 1 - n_byzantine, 1)
    return float(torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor((n_total - s) / n_total, dtype=torch.float64)))


def byzantine_updates(attack: str, honest: torch.Tensor, n_byzantine: int, generator: torch.Generator,
                      params: AttackParams = AttackParams(), n_total: int | None = None,
                      own: torch.Tensor | None = None) -> torch.Tensor:
    """honest: [k, d] rows the attacker observes (k >= 1); returns [n_byzantine, d] float32 rows.

    `n_total` (default k + n_byzantine) is the number of submissions the aggregator sees; only
    ALIE's default z uses it. `own` [n_byzantine, d]: the Byzantine workers' own honest gradients
    (only `tolerance-edge` uses them; default: honest row i mod k for Byzantine row i).
    """
    if attack not in GRADIENT_ATTACKS:
        raise AttackError(f"attack: unknown gradient attack {attack!r}; choose one of {', '.join(GRADIENT_ATTACKS)}")
    if honest.ndim != 2 or honest.shape[0] < 1:
        raise AttackError(f"honest: expected [k, d] with k >= 1, got {tuple(honest.shape)}")
    if n_byzantine < 0:
        raise AttackError(f"n_byzantine: {n_byzantine} < 0")
    k, d = honest.shape
    n = k + n_byzantine if n_total is None else n_total
    if n < n_byzantine + 1:
        raise AttackError(f"n_total: {n} leaves no honest worker beside {n_byzantine} Byzantine ones")
    x = honest.to(torch.float64)
    if not torch.isfinite(x).all():
        raise AttackError("honest: contains NaN or infinity")
    mu = x.mean(dim=0)
    if attack == "tolerance-edge":
        if own is None:
            own = x[torch.arange(n_byzantine) % k]
        elif own.shape != (n_byzantine, d):
            raise AttackError(f"own: expected [{n_byzantine}, {d}], got {tuple(own.shape)}")
        elif not torch.isfinite(own).all():
            raise AttackError("own: contains NaN or infinity")
        return tolerance_edge_rows(own, mu, generator, params)
    if attack == "sign-flip":
        row = -mu
    elif attack == "scale":
        row = params.scale * mu
    elif attack == "ipm":
        row = -params.ipm_epsilon * mu
    elif attack == "mimic":
        row = x[0]
    elif attack == "alie":
        z = alie_z(n, n_byzantine) if params.alie_z is None else params.alie_z
        sigma = x.std(dim=0, correction=0)
        row = mu - z * sigma
    else:  # noise
        rms = math.sqrt(float((mu * mu).mean())) if d else 0.0
        noise = torch.randn((n_byzantine, d), generator=generator, dtype=torch.float64)
        return (mu + params.noise_std * rms * noise).to(torch.float32)
    return row.unsqueeze(0).expand(n_byzantine, d).to(torch.float32).clone()
