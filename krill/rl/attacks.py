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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from krill.errors import KrillError

GRADIENT_ATTACKS: tuple[str, ...] = ("sign-flip", "scale", "noise", "alie", "ipm", "mimic")


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


def alie_z(n_total: int, n_byzantine: int) -> float:
    """Baruch et al.'s z for n workers of which f are Byzantine: Phi^-1((n - s) / n), s = floor(n/2 + 1) - f."""
    s = max(n_total // 2 + 1 - n_byzantine, 1)
    return float(torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor((n_total - s) / n_total, dtype=torch.float64)))


def byzantine_updates(attack: str, honest: torch.Tensor, n_byzantine: int, generator: torch.Generator,
                      params: AttackParams = AttackParams(), n_total: int | None = None) -> torch.Tensor:
    """honest: [k, d] rows the attacker observes (k >= 1); returns [n_byzantine, d] float32 rows.

    `n_total` (default k + n_byzantine) is the number of submissions the aggregator sees; only
    ALIE's default z uses it.
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
