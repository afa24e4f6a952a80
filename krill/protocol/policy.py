"""Runnable policies for a published version: an HF causal LM and its tokenizer, from the store.

Design decisions:
- The model is built from the manifest's architecture config (`transformers` config class by
  `model_type`) and loaded with the version's tensors, so only the store is consulted, never a
  hub or a local checkpoint. The tokenizer comes from the manifest's tokenizer bundle.
- Both are untrusted input (the coordinator is partly trusted): the architecture is checked against
  the manifest's tensors before anything is allocated (`krill.model.architecture.build_model`), the
  tokenizer bundle is read at most `MAX_TOKENIZER_BYTES` and must load with eos and pad tokens
  (`krill.model.tokenizer.tokenizer_from_files`); every fault is a `ModelError`, which the roles
  treat as a broken version. Building straight from the config let `vocab_size` 2**40 reach the
  allocator (a bare RuntimeError), and a tokenizer.json that is not JSON a bare JSONDecodeError.
- Tokenizers are cached per bundle CID (they never change within a run); models are not cached
  here, callers keep the ones they need (a worker: behaviour + learner; a verifier: both of the
  commit it replays).
"""

from __future__ import annotations

from functools import lru_cache

import torch

from krill.protocol.state import VersionState

MAX_TOKENIZER_BYTES = 64 * 1024 * 1024
"""Largest tokenizer bundle read (a large BPE vocabulary's tokenizer.json is about 10 MB)."""


@lru_cache(maxsize=8)
def _tokenizer_from_bundle(bundle: bytes):
    from krill.model.publish import unbundle_files
    from krill.model.tokenizer import tokenizer_from_files

    return tokenizer_from_files(unbundle_files(bundle))


def load_tokenizer(state: VersionState):
    """The run's tokenizer (from the manifest's bundle, checked against its CID)."""
    from krill.errors import ModelError
    from krill.store.base import ObjectTooLargeError
    from krill.store.cid import file_cid

    try:
        bundle = state.store.get(state.manifest.tokenizer, max_bytes=MAX_TOKENIZER_BYTES)
    except ObjectTooLargeError:
        raise ModelError(f"tokenizer bundle {state.manifest.tokenizer} is larger than "
                         f"{MAX_TOKENIZER_BYTES} bytes") from None
    if file_cid(bundle) != state.manifest.tokenizer:
        raise ModelError(f"tokenizer bundle {state.manifest.tokenizer} does not hash to its CID")
    return _tokenizer_from_bundle(bundle)


def build_model(state: VersionState) -> torch.nn.Module:
    """An eval-mode float32 model holding `state`'s weights (its architecture checked first)."""
    from krill.model.architecture import build_model as build_checked

    model = build_checked(state.manifest, dtype=torch.float32)
    load_weights(model, state)
    return model.eval()


def load_weights(model: torch.nn.Module, state: VersionState) -> None:
    """Replace `model`'s weights by `state`'s (strict: every manifest tensor, nothing else)."""
    from krill.errors import ModelError

    tensors = state.all_tensors()
    try:
        missing, unexpected = model.load_state_dict(tensors, strict=False)
    except RuntimeError as exc:  # a shape that differs from the model's: torch's size mismatch
        raise ModelError(f"version {state.version}: tensors do not fit the model "
                         f"({str(exc).splitlines()[-1].strip()[:200]})") from None
    tied = {n for n in missing if n.endswith("lm_head.weight") and getattr(model.config, "tie_word_embeddings", False)}
    if unexpected or set(missing) - tied:
        raise ModelError(f"version {state.version}: tensors do not fit the model "
                         f"(missing {sorted(set(missing) - tied)[:3]}, unexpected {unexpected[:3]})")
