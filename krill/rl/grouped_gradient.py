"""Several workers' gradients at one learner version in one batched pass (`krill train local`).

Design decisions:
- The simulated workers of `krill train local` all take their gradients at the current version,
  each on its own rollouts. One pass over all their rows, instead of one pass per worker, saves
  the per-call cost of the model's Python code and of the autograd graph (most of a 32-row pass
  on the default model); the arithmetic is the same.
- The workers are kept apart only where they must be: the weight gradients. During the pass the
  model's Linear, RMSNorm-weight and Embedding modules run through autograd functions whose
  forward is the ordinary one (shared weights, one matrix product for all rows) and whose
  backward returns the input gradient as usual plus, for the weight, a [W, ...] gradient with
  worker w's rows summed into slice w (one product per worker over its own range of rows).
  That goes to a stand-in leaf per parameter; the real parameters are frozen for the pass, so
  no summed weight gradient is computed. Rows never mix across workers: attention stays within
  a row, and a row reads only its own worker's prompts.
- The batch is the workers' batches one after the other: each worker's rows with a nonzero
  advantage (as `shard_gradients` skips the rest) and its distinct prompts, as contiguous
  ranges, with the prompts left-padded and the completions right-padded to the longest (mask 0
  there). `completion_logprobs` says before each model call whether it runs the prompts or the
  rows, so each layer knows which ranges belong to which worker.
- A model with any other parameterised module, tied weights, biases or a KL term raises
  `GroupedGradientError`; `krill train local` then takes one pass per worker.
- The result equals `krill.rl.gradient.shard_gradients` per worker up to float32 rounding (sums
  in another order; tests/unit/rl/test_grouped_gradient.py). The distributed protocol's workers
  and verifiers keep `shard_gradients`, one worker per pass, whose bits a replay can check.
"""

from __future__ import annotations

import time
import types
from contextlib import contextmanager

import torch

from krill.errors import KrillError
from krill.rl.batch import CompletionBatch, completion_batch, completion_logprobs
from krill.rl.engine.base import Rollouts
from krill.rl.gradient import GradientResult, check_inputs
from krill.rl.loss import LossConfig, policy_loss


class GroupedGradientError(KrillError, ValueError):
    """The model or loss has something the grouped pass cannot split by worker."""


class _Layout:
    """Which batch rows belong to which worker, for the model call under way."""

    def __init__(self, workers: int):
        self.workers = workers
        self.ranges: dict[str, list[tuple[int, int]]] = {}
        self.current: list[tuple[int, int]] = []

    def use(self, call: str) -> None:
        self.current = self.ranges[call]


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, stand_in, layout):
        ctx.save_for_backward(x, weight)
        ctx.ranges = layout.current
        return torch.nn.functional.linear(x, weight)

    @staticmethod
    def backward(ctx, gy):
        x, weight = ctx.saved_tensors
        gx = torch.matmul(gy, weight)
        gw = torch.empty(len(ctx.ranges), *weight.shape, dtype=gy.dtype)
        for k, (lo, hi) in enumerate(ctx.ranges):
            torch.mm(gy[lo:hi].reshape(-1, gy.shape[-1]).t(), x[lo:hi].reshape(-1, x.shape[-1]), out=gw[k])
        return gx, None, gw, None


