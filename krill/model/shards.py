"""Splitting a model's parameters into contiguous shards, and shards to and from bytes.

Design decisions:
- Sharding works on the tensors stored in the model directory's safetensors files, not on
  `model.state_dict()`: what is sharded is exactly what a release writes back, and tied
  weights (stored once by `save_pretrained`) stay stored once.
- Shard s holds a contiguous block of transformer layers; layers are spread as evenly as
  possible (the first `L mod S` shards get one extra). Parameters outside the layer stack go
  to shard 0 when they are embeddings (name contains `embed`, `wte`, `wpe`) and to the last
  shard otherwise (final norm, LM head): the pipeline order of DESIGN §4.
- A layer's index is read from the parameter name (`...layers.7...`, `...h.7...`,
  `...blocks.7...`), which covers the common HF causal-LM families.
- Shard files are safetensors bytes (`safetensors.torch.save`), which are deterministic for the
  same tensors: the same weights give the same CID on every machine.

Public API:
    read_model_tensors(directory) -> dict[name, Tensor]
    layer_of(name) -> int | None
    plan_shards(names, num_layers, num_shards) -> list[list[str]]
    shard_to_bytes(tensors) -> bytes;  shard_from_bytes(data) -> dict[name, Tensor]
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from krill.errors import ModelError

_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")
_EMBED = re.compile(r"(embed|(?:^|\.)wte\.|(?:^|\.)wpe\.)")
WEIGHT_INDEX = "model.safetensors.index.json"


def read_model_tensors(directory: str | Path) -> dict:
    """All tensors of the safetensors weight files of an HF model directory."""
    from safetensors.torch import load_file

    directory = Path(directory)
    index = directory / WEIGHT_INDEX
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in directory.glob("*.safetensors"))
    if not files:
        raise ModelError(f"model directory: no safetensors weights in {directory}")
    tensors: dict = {}
    for name in files:
        for key, value in load_file(str(directory / name)).items():
            if key in tensors:
                raise ModelError(f"model directory: tensor {key!r} appears in two weight files")
            tensors[key] = value
    return tensors


def layer_of(name: str) -> int | None:
    """The transformer layer a parameter belongs to, or None outside the layer stack."""
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def _layer_blocks(num_layers: int, num_shards: int) -> list[range]:
    base, extra = divmod(num_layers, num_shards)
    blocks, start = [], 0
    for s in range(num_shards):
        size = base + (1 if s < extra else 0)
        blocks.append(range(start, start + size))
        start += size
    return blocks


def plan_shards(names: Iterable[str], num_layers: int, num_shards: int) -> list[list[str]]:
    """Parameter names of each of `num_shards` contiguous shards, in pipeline order."""
    names = list(names)
    if num_shards < 1:
        raise ModelError(f"num_shards: expected >= 1, got {num_shards}")
    if num_layers < num_shards:
        raise ModelError(f"num_shards: {num_shards} shards need at least as many layers, model has {num_layers}")
    blocks = _layer_blocks(num_layers, num_shards)
    shard_of_layer = {layer: s for s, block in enumerate(blocks) for layer in block}
    plan: list[list[tuple]] = [[] for _ in range(num_shards)]
    for name in names:
        layer = layer_of(name)
        if layer is None:
            first = bool(_EMBED.search(name))
            shard = 0 if first else num_shards - 1
            key = (-1 if first else num_layers, name)
        elif layer in shard_of_layer:
            shard, key = shard_of_layer[layer], (layer, name)
        else:
            raise ModelError(f"parameter {name!r}: layer {layer} outside the model's {num_layers} layers")
        plan[shard].append((key, name))
    return [[name for _, name in sorted(items)] for items in plan]


def num_layers_of(config: dict, names: Iterable[str]) -> int:
    """Layer count from the HF config (`num_hidden_layers` / `n_layer`), else from the names."""
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        if isinstance(config.get(key), int):
            return config[key]
    layers = [layer_of(n) for n in names]
    found = [x for x in layers if x is not None]
    if not found:
        raise ModelError("config: no layer count (num_hidden_layers) and no layer-indexed parameters")
    return max(found) + 1


def shard_to_bytes(tensors: dict) -> bytes:
    """A safetensors file holding `tensors` (made contiguous), as bytes."""
    from safetensors.torch import save

    return save({k: v.contiguous() for k, v in tensors.items()})


def shard_from_bytes(data: bytes) -> dict:
    """The tensors of a safetensors file given as bytes."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        return load(data)
    except (SafetensorError, ValueError) as exc:
        raise ModelError(f"shard: not a valid safetensors file ({exc})") from exc
