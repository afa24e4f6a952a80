"""The Hugging Face / PyTorch rollout engine: batched sampling with a KV cache.

Design decisions:
- A hand-written decode loop instead of `model.generate`: we need the behaviour log-prob of
  every sampled token, a sampler driven only by our own `torch.Generator` (so the seed alone
  decides the tokens), and no hidden logits processors. The loop is a few lines.
- Prompts of different lengths are left-padded for generation, with explicit position ids
  (cumulative attention mask) so that padding does not shift positions. Each distinct prompt
  runs once (the G samples of a group share it) and its keys and values are copied out to its
  rows; `generate_groups` batches several seeded groups (e.g. the simulated workers of
  `krill train local`) through one model call per step, each group sampling with its own
  generator from its own rows, so a group gets the tokens it would get alone (its log-probs agree
  to float rounding, about 5e-7, when groups of other prompt lengths share the batch, since the
  padded matrix products round differently; only `krill train local` batches groups, and
  verifiers replay with `generate`, one group at a time, as workers sample). Finished rows keep
  decoding pad tokens (cheaper than compacting the batch for the short completions RL uses)
  and stop the loop once every row has emitted eos.
- Sampling: temperature-scaled logits in float32, optional top-p (nucleus) filter with a
  stable sort, then `torch.multinomial` with the seeded generator. On CPU this is bit
  reproducible for the same weights, prompts, parameters and seed, which verifiers rely on.
  Temperature 0 is greedy decoding (log-probs then reported at temperature 1).
- Teacher-forced `logprobs` goes through `krill.rl.batch.completion_logprobs`, the very function the learner uses,
  so the engine and the learner agree on what a log-prob is.
- Non-finite logits (finite but huge weights overflow; `base` explains) raise `NonFiniteLogitsError`.
  The checks cost nothing measurable: each step looks at the log-prob of the drawn token only (a
  row with a NaN or +inf logit, or no finite one, log-softmaxes to NaN throughout), and the sampler's
  own refusal of such probabilities is turned into the same error; `logprobs` looks at its output.
  A check over the whole [rows, vocabulary] logits at every step was not: it added half a
  log-softmax to each step. Without them a sampled step raised torch's RuntimeError, which stopped
  a worker on every restart while the version was the newest, and a greedy one returned NaN
  log-probs.
"""

from __future__ import annotations

from pathlib import Path

import torch

