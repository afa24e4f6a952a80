"""Rollout engines: the interface (`base`) and the Hugging Face / PyTorch engine (`hf`)."""

from krill.rl.engine.base import EngineError, NonFiniteLogitsError, RolloutEngine, Rollouts, SamplingParams
from krill.rl.engine.hf import HFEngine

__all__ = ["EngineError", "HFEngine", "NonFiniteLogitsError", "RolloutEngine", "Rollouts", "SamplingParams"]
