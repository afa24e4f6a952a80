"""Worker strategies: the honest one, and attacks used by tests, demos and benchmarks.

Design decisions:
- A strategy changes only what a worker controls after sampling: the rewards it reports. Every
  attack here then computes its gradient from what it reports, packages and signs normally, so its
  contribution is well-formed, correctly signed, correctly assigned and exactly re-samplable; only
  a verifier that recomputes the rewards can tell. That isolates one detection path per attack.
- `forge-rewards` reports the opposite of every outcome (reward r becomes 1 - r on the 0/1 tasks):
  every sequence's claimed reward is wrong, so any checked commit fails the reward check, and the
  forged advantages are the honest ones negated, so its gradient pushes the policy away from right
  answers: the poisoning that robust aggregation and slashing must contain. Claiming "all
  correct" instead would earn rewards while adding a zero gradient (equal rewards in a group have
  no advantage), and would go unnoticed whenever every sample happened to be right.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from krill.errors import ConfigError


class Behavior(ABC):
    """What a worker reports about its rollouts."""

    name: str = ""

    @abstractmethod
    def reported_rewards(self, rewards: torch.Tensor) -> torch.Tensor:
        """The rewards this worker puts in its payload and learns from, given the true ones."""

    @property
    def honest(self) -> bool:
        return False


class Honest(Behavior):
    name = "honest"

    def reported_rewards(self, rewards: torch.Tensor) -> torch.Tensor:
        return rewards

    @property
    def honest(self) -> bool:
        return True


class ForgeRewards(Behavior):
    name = "forge-rewards"

    def reported_rewards(self, rewards: torch.Tensor) -> torch.Tensor:
        return (1.0 - rewards).to(torch.float32)


BEHAVIORS: dict[str, type[Behavior]] = {cls.name: cls for cls in (Honest, ForgeRewards)}


def get_behavior(name: str) -> Behavior:
    try:
        return BEHAVIORS[name]()
    except KeyError:
        raise ConfigError(f"worker.behavior: unknown strategy {name!r}; choose one of {sorted(BEHAVIORS)}") from None
