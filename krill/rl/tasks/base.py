"""The task interface: deterministic prompts by index, deterministic rewards from text.

Design decisions:
- A prompt is a pure function of (task name, level, split, index): workers, verifiers and the
  coordinator regenerate the same prompt from the index alone, so an index (chosen by
  `krill.rl.assign`) is all that a payload has to name.
- Train and eval splits are disjoint by construction: a problem belongs to the eval split iff
  sha256(task, level, problem) falls in the first `EVAL_PERCENT` of the hash range. A prompt is
  drawn by rejection: a sha256-seeded generator proposes problems until one of the requested
  split comes up. Which split a problem lies in depends on the problem, not on the index, so no
  eval problem can ever be a training prompt. Indices may repeat a problem (sampling with
  replacement); at the sizes used here that is rare and harmless.
- Rewards are deterministic functions of prompt metadata and completion text with a strict
  answer format: the completion (text before the first eos, see
  `krill.model.tokenizer.decode_completion`) must be exactly a well-formed answer; anything else,
  including trailing text, scores 0. A completion with no eos, or with another special token
  before its eos, decodes to "", and no well-formed answer is empty, so it scores 0 too.
- Metadata is plain JSON data (ints and strings), so it can be logged and compared.
- Prompts of one task level all have the same length in characters, so a batch of prompts
  needs no padding.

Public API:
    Task.name, Task.level, Task.levels, Task.max_new_tokens
    Task.prompt(index, split="train") -> (text, metadata)
    Task.reward(metadata, completion_text) -> float        1.0 or 0.0
    Task.reference(metadata) -> str                        a correct completion (warm start)
    Task.split_of(metadata) -> "train" | "eval"
"""

from __future__ import annotations

import hashlib
import operator
import random
from abc import ABC, abstractmethod
from typing import Any, Literal

from krill.errors import KrillError

Split = Literal["train", "eval"]
SPLITS: tuple[str, ...] = ("train", "eval")
EVAL_PERCENT = 10
MAX_INDEX = 2**63 - 1


class TaskError(KrillError, ValueError):
    """A task name, level, split or prompt index is invalid."""


def _digest(*parts: Any) -> bytes:
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()


class Task(ABC):
    """A family of prompts with a verifiable reward, at one difficulty level."""

    name: str = ""
    levels: tuple[int, ...] = ()
    default_level: int = 1

    def __init__(self, level: int | None = None):
        level = self.default_level if level is None else level
        if level not in self.levels:
            raise TaskError(f"level: task {self.name!r} has levels {list(self.levels)}, not {level!r}")
        self.level = level

    def __repr__(self) -> str:
        return f"{type(self).__name__}(level={self.level})"

    @property
    def spec(self) -> str:
        """`name:level`, the string `get_task` accepts back."""
        return f"{self.name}:{self.level}"

    @property
    @abstractmethod
    def max_new_tokens(self) -> int:
        """Generation budget: one more than the longest well-formed answer (room for eos)."""

    @abstractmethod
    def _draw(self, rng: random.Random) -> dict[str, Any]:
        """Propose one problem's metadata from `rng`."""

    @abstractmethod
    def _render(self, metadata: dict[str, Any]) -> str:
        """The prompt text of a problem."""

    @abstractmethod
    def _problem_key(self, metadata: dict[str, Any]) -> str:
        """A canonical string identifying the problem (decides its split)."""

    @abstractmethod
    def reward(self, metadata: dict[str, Any], completion: str) -> float:
        """1.0 for a correct, well-formed completion; 0.0 otherwise, always for ""."""

    @abstractmethod
    def reference(self, metadata: dict[str, Any]) -> str:
        """One correct completion (used by the supervised warm start)."""

    def split_of(self, metadata: dict[str, Any]) -> Split:
        """The split a problem lies in, from its content alone."""
        h = int.from_bytes(_digest("split", self.name, self.level, self._problem_key(metadata))[:8], "big")
        return "eval" if h % 100 < EVAL_PERCENT else "train"

    def prompt(self, index: int, split: Split = "train") -> tuple[str, dict[str, Any]]:
        """The prompt text and metadata of problem `index` of `split`; deterministic."""
        if split not in SPLITS:
            raise TaskError(f"split: expected one of {SPLITS}, got {split!r}")
        try:
            value = -1 if isinstance(index, bool) else operator.index(index)
        except TypeError:
            value = -1
        if not 0 <= value <= MAX_INDEX:
            raise TaskError(f"index: expected an int in [0, 2**63), got {index!r}")
        index = value
        seed = int.from_bytes(_digest("prompt", self.name, self.level, split, index)[:16], "big")
        rng = random.Random(seed)
        while True:
            meta = self._draw(rng)
            if self.split_of(meta) == split:
                return self._render(meta), meta

    def prompts(self, indices, split: Split = "train") -> list[tuple[str, dict[str, Any]]]:
        """`prompt` over several indices."""
        return [self.prompt(i, split) for i in indices]
