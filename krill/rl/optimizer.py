"""Per-shard AdamW over a dict of named tensors, with state as bytes.

Design decisions:
- The coordinator owns one optimizer per shard it serves; there is no `nn.Module`, only the
  shard's named tensors, so the optimizer is a few explicit lines (decoupled weight decay,
  bias-corrected moments, optional clipping of the shard's global gradient norm) rather than a
  wrapped `torch.optim.AdamW` whose state layout is keyed by parameter objects.
- Deterministic: names are processed in sorted order with fixed float32 ops on CPU, so a
  version recomputed from its parent, the aggregate and this state is bit-identical, on any CPU.
  Every product is rounded on its own (`m * b1 + g * (1 - b1)`, never `add_(g, alpha=)` or
  `addcmul_`/`addcdiv_`): torch's AVX2/AVX-512 kernels fuse those into multiply-adds and its generic
  kernel does not, so the weights, the state and `update_norm` differed in the last bits between
  the coordinator's machine and an auditor's (`krill audit` then failed honest versions). The state
  format is `krill-adamw/2` since then; a `/1` state (the fused arithmetic) is refused by name.
- The gradient norm (it sets the clip scale, so the weights' bits) is summed by `reductions`: the
  fixed tree of `krill.rl.fixed_sum` (each tensor by the tree, the tensors in sorted order; the same
  bits on every CPU) or torch's `sum` (runs published before the option; its order depends on the
  CPU's vector width). The fold passes the run's rule's field; it is not part of the state.
- `state_bytes()` / `load_state_bytes()` serialise moments and the step counter with
  safetensors (the config is in the metadata and checked on load), so a coordinator restart or
  an auditor resumes exactly.
"""

from __future__ import annotations

import json

import torch
from pydantic import BaseModel, ConfigDict, Field
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from krill.errors import KrillError, PayloadError
from krill.payload.canonical import loads_bounded
from krill.rl import fixed_sum
from krill.rl.fixed_sum import Reductions

STATE_FORMAT = "krill-adamw/2"


class OptimizerError(KrillError, ValueError):
    """Gradients or saved state that do not fit the shard's parameters."""


