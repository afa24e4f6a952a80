"""The rollout-engine interface: sampling parameters, the rollout batch, the abstract engine.

Design decisions:
- An engine is told which weights to serve (`load_state_dict` / `load_directory`, tagged with a
  model version) and then answers two questions: `generate` (sample completions, recording the
  behaviour log-prob of every sampled token) and `logprobs` (teacher-forced log-probs of given
  sequences). That is all a worker, a verifier and a later vLLM engine need to share.
- Behaviour log-probs are those of the temperature-scaled distribution *before* top-p
  truncation: the learner can recompute exactly that quantity with one teacher-forced pass,
  while the truncated support depends on the sampling path. With top_p = 1 (the RL default)
  the two coincide.
- `Rollouts` is flat: all sequences (prompt then completion) concatenated, with offsets and
  prompt lengths, the same layout as `rollouts.safetensors` on the wire (DESIGN §3). Padded
  views for the learner are built on demand (`krill.rl.batch`).
- Sampling is driven by an explicit seed; an engine whose sampling is bit-reproducible on its
  hardware says so with `deterministic`, which is what lets verifiers re-sample exactly.
- Weights can be finite and still unusable: a published version whose weights are huge (a norm
  scaled to 1e38) overflows to infinite or NaN logits. `generate` and `logprobs` raise
  `NonFiniteLogitsError` (an `EngineError`) then, never a NaN log-prob nor the sampler's own
  RuntimeError, so that a caller can tell a version it cannot use from a bug: a worker skips the
  version as broken, a verifier does not charge it to the worker.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field

from krill.errors import KrillError


class EngineError(KrillError, ValueError):
    """A rollout engine was given inputs or weights it cannot use."""


class NonFiniteLogitsError(EngineError):
    """The weights served give a NaN or an infinity where a log-prob is computed: the version is unusable
    for these inputs (its fault, not the inputs': token ids in the vocabulary give finite logits on any
    weights of sane magnitude)."""


class SamplingParams(BaseModel):
    """How completions are sampled."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(1.0, ge=0.0, le=10.0,
                               description="Softmax temperature; 0 means greedy (arg-max) decoding.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass; 1 keeps the full distribution.")
    max_new_tokens: int = Field(16, ge=1, le=65536, description="Most tokens generated per completion.")


@dataclass(frozen=True)
class Rollouts:
    """A batch of sampled sequences in flat layout.

    `tokens[offsets[i]:offsets[i+1]]` is sequence i: its `prompt_lengths[i]` prompt tokens, then
    the completion (ending with eos when `finished[i]`). `logprobs` is aligned with `tokens`:
    the behaviour log-prob of each completion token, 0 on prompt tokens.
    """

    tokens: torch.Tensor  # int64 [N]
    offsets: torch.Tensor  # int64 [B + 1]
    prompt_lengths: torch.Tensor  # int64 [B]
    logprobs: torch.Tensor  # float32 [N]
    finished: torch.Tensor  # bool [B]

    def __len__(self) -> int:
        return int(self.prompt_lengths.numel())

    def sequence(self, i: int) -> list[int]:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]].tolist()

    def completion(self, i: int) -> list[int]:
        start = int(self.offsets[i] + self.prompt_lengths[i])
        return self.tokens[start:self.offsets[i + 1]].tolist()

    def sequences(self) -> list[list[int]]:
        """Every sequence's token ids (one conversion for the batch, not one per sequence)."""
        tokens, offsets = self.tokens.tolist(), self.offsets.tolist()
        return [tokens[a:b] for a, b in zip(offsets, offsets[1:], strict=False)]

    def completions(self) -> list[list[int]]:
        """Every sequence's completion token ids (one conversion for the batch)."""
        tokens, offsets, lengths = self.tokens.tolist(), self.offsets.tolist(), self.prompt_lengths.tolist()
        return [tokens[offsets[i] + lengths[i]:offsets[i + 1]] for i in range(len(lengths))]

    def completion_logprobs(self, i: int) -> torch.Tensor:
        start = int(self.offsets[i] + self.prompt_lengths[i])
        return self.logprobs[start:self.offsets[i + 1]]

    def completion_lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1] - self.prompt_lengths

    @property
    def num_completion_tokens(self) -> int:
        return int(self.completion_lengths().sum())

    @staticmethod
    def from_lists(prompts: list[list[int]], completions: list[list[int]],
                   completion_logprobs: list[list[float]], finished: list[bool]) -> Rollouts:
        if not (len(prompts) == len(completions) == len(completion_logprobs) == len(finished)):
            raise EngineError("prompts, completions, logprobs and finished differ in length")
        tokens: list[int] = []
        logprobs: list[float] = []
        offsets = [0]
        for p, c, lp in zip(prompts, completions, completion_logprobs, strict=True):
            if len(c) != len(lp):
                raise EngineError("a completion and its logprobs differ in length")
            tokens += list(p) + list(c)
            logprobs += [0.0] * len(p) + list(lp)
            offsets.append(len(tokens))
        return Rollouts(
            tokens=torch.tensor(tokens, dtype=torch.int64),
            offsets=torch.tensor(offsets, dtype=torch.int64),
            prompt_lengths=torch.tensor([len(p) for p in prompts], dtype=torch.int64),
            logprobs=torch.tensor(logprobs, dtype=torch.float32),
            finished=torch.tensor(finished, dtype=torch.bool),
        )

    @staticmethod
    def concat(parts: list[Rollouts]) -> Rollouts:
        if not parts:
            raise EngineError("cannot concatenate zero rollout batches")
        offsets = [parts[0].offsets]
        base = parts[0].offsets[-1]
        for part in parts[1:]:
            offsets.append(part.offsets[1:] + base)
            base = base + part.offsets[-1]
        return Rollouts(
            tokens=torch.cat([p.tokens for p in parts]),
            offsets=torch.cat(offsets),
            prompt_lengths=torch.cat([p.prompt_lengths for p in parts]),
            logprobs=torch.cat([p.logprobs for p in parts]),
            finished=torch.cat([p.finished for p in parts]),
        )


class RolloutEngine(ABC):
    """Serves one model version at a time: samples with behaviour log-probs, scores sequences."""

    #: True when the same weights, prompts, params and seed give the same tokens bit for bit.
    deterministic: bool = False

    @property
    @abstractmethod
    def version(self) -> int | None:
        """The model version whose weights are loaded (None before any load)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Serve these weights (a full state dict of the architecture) as `version`."""

    @abstractmethod
    def load_directory(self, path: Path, version: int) -> None:
        """Serve the weights of a local Hugging Face model directory as `version`."""

    @abstractmethod
    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int) -> Rollouts:
        """Sample one completion per prompt (repeat a prompt for a group)."""

    @abstractmethod
    def logprobs(self, rollouts: Rollouts, temperature: float = 1.0) -> torch.Tensor:
        """Teacher-forced log-probs of every completion token, in the layout of `rollouts.logprobs`."""
