"""Caps on untrusted payloads, taken from the run configuration.

Every decoder checks sizes against these before it allocates, so a hostile worker cannot make a
coordinator or verifier hold more than the caps say. Defaults fit the default tiny model; a run's
config sets its own (the vocabulary size is always the model's).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PayloadLimits(BaseModel):
    """Size and range caps for one run's payloads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int = Field(ge=1, le=1 << 24, description="Token ids must lie in [0, vocab_size).")
    max_header_bytes: int = Field(64 * 1024, ge=256, le=1 << 20, description="Largest signed header.")
    max_files: int = Field(256, ge=1, le=4096, description="Most files one header may name.")
    max_rollout_bytes: int = Field(64 << 20, ge=1024, description="Largest rollouts.safetensors.")
    max_sequences: int = Field(4096, ge=1, description="Most sequences in one contribution.")
    max_tokens: int = Field(1 << 21, ge=1, description="Most tokens (prompt + completion) in one contribution.")
    max_sequence_length: int = Field(8192, ge=2, description="Longest single sequence, prompt included.")
    max_groups: int = Field(4096, ge=1, description="Group ids must lie in [0, max_groups).")
    max_abs_reward: int = Field(1_000_000, ge=1, description="Rewards must lie in [-max_abs_reward, max_abs_reward].")
    max_grad_bytes: int = Field(256 << 20, ge=1024, description="Largest grad-<shard>.safetensors.")
    max_tensors: int = Field(4096, ge=1, description="Most tensors in one safetensors file.")
    max_safetensors_header_bytes: int = Field(1 << 20, ge=1024, description="Largest safetensors JSON header.")