class _Scale(torch.autograd.Function):
    """weight * h (the last step of an RMSNorm), weight gradient per worker."""

    @staticmethod
    def forward(ctx, h, weight, stand_in, layout):
        ctx.save_for_backward(h, weight)
        ctx.ranges = layout.current
        return weight * h

    @staticmethod
    def backward(ctx, gy):
        h, weight = ctx.saved_tensors
        gh = gy * h
        gw = torch.stack([gh[lo:hi].reshape(-1, h.shape[-1]).sum(dim=0) for lo, hi in ctx.ranges])
        return gy * weight, None, gw, None


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, weight, stand_in, layout, padding_idx):
        ctx.save_for_backward(ids)
        ctx.ranges, ctx.padding_idx, ctx.shape = layout.current, padding_idx, weight.shape
        return torch.nn.functional.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, gy):
        (ids,) = ctx.saved_tensors
        w = len(ctx.ranges)
        vocab, dim = ctx.shape
        owner = torch.repeat_interleave(torch.arange(w), torch.tensor([hi - lo for lo, hi in ctx.ranges]))
        shaped = owner.view(-1, *([1] * (ids.ndim - 1))).expand_as(ids)
        index = (ids + shaped * vocab).reshape(-1)
        grad = gy.reshape(-1, dim)
        if ctx.padding_idx is not None:  # as nn.Embedding: the padding row gets no gradient
            grad = grad * (ids.reshape(-1) != ctx.padding_idx).unsqueeze(1).to(grad.dtype)
        gw = torch.zeros(w * vocab, dim, dtype=gy.dtype).index_add_(0, index, grad)
        return None, None, gw.view(w, vocab, dim), None, None


def _forward(module: torch.nn.Module, stand_in: torch.Tensor, layout: _Layout):
    """A forward for `module` that reports its weight gradient per worker into `stand_in`."""
    if isinstance(module, torch.nn.Linear):
        if module.bias is not None:
            raise GroupedGradientError("grouped gradients: Linear layers with a bias are not supported")
        return lambda self, x: _Linear.apply(x, self.weight, stand_in, layout)
    if isinstance(module, torch.nn.Embedding):
        if module.max_norm is not None or module.scale_grad_by_freq or module.sparse:
            raise GroupedGradientError("grouped gradients: Embedding options max_norm/scale_grad_by_freq/sparse")
        return lambda self, ids: _Embedding.apply(ids, self.weight, stand_in, layout, self.padding_idx)
    if type(module).__name__ == "LlamaRMSNorm":
        def rms_norm(self, hidden):  # LlamaRMSNorm.forward, the weight applied by `_Scale`
            dtype = hidden.dtype
            h = hidden.to(torch.float32)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return _Scale.apply(h.to(dtype), self.weight, stand_in, layout)
        return rms_norm
    raise GroupedGradientError(f"grouped gradients: unsupported parameterised module {type(module).__name__}")


@contextmanager
def grouped_parameters(model: torch.nn.Module, layout: _Layout):
    """Yield {name: stand-in leaf [W, ...]} whose .grad is each worker's weight gradient after backward."""
    workers = layout.workers
    stand_ins: dict[str, torch.Tensor] = {}
    patched: list[torch.nn.Module] = []
    frozen = {name: p.requires_grad for name, p in model.named_parameters()}
    seen: set[int] = set()
    try:
        for prefix, module in model.named_modules(remove_duplicate=False):
            own = dict(module.named_parameters(recurse=False))
            if not own:
                continue
            if set(own) != {"weight"}:
                raise GroupedGradientError(f"grouped gradients: module {prefix} has parameters {sorted(own)}")
            if id(own["weight"]) in seen:
                raise GroupedGradientError(f"grouped gradients: {prefix}.weight is tied to another parameter")
            seen.add(id(own["weight"]))
            shape = own["weight"].shape
            stand_in = torch.zeros((), dtype=own["weight"].dtype).expand(workers, *shape).requires_grad_()
            module.forward = types.MethodType(_forward(module, stand_in, layout), module)
            patched.append(module)
            stand_ins[f"{prefix}.weight"] = stand_in
        for p in model.parameters():
            p.requires_grad_(False)
        yield stand_ins
    finally:
        for module in patched:
            del module.forward
        for name, p in model.named_parameters():
            p.requires_grad_(frozen[name])


