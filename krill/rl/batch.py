"""Padded views of rollouts for one teacher-forced pass, and the log-probs of that pass.

Design decisions:
- Right padding for the learner: positions then count from 0 for every sequence, so a
  teacher-forced pass needs no position ids, and the pad tokens sit after every real token
  where the causal mask keeps them from influencing anything that counts.
- Everything is aligned to *targets*: column t of `targets`, `mask`, `behaviour` describes the
  token predicted from position t (the token at t + 1). `mask` marks completion tokens, the
  only ones a loss or a log-prob check looks at.
- Log-probs are of the temperature-scaled distribution, computed in float32 with
  `log_softmax` + gather, the same quantity the engine records while sampling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # the engine imports this module; the rollout type is only annotated here
    from krill.rl.engine.base import Rollouts


@dataclass(frozen=True)
class LearnerBatch:
    input_ids: torch.Tensor  # int64 [B, L]
    attention_mask: torch.Tensor  # int64 [B, L]
    targets: torch.Tensor  # int64 [B, L - 1]
    mask: torch.Tensor  # float32 [B, L - 1], 1 on completion targets
    behaviour: torch.Tensor  # float32 [B, L - 1], behaviour log-probs on completion targets

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum())


def learner_batch(rollouts: Rollouts, pad_id: int, rows: torch.Tensor | None = None) -> LearnerBatch:
    """Right-padded tensors for the sequences `rows` of `rollouts` (all when None)."""
    idx = range(len(rollouts)) if rows is None else [int(r) for r in rows]
    lengths = [int(rollouts.offsets[i + 1] - rollouts.offsets[i]) for i in idx]
    width = max(lengths) if lengths else 1
    n = len(lengths)
    input_ids = torch.full((n, width), pad_id, dtype=torch.int64)
    attention = torch.zeros((n, width), dtype=torch.int64)
    mask = torch.zeros((n, width), dtype=torch.float32)
    behaviour = torch.zeros((n, width), dtype=torch.float32)
    for row, i in enumerate(idx):
        start, end = int(rollouts.offsets[i]), int(rollouts.offsets[i + 1])
        length = end - start
        input_ids[row, :length] = rollouts.tokens[start:end]
        attention[row, :length] = 1
        mask[row, int(rollouts.prompt_lengths[i]):length] = 1.0
        behaviour[row, :length] = rollouts.logprobs[start:end]
    return LearnerBatch(
        input_ids=input_ids,
        attention_mask=attention,
        targets=input_ids[:, 1:],
        mask=mask[:, 1:],
        behaviour=behaviour[:, 1:],
    )


def token_logprobs(model: torch.nn.Module, batch: LearnerBatch, temperature: float = 1.0) -> torch.Tensor:
    """Log-probs [B, L - 1] of each target token under `model` (differentiable; 0 off the mask)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1).gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)
    return logp * batch.mask
