"""Tiny random Llama models for the RL unit tests (built in milliseconds, seeded).

Imported by the test modules beside it (pytest puts this folder on sys.path)."""

from __future__ import annotations

import torch

VOCAB, EOS, PAD, BOS = 16, 1, 0, 2


def tiny_llama(seed: int = 0, layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=4, intermediate_size=64, max_position_embeddings=64,
                      eos_token_id=EOS, pad_token_id=PAD, bos_token_id=BOS, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def two_shards(model) -> dict[int, list[str]]:
    """Shard 0: embeddings + first layer; shard 1: the rest (contiguous, as the manifest splits)."""
    names = [n for n, _ in model.named_parameters()]
    first = [n for n in names if n.startswith("model.embed_tokens") or n.startswith("model.layers.0.")]
    return {0: first, 1: [n for n in names if n not in first]}
