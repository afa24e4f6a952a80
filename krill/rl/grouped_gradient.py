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
  worker w's rows summed into slice w (a batched product). That goes to a stand-in leaf per
  parameter; the real parameters are frozen for the pass, so no summed weight gradient is
  computed. Rows never mix across workers: attention stays within a row, and a row reads only
  its own worker's prompts.
- Equal shapes by padding: each worker's rows with a nonzero advantage (as `shard_gradients`
  skips the rest), its distinct prompts, the prompt width and completion length are padded to
  the largest; padded rows and tokens carry mask 0 and advantage 0, so they add nothing.
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
from krill.rl.gradient import GradientError, GradientResult
from krill.rl.loss import LossConfig, policy_loss


class GroupedGradientError(KrillError, ValueError):
    """The model or loss has something the grouped pass cannot split by worker."""


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, stand_in, workers):
        ctx.save_for_backward(x, weight)
        ctx.workers = workers
        return torch.nn.functional.linear(x, weight)

    @staticmethod
    def backward(ctx, gy):
        x, weight = ctx.saved_tensors
        w = ctx.workers
        gx = torch.matmul(gy, weight)
        gw = torch.bmm(gy.reshape(w, -1, gy.shape[-1]).transpose(1, 2), x.reshape(w, -1, x.shape[-1]))
        return gx, None, gw, None


class _Scale(torch.autograd.Function):
    """weight * h (the last step of an RMSNorm), weight gradient per worker."""

    @staticmethod
    def forward(ctx, h, weight, stand_in, workers):
        ctx.save_for_backward(h, weight)
        ctx.workers = workers
        return weight * h

    @staticmethod
    def backward(ctx, gy):
        h, weight = ctx.saved_tensors
        gw = (gy * h).reshape(ctx.workers, -1, h.shape[-1]).sum(dim=1)
        return gy * weight, None, gw, None


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, weight, stand_in, workers, padding_idx):
        ctx.save_for_backward(ids)
        ctx.workers, ctx.padding_idx, ctx.shape = workers, padding_idx, weight.shape
        return torch.nn.functional.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, gy):
        (ids,) = ctx.saved_tensors
        w = ctx.workers
        vocab, dim = ctx.shape
        rows = ids.reshape(w, -1)
        index = (rows + torch.arange(w, dtype=ids.dtype).unsqueeze(1) * vocab).reshape(-1)
        grad = gy.reshape(-1, dim)
        if ctx.padding_idx is not None:  # as nn.Embedding: the padding row gets no gradient
            grad = grad * (rows.reshape(-1) != ctx.padding_idx).unsqueeze(1).to(grad.dtype)
        gw = torch.zeros(w * vocab, dim, dtype=gy.dtype).index_add_(0, index, grad)
        return None, None, gw.view(w, vocab, dim), None, None


def _forward(module: torch.nn.Module, stand_in: torch.Tensor, workers: int):
    """A forward for `module` that reports its weight gradient per worker into `stand_in`."""
    if isinstance(module, torch.nn.Linear):
        if module.bias is not None:
            raise GroupedGradientError("grouped gradients: Linear layers with a bias are not supported")
        return lambda self, x: _Linear.apply(x, self.weight, stand_in, workers)
    if isinstance(module, torch.nn.Embedding):
        if module.max_norm is not None or module.scale_grad_by_freq or module.sparse:
            raise GroupedGradientError("grouped gradients: Embedding options max_norm/scale_grad_by_freq/sparse")
        return lambda self, ids: _Embedding.apply(ids, self.weight, stand_in, workers, self.padding_idx)
    if type(module).__name__ == "LlamaRMSNorm":
        def rms_norm(self, hidden):  # LlamaRMSNorm.forward, the weight applied by `_Scale`
            dtype = hidden.dtype
            h = hidden.to(torch.float32)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return _Scale.apply(h.to(dtype), self.weight, stand_in, workers)
        return rms_norm
    raise GroupedGradientError(f"grouped gradients: unsupported parameterised module {type(module).__name__}")