class AdamWConfig(BaseModel):
    """Hyper-parameters of the per-shard AdamW."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lr: float = Field(1e-4, gt=0.0, le=1.0, description="Learning rate.")
    beta1: float = Field(0.9, ge=0.0, lt=1.0, description="First-moment decay.")
    beta2: float = Field(0.999, ge=0.0, lt=1.0, description="Second-moment decay.")
    eps: float = Field(1e-8, gt=0.0, le=1.0, description="Denominator epsilon.")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="Decoupled weight decay.")
    max_grad_norm: float | None = Field(1.0, gt=0.0, description="Clip the shard's gradient norm to this (None: off).")


class ShardAdamW:
    """AdamW over named float tensors, updated in place."""

    def __init__(self, params: dict[str, torch.Tensor], config: AdamWConfig, reductions: Reductions = "torch"):
        self.params = params
        self.config = config
        self.reductions = reductions
        self.step_count = 0
        self.exp_avg = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in params.items()}
        self.exp_avg_sq = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in params.items()}

    @torch.no_grad()
    def step(self, grads: dict[str, torch.Tensor]) -> float:
        """Apply one update; returns the gradient norm before clipping."""
        names = sorted(self.params)
        if set(grads) != set(names):
            raise OptimizerError(f"gradient names differ from the shard's: {sorted(set(grads) ^ set(names))[:3]}")
        for n in names:
            if grads[n].shape != self.params[n].shape:
                raise OptimizerError(f"{n}: gradient shape {tuple(grads[n].shape)} != {tuple(self.params[n].shape)}")
        if self.reductions == "fixed-tree":
            norm = fixed_sum.norm_of(grads[n] for n in names)
        else:
            sq = torch.zeros((), dtype=torch.float64)
            for n in names:
                sq = sq + grads[n].to(torch.float64).pow(2).sum()
            norm = float(sq.sqrt())
        c = self.config
        scale = 1.0
        if c.max_grad_norm is not None and norm > c.max_grad_norm:
            scale = c.max_grad_norm / norm
        self.step_count += 1
        bias1 = 1.0 - c.beta1 ** self.step_count
        bias2 = 1.0 - c.beta2 ** self.step_count
        for n in names:
            p = self.params[n]
            g = grads[n].to(torch.float32) * scale
            m, v = self.exp_avg[n], self.exp_avg_sq[n]
            m.mul_(c.beta1).add_(g * (1.0 - c.beta1))  # each product rounded on its own: see the module docstring
            v.mul_(c.beta2).add_(g * g * (1.0 - c.beta2))
            if c.weight_decay:
                p.mul_(1.0 - c.lr * c.weight_decay)
            denom = (v / bias2).sqrt_().add_(c.eps)
            p.sub_(m / denom * (c.lr / bias1))
        return norm

    def momentum(self) -> dict[str, torch.Tensor]:
        return self.exp_avg

    def state_bytes(self) -> bytes:
        tensors = {f"m/{n}": t.contiguous() for n, t in self.exp_avg.items()}
        tensors.update({f"v/{n}": t.contiguous() for n, t in self.exp_avg_sq.items()})
        # One metadata key: safetensors writes a metadata map in hash order, and the blob is
        # content-addressed, so its bytes must not vary between runs.
        meta = {"format": STATE_FORMAT, "step": str(self.step_count), "config": self.config.model_dump_json()}
        return st_save(tensors, metadata={_META_KEY: json.dumps(meta, sort_keys=True)})

    def load_state_bytes(self, blob: bytes) -> None:
        """Restore moments and step count from `save_state_bytes` output; OptimizerError naming what is wrong."""
        from safetensors import SafetensorError

        try:
            tensors = st_load(blob)
        except (SafetensorError, ValueError) as exc:
            raise OptimizerError(f"optimizer state: not a valid safetensors file ({exc})") from exc
        meta = _metadata(blob)
        if meta.get("format") == "krill-adamw/1":
            raise OptimizerError("optimizer state: krill-adamw/1, made by an older Krill whose AdamW arithmetic (fused "
                                 "multiply-adds) differs in the last bits: finish that run with the build that "
                                 "started it")
        if meta.get("format") != STATE_FORMAT:
            raise OptimizerError(f"optimizer state: not a {STATE_FORMAT} blob")
        try:
            config = AdamWConfig.model_validate_json(meta["config"])
        except (KeyError, ValueError) as exc:
            raise OptimizerError(f"optimizer state: its AdamW config is unreadable ({str(exc)[:200]})") from None
        if config != self.config:
            raise OptimizerError("optimizer state: saved with a different AdamW config")
        names = set(self.params)
        if set(tensors) != {f"{moment}/{n}" for n in names for moment in ("m", "v")}:
            raise OptimizerError("optimizer state: parameter names differ from the shard's")
        try:
            step = int(meta["step"])
        except (KeyError, TypeError, ValueError):
            raise OptimizerError(f"optimizer state: step {str(meta.get('step'))[:40]!r} is not an integer") from None
        for key in sorted(tensors):  # every shape first: a refused blob changes nothing
            if tensors[key].shape != self.params[key[2:]].shape:
                raise OptimizerError(f"optimizer state: {key} has shape {tuple(tensors[key].shape)}")
        for n in names:
            self.exp_avg[n] = tensors[f"m/{n}"].to(torch.float32).clone()
            self.exp_avg_sq[n] = tensors[f"v/{n}"].to(torch.float32).clone()
        self.step_count = step


_META_KEY = "krill-adamw"


def _metadata(blob: bytes) -> dict[str, str]:
    """Our metadata of a state blob (safetensors header: 8-byte little-endian length, then JSON)."""
    try:
        size = int.from_bytes(blob[:8], "little")
        header = loads_bounded(blob[8:8 + size], 4, "optimizer state")
        meta = loads_bounded(header.get("__metadata__", {}).get(_META_KEY, "{}"), 4, "optimizer state")
    except (PayloadError, ValueError, AttributeError, TypeError):
        raise OptimizerError("optimizer state: unreadable metadata") from None
    return meta if isinstance(meta, dict) else {}
