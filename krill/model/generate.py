"""Batched token generation with a KV cache: greedy, or sampled from a seeded generator.

Design decisions:
- A hand-written decode loop over `model(..., cache=...)` (transformers 5) rather than
  `model.generate`: for models of a million parameters the per-step overhead of `generate`
  dominates, and a short loop is easy to make exactly reproducible.
- Prompts in one call must have equal token length (tasks make them so); callers with mixed
  lengths group them first (`krill.model.evaluate` does). No padding means no attention-mask or
  position-id subtleties, and the same logits as an unbatched forward pass.
- After a sequence emits eos it keeps emitting pad, so outputs are rectangular.
- Sampling draws from a caller-supplied `torch.Generator`: same seed, same tokens on CPU.

Public API:
    generate(model, input_ids, max_new_tokens, eos_id, pad_id, temperature=0.0,
             generator=None) -> LongTensor[batch, <= max_new_tokens]
"""

from __future__ import annotations

import torch


@torch.no_grad()
def generate(model, input_ids: torch.Tensor, max_new_tokens: int, eos_id: int, pad_id: int,
             temperature: float = 0.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """Continue each row of `input_ids` (all the same length) by up to `max_new_tokens` tokens.

    `temperature == 0` is greedy (argmax); otherwise tokens are sampled from
    softmax(logits / temperature) with `generator`.
    """
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids: expected a non-empty [batch, length] tensor, got {tuple(input_ids.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected >= 1, got {max_new_tokens}")
    out = model(input_ids=input_ids, use_cache=True, logits_to_keep=1)
    past = out.cache
    logits = out.logits[:, -1, :].float()
    done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    steps: list[torch.Tensor] = []
    for step in range(max_new_tokens):
        if temperature == 0.0:
            nxt = logits.argmax(dim=-1)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        steps.append(nxt)
        done = done | (nxt == eos_id)
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        out = model(input_ids=nxt[:, None], cache=past, use_cache=True, logits_to_keep=1)
        past = out.cache
        logits = out.logits[:, -1, :].float()
    return torch.stack(steps, dim=1)
