"""A manifest's architecture checked against its tensors before any model is built from it.

Design decisions:
- A manifest's `architecture` is the HF config of a published version: untrusted input (the
  coordinator that publishes a version is only partly trusted). Building a model straight from it
  allocates whatever the config says before a single weight is compared: `vocab_size` 2**40 in an
  otherwise honest manifest made the allocator raise a bare `RuntimeError` (a 128 TiB embedding),
  a few million allocated gigabytes first, and a missing or unknown `model_type` was a `KeyError`;
  none is a `KrillError`, so a role could neither mark the version broken nor go on.
- So the model is built first on the `meta` device (shapes, no memory) and its state dict compared
  with the manifest's parameters: every name, every shape, nothing more and nothing less (a weight
  tied to the input embeddings, `lm_head.weight` with `tie_word_embeddings`, may be left out, as
  `save_pretrained` leaves it out). Only then is it allocated, and then it holds exactly the
  tensors the manifest names, which the shard fetch has checked against their digests.
- Buffers outside the state dict (rotary tables, attention masks) are allocated too and are not in
  the manifest: their elements may be at most `MAX_EXTRA_BUFFER_ELEMENTS` or the weights' count,
  whichever is larger.
- Construction time grows with the number of modules, which no shape check sees: a layer count
  (`LAYER_COUNT_KEYS`) may not exceed the manifest's distinct layer indices (its tensor count when
  no name carries a layer index), and an expert count (`EXPERT_COUNT_KEYS`) the manifest's tensor
  count or the leading dimension of a tensor of stacked experts (`...experts.<name>`, one tensor
  for all of a layer's experts), whichever is larger, so an absurd count is refused before anything
  is built. Experts are not bounded by layers: an honest mixture of experts has more experts than
  layers (OLMoE 64 in 16, a tiny test model 4 in 2).
- Every failure is a `ModelError` naming the key or tensor at fault; transformers' own exceptions
  while reading the config or building on `meta` become one too.

Public API:
    model_config(manifest) -> PretrainedConfig      the config, with its counts bounded
    check_architecture(manifest) -> PretrainedConfig  config and tensors agree (built on meta)
    build_model(manifest, dtype=torch.float32) -> nn.Module   checked, then allocated (weights unset)
    LAYER_COUNT_KEYS, EXPERT_COUNT_KEYS, MAX_EXTRA_BUFFER_ELEMENTS
"""

from __future__ import annotations

from typing import Any

from krill.errors import ModelError
from krill.model.manifest import Manifest
from krill.model.shards import layer_of

LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
MAX_EXTRA_BUFFER_ELEMENTS = 1 << 24


def _tied(config: Any) -> set[str]:
    return {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()


def model_config(manifest: Manifest):
    """The HF config of `manifest.architecture`; ModelError for an unknown `model_type`, a layer or expert
    count above what the manifest's tensors can hold, or a config transformers refuses."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    arch = manifest.architecture
    model_type = arch.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ModelError(f"architecture.model_type: {str(model_type)[:64]!r} is not a model type transformers knows")
    params = [p for s in manifest.shards for p in s.parameters]
    indices = {layer_of(p.name) for p in params} - {None}
    layers = len(indices) if indices else len(params)
    stacked = [p.shape[0] for p in params if ".experts." in f".{p.name}" and len(p.shape) == 3]
    experts = max([len(params), *stacked])
    for keys, bound in ((LAYER_COUNT_KEYS, layers), (EXPERT_COUNT_KEYS, experts)):
        for key in keys:
            value = arch.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > bound:
                raise ModelError(f"architecture.{key}: {value} is more than the manifest's tensors hold ({bound})")
    try:
        return CONFIG_MAPPING[model_type].from_dict(dict(arch))
    except Exception as exc:  # noqa: BLE001 - transformers raises many types for a config it refuses
        raise ModelError(f"architecture: not a valid {model_type} config ({type(exc).__name__}: "
                         f"{str(exc)[:200]})") from None


def check_architecture(manifest: Manifest):
    """`model_config(manifest)`, after checking that the model it builds (on `meta`) has exactly the
    manifest's tensors and names few extra buffers; ModelError naming the first difference."""
    import torch
    from transformers import AutoModelForCausalLM

    config = model_config(manifest)
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    except Exception as exc:  # noqa: BLE001 - any failure to build from an untrusted config
        raise ModelError(f"architecture: transformers cannot build a causal LM from it ({type(exc).__name__}: "
                         f"{str(exc)[:200]})") from None
    state = model.state_dict()
    want = {p.name: list(p.shape) for s in manifest.shards for p in s.parameters}
    for name, tensor in state.items():
        if name not in want and name not in _tied(config):
            raise ModelError(f"architecture: the model has a tensor {name!r} that the manifest does not list")
        if name in want and list(tensor.shape) != want[name]:
            raise ModelError(f"architecture: tensor {name!r} has shape {list(tensor.shape)} in the model, "
                             f"{want[name]} in the manifest")
    extra = sorted(set(want) - set(state))
    if extra:
        raise ModelError(f"architecture: the manifest lists tensors the model does not have ({extra[:3]})")
    weights = sum(t.numel() for t in state.values())
    in_state = {id(t) for t in state.values()}
    buffers = sum(b.numel() for b in model.buffers() if id(b) not in in_state)
    if buffers > max(weights, MAX_EXTRA_BUFFER_ELEMENTS):
        raise ModelError(f"architecture: the model's buffers hold {buffers} values besides its {weights} weights")
    return config


def build_model(manifest: Manifest, dtype=None):
    """An eval-mode model of `manifest`'s architecture in `dtype` (float32 by default), checked by
    `check_architecture` before anything is allocated; its weights are the initialiser's, not the version's."""
    import torch
    from transformers import AutoModelForCausalLM

    config = check_architecture(manifest)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32)
    return model.eval()