@contextmanager
def grouped_parameters(model: torch.nn.Module, workers: int):
    """Yield {name: stand-in leaf [W, ...]} whose .grad is each worker's weight gradient after backward."""
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
            module.forward = types.MethodType(_forward(module, stand_in, workers), module)
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


def _pad_batches(batches: list[CompletionBatch], pad_id: int) -> CompletionBatch:
    """One batch of the workers' batches, each padded to the same prompts, width, rows and steps."""
    prompts = max(1, max(b.prompt_ids.shape[0] for b in batches))
    width = max(1, max(b.prompt_ids.shape[1] for b in batches))
    rows = max(1, max(b.targets.shape[0] for b in batches))
    steps = max(b.targets.shape[1] for b in batches)
    w = len(batches)
    prompt_ids = torch.full((w * prompts, width), pad_id, dtype=torch.int64)
    prompt_mask = torch.zeros((w * prompts, width), dtype=torch.int64)
    group = torch.zeros(w * rows, dtype=torch.int64)
    prompt_lengths = torch.zeros(w * rows, dtype=torch.int64)
    targets = torch.full((w * rows, steps), pad_id, dtype=torch.int64)
    mask = torch.zeros((w * rows, steps), dtype=torch.float32)
    behaviour = torch.zeros((w * rows, steps), dtype=torch.float32)
    for k, b in enumerate(batches):
        p, lp = b.prompt_ids.shape
        r, t = b.targets.shape
        p0, r0 = k * prompts, k * rows
        if p:
            prompt_ids[p0:p0 + p, width - lp:] = b.prompt_ids
            prompt_mask[p0:p0 + p, width - lp:] = b.prompt_mask
            prompt_ids[p0 + p:p0 + prompts] = prompt_ids[p0]  # padding prompts: copies of the first
            prompt_mask[p0 + p:p0 + prompts] = prompt_mask[p0]
        else:  # a worker with no active rows: one placeholder token, read by nothing that counts
            prompt_mask[p0:p0 + prompts, -1] = 1
        group[r0:r0 + rows] = p0
        group[r0:r0 + r] = b.group + p0
        prompt_lengths[r0:r0 + rows] = int(prompt_mask[p0].sum())
        prompt_lengths[r0:r0 + r] = b.prompt_lengths
        targets[r0:r0 + r, :t] = b.targets
        mask[r0:r0 + r, :t] = b.mask
        behaviour[r0:r0 + r, :t] = b.behaviour
    return CompletionBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, group=group,
                           prompt_lengths=prompt_lengths, targets=targets, mask=mask, behaviour=behaviour)


def grouped_shard_gradients(model: torch.nn.Module, work: list[tuple[Rollouts, torch.Tensor]],
                            shards: dict[int, list[str]], config: LossConfig, pad_id: int) -> list[GradientResult]:
    """`shard_gradients(model, rollouts, advantages, shards, config, pad_id)` for each (rollouts, advantages)."""
    started = time.perf_counter()
    params = dict(model.named_parameters())
    for shard, names in shards.items():
        for name in names:
            if name not in params:
                raise GradientError(f"shards[{shard}]: model has no parameter {name!r}")
    for rollouts, advantages in work:
        if advantages.shape != (len(rollouts),):
            raise GradientError(f"advantages: shape {tuple(advantages.shape)}, expected ({len(rollouts)},)")
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
        with grouped_parameters(model, w) as stand_ins:
            if any(len(idx) for idx in active):
                batches = [completion_batch(rollouts, pad_id, idx) for (rollouts, _), idx in zip(work, active, strict=True)]
                rows = max(b.targets.shape[0] for b in batches)
                batch = _pad_batches(batches, pad_id)
                logp = completion_logprobs(model, batch, config.temperature)
                for k, ((rollouts, adv), idx) in enumerate(zip(work, active, strict=True)):
                    if len(idx):
                        lo, n = k * rows, len(idx)
                        losses[k], stats[k] = policy_loss(logp[lo:lo + n], batch.behaviour[lo:lo + n], adv[idx],
                                                          batch.mask[lo:lo + n], config,
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