from krill.rl.batch import completion_batch, completion_logprobs
from krill.rl.engine.base import EngineError, NonFiniteLogitsError, RolloutEngine, Rollouts, SamplingParams


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail of each row outside the smallest set of mass >= top_p; renormalise."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    cumulative = torch.cumsum(sorted_probs, dim=-1)
    drop_sorted = (cumulative - sorted_probs) >= top_p  # the first token is always kept
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    kept = probs.masked_fill(drop, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


class HFEngine(RolloutEngine):
    """Serves a `transformers` causal LM held in this process."""

    deterministic = True

    def __init__(self, model: torch.nn.Module, eos_id: int, pad_id: int, version: int | None = None):
        self.model = model.eval()
        self.eos_id = int(eos_id)
        self.pad_id = int(pad_id)
        self._version = version

    @classmethod
    def from_directory(cls, path: Path, version: int = 0, eos_id: int | None = None,
                       pad_id: int | None = None) -> HFEngine:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=torch.float32)
        eos = eos_id if eos_id is not None else model.config.eos_token_id
        pad = pad_id if pad_id is not None else model.config.pad_token_id
        if eos is None:
            raise EngineError(f"{path}: config.eos_token_id is not set; pass eos_id")
        return cls(model, eos_id=eos, pad_id=eos if pad is None else pad, version=version)

    @property
    def version(self) -> int | None:
        return self._version

    def load_state_dict(self, state: dict[str, torch.Tensor], version: int) -> None:
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or [m for m in missing if not _tied(self.model, m)]:
            raise EngineError(f"state dict does not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
        self._version = int(version)

    def trade_model(self, model: torch.nn.Module, version: int) -> tuple[torch.nn.Module, int | None]:
        """Serve `model`, which holds `version`'s weights, from now on; return the previous model and its version."""
        old, old_version = self.model, self._version
        self.model, self._version = model.eval(), int(version)
        return old, old_version

    def load_directory(self, path: Path, version: int) -> None:
        from safetensors.torch import load_file

        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise EngineError(f"{path}: no *.safetensors weights")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
        self.load_state_dict(state, version)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int) -> Rollouts:
        return self.generate_groups([(prompts, seed)], params)[0]

    @torch.inference_mode()
    def generate_groups(self, groups: list[tuple[list[list[int]], int]], params: SamplingParams) -> list[Rollouts]:
        """Sample several (prompts, seed) groups in one batch; each group gets the tokens `generate` gives
        it, with log-probs equal to float rounding (see the module notes).

        The model runs once per step over every row of every group, but each group's tokens are
        drawn with its own seeded generator from its own rows, and a group draws nothing once all
        of its rows have finished: the draws are those of the group alone.
        """
        if not groups or any(not prompts or any(len(p) == 0 for p in prompts) for prompts, _ in groups):
            raise EngineError("prompts: need at least one prompt, each with at least one token")
        prompts = [p for group_prompts, _ in groups for p in group_prompts]
        bounds, at = [], 0
        for group_prompts, _ in groups:
            bounds.append((at, at + len(group_prompts)))
            at += len(group_prompts)
        distinct: dict[tuple[int, ...], int] = {}
        row_prompt = torch.tensor([distinct.setdefault(tuple(p), len(distinct)) for p in prompts], dtype=torch.int64)
        batch = len(prompts)
        width = max(len(p) for p in distinct)
        input_ids = torch.full((len(distinct), width), self.pad_id, dtype=torch.int64)
        prompt_mask = torch.zeros((len(distinct), width), dtype=torch.int64)
        for j, p in enumerate(distinct):
            input_ids[j, width - len(p):] = torch.tensor(p, dtype=torch.int64)
            prompt_mask[j, width - len(p):] = 1
        positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
        generators = [torch.Generator(device="cpu").manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF) for _, seed in groups]
        greedy = params.temperature == 0.0

        from transformers import DynamicCache

        prompt_cache = DynamicCache(config=self.model.config)
        logits = self.model(input_ids=input_ids, attention_mask=prompt_mask, position_ids=positions,
                            cache=prompt_cache, use_cache=True, logits_to_keep=1).logits[:, -1][row_prompt]
        cache = DynamicCache(config=self.model.config)  # the prompts' keys and values, one copy per row
        for layer, held in enumerate(prompt_cache.layers):
            cache.update(held.keys[row_prompt], held.values[row_prompt], layer)
        attention = prompt_mask[row_prompt]
        next_pos = positions[row_prompt][:, -1:] + 1
        done = torch.zeros(batch, dtype=torch.bool)
        active = [True] * len(groups)  # a group stops drawing once all its rows have finished
        tokens: list[torch.Tensor] = []
        logps: list[torch.Tensor] = []
        for step in range(params.max_new_tokens):
            scaled = logits.float() if greedy or params.temperature == 1.0 else logits.float() / params.temperature
            logp_all = torch.log_softmax(scaled, dim=-1)
            if greedy:
                tok = torch.argmax(logp_all, dim=-1)
            else:
                probs = top_p_filter(logp_all.exp(), params.top_p)
                tok = torch.full((batch,), self.pad_id, dtype=torch.int64)
                for (lo, hi), generator, live in zip(bounds, generators, active, strict=True):
                    if live:
                        try:
                            tok[lo:hi] = torch.multinomial(probs[lo:hi], 1, generator=generator).squeeze(-1)
                        except RuntimeError as exc:  # torch refuses NaN / infinite probabilities
                            if bool(torch.isfinite(probs[lo:hi]).all()):
                                raise
                            raise self._non_finite(f"generation step {step}") from exc
            lp = logp_all.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
            if not bool(torch.isfinite(torch.where(done, torch.zeros_like(lp), lp)).all()):
                raise self._non_finite(f"generation step {step}")
            tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
            tokens.append(tok)
            logps.append(torch.where(done, torch.zeros_like(lp), lp))
            done = done | (tok == self.eos_id)
            active = [bool(not done[lo:hi].all()) for lo, hi in bounds]
            if not any(active) or step == params.max_new_tokens - 1:
                break
            attention = torch.cat([attention, torch.ones((batch, 1), dtype=torch.int64)], dim=1)
            logits = self.model(input_ids=tok.unsqueeze(-1), attention_mask=attention, position_ids=next_pos,
                                cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
            next_pos = next_pos + 1
        all_tokens, all_logps = torch.stack(tokens, 1), torch.stack(logps, 1)
        return [_to_rollouts(prompts[lo:hi], all_tokens[lo:hi], all_logps[lo:hi], self.eos_id) for lo, hi in bounds]

    @torch.inference_mode()
    def logprobs(self, rollouts: Rollouts, temperature: float = 1.0) -> torch.Tensor:
        batch = completion_batch(rollouts, self.pad_id)
        lp = completion_logprobs(self.model, batch, temperature if temperature > 0 else 1.0)
        out = torch.zeros_like(rollouts.logprobs)
        for row in range(len(rollouts)):
            split, end = int(rollouts.offsets[row] + rollouts.prompt_lengths[row]), int(rollouts.offsets[row + 1])
            out[split:end] = lp[row, :end - split]
        if not bool(torch.isfinite(out).all()):
            raise self._non_finite("the teacher-forced pass")
        return out

    def _non_finite(self, where: str) -> NonFiniteLogitsError:
        return NonFiniteLogitsError(f"version {self._version}: the weights give non-finite logits at {where} "
                                    "(finite but huge weights overflow); the version cannot be sampled from or scored")


def _tied(model: torch.nn.Module, name: str) -> bool:
    """A missing key is acceptable when it is a tied alias (e.g. lm_head tied to the embeddings)."""
    return bool(getattr(model.config, "tie_word_embeddings", False)) and name == "lm_head.weight"


def _to_rollouts(prompts: list[list[int]], tokens: torch.Tensor, logps: torch.Tensor, eos_id: int) -> Rollouts:
    completions: list[list[int]] = []
    completion_lps: list[list[float]] = []
    finished: list[bool] = []
    for i in range(len(prompts)):
        row = tokens[i].tolist()
        end = row.index(eos_id) + 1 if eos_id in row else len(row)
        completions.append(row[:end])
        completion_lps.append(logps[i, :end].tolist())
        finished.append(eos_id in row)
    return Rollouts.from_lists(prompts, completions, completion_lps, finished)
