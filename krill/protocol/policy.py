"""Runnable policies for a published version: an HF causal LM and its tokenizer, from the store.

Design decisions:
- The model is built from the manifest's architecture config (`transformers` config class by
  `model_type`) and loaded with the version's tensors, so only the store is consulted, never a
  hub or a local checkpoint. The tokenizer comes from the manifest's tokenizer bundle.
- Tokenizers are cached per bundle CID (they never change within a run); models are not cached
  here, callers keep the ones they need (a worker: behaviour + learner; a verifier: both of the
  commit it replays).
"""

from __future__ import annotations

import tempfile
from functools import lru_cache
from pathlib import Path

import torch

from krill.protocol.state import VersionState


@lru_cache(maxsize=8)
def _tokenizer_from_bundle(bundle: bytes):
    from transformers import PreTrainedTokenizerFast

    from krill.model.publish import unbundle_files

    with tempfile.TemporaryDirectory(prefix="krill-tok-") as tmp:
        for name, data in unbundle_files(bundle).items():
            (Path(tmp) / name).write_bytes(data)
        return PreTrainedTokenizerFast.from_pretrained(tmp, local_files_only=True)


def load_tokenizer(state: VersionState):
    """The run's tokenizer (from the manifest's bundle, checked against its CID)."""
    from krill.errors import ModelError
    from krill.store.cid import file_cid

    bundle = state.store.get(state.manifest.tokenizer)
    if file_cid(bundle) != state.manifest.tokenizer:
        raise ModelError(f"tokenizer bundle {state.manifest.tokenizer} does not hash to its CID")
    return _tokenizer_from_bundle(bundle)


def build_model(state: VersionState) -> torch.nn.Module:
    """An eval-mode float32 model holding `state`'s weights."""
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    arch = dict(state.manifest.architecture)
    config = CONFIG_MAPPING[arch["model_type"]].from_dict(arch)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    load_weights(model, state)
    return model.eval()


def load_weights(model: torch.nn.Module, state: VersionState) -> None:
    """Replace `model`'s weights by `state`'s (strict: every manifest tensor, nothing else)."""
    from krill.errors import ModelError

    tensors = state.all_tensors()
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = {n for n in missing if n.endswith("lm_head.weight") and getattr(model.config, "tie_word_embeddings", False)}
    if unexpected or set(missing) - tied:
        raise ModelError(f"version {state.version}: tensors do not fit the model "
                         f"(missing {sorted(set(missing) - tied)[:3]}, unexpected {unexpected[:3]})")