def _concatenate(batches: list[CompletionBatch], pad_id: int) -> tuple[CompletionBatch, _Layout]:
    """The workers' batches one after the other (prompts left-padded, completions right-padded)."""
    width = max(b.prompt_ids.shape[1] for b in batches)
    steps = max(b.targets.shape[1] for b in batches)
    layout = _Layout(len(batches))
    prompt_at, row_at = [0], [0]
    for b in batches:
        prompt_at.append(prompt_at[-1] + b.prompt_ids.shape[0])
        row_at.append(row_at[-1] + b.targets.shape[0])
    layout.ranges = {"prompts": list(zip(prompt_at[:-1], prompt_at[1:], strict=True)),
                     "rows": list(zip(row_at[:-1], row_at[1:], strict=True))}

    def left(t: torch.Tensor, fill: int) -> torch.Tensor:
        return torch.nn.functional.pad(t, (width - t.shape[1], 0), value=fill)

    def right(t: torch.Tensor, fill: float) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, steps - t.shape[1]), value=fill)

    batch = CompletionBatch(
        prompt_ids=torch.cat([left(b.prompt_ids, pad_id) for b in batches]),
        prompt_mask=torch.cat([left(b.prompt_mask, 0) for b in batches]),
        group=torch.cat([b.group + at for b, at in zip(batches, prompt_at, strict=False)]),
        prompt_lengths=torch.cat([b.prompt_lengths for b in batches]),
        targets=torch.cat([right(b.targets, pad_id) for b in batches]),
        mask=torch.cat([right(b.mask, 0.0) for b in batches]),
        behaviour=torch.cat([right(b.behaviour, 0.0) for b in batches]))
    return batch, layout


def grouped_shard_gradients(model: torch.nn.Module, work: list[tuple[Rollouts, torch.Tensor]],
                            shards: dict[int, list[str]], config: LossConfig, pad_id: int) -> list[GradientResult]:
    """`shard_gradients(model, rollouts, advantages, shards, config, pad_id)` for each (rollouts, advantages)."""
    started = time.perf_counter()
    params = dict(model.named_parameters())
    for rollouts, advantages in work:
        check_inputs(params, shards, rollouts, advantages)
    if config.kl_coef > 0:
        raise GroupedGradientError("grouped gradients: a KL term needs the reference model")
    w = len(work)
    active = [torch.nonzero(adv != 0).flatten() for _, adv in work]
    losses: list[torch.Tensor | None] = [None] * w
    stats: list[dict[str, float]] = [{} for _ in range(w)]
    grads: list[dict[int, dict[str, torch.Tensor]]] = [{s: {} for s in shards} for _ in range(w)]
    was_training = model.training
    try:
        if was_training:
            model.train(False)  # no dropout: the gradient must be a function of the inputs alone
        batches = [completion_batch(rollouts, pad_id, idx) for (rollouts, _), idx in zip(work, active, strict=True)]
        batch, layout = _concatenate(batches, pad_id)
        with grouped_parameters(model, layout) as stand_ins:
            if any(len(idx) for idx in active):
                logp = completion_logprobs(model, batch, config.temperature, before_call=layout.use)
                for k, ((rollouts, adv), idx) in enumerate(zip(work, active, strict=True)):
                    if len(idx):
                        lo, hi = layout.ranges["rows"][k]
                        losses[k], stats[k] = policy_loss(logp[lo:hi], batch.behaviour[lo:hi], adv[idx],
                                                          batch.mask[lo:hi], config,
                                                          num_tokens=rollouts.num_completion_tokens)
                torch.stack([x for x in losses if x is not None]).sum().backward()
            for shard, names in shards.items():
                for name in names:
                    g = stand_ins[name].grad
                    for k in range(w):
                        grads[k][shard][name] = (g[k] if g is not None and len(active[k]) else
                                                 torch.zeros_like(params[name], dtype=torch.float32))
    finally:
        if was_training:
            model.train(True)
    seconds = (time.perf_counter() - started) / w
    out = []
    for k, ((rollouts, _), idx) in enumerate(zip(work, active, strict=True)):
        st = dict(stats[k], tokens=float(rollouts.num_completion_tokens), active_sequences=float(len(idx)))
        loss = losses[k]
        out.append(GradientResult(grads[k], 0.0 if loss is None else float(loss.detach()), st, seconds))
    return out
