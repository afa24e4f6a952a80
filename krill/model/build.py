"""Tiny Llama-architecture models built from a config, with the default character tokenizer.

Design decisions:
- The default base model is small enough to train and sample on two CPU cores (about 1M
  parameters: hidden 128, 4 layers, 4 heads, MLP 512, untied embeddings, SDPA attention) yet a
  real `LlamaForCausalLM`, so everything downstream works on any HF causal LM.
- Initialisation is seeded (`torch.manual_seed` around construction) so a build is a function
  of its recipe; the same recipe on the same machine gives the same bytes.
- `build_tiny_model` is also what tests use: a random model in milliseconds.

Public API:
    TinyModelSpec (hidden, layers, heads, intermediate, max_positions)
    build_tiny_model(seed=0, spec=TinyModelSpec(), directory=None) -> (model, tokenizer)
    save_model(model, tokenizer, directory) -> Path
    load_model(directory) -> (model, tokenizer)          local files only, never a hub
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from krill.errors import ModelError
from krill.model.tokenizer import build_char_tokenizer


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of a tiny Llama model."""

    hidden: int = 128
    layers: int = 4
    heads: int = 4
    intermediate: int = 512
    max_positions: int = 64

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _llama_config(spec: TinyModelSpec, tokenizer):
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=spec.hidden, num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads, num_key_value_heads=spec.heads,
        intermediate_size=spec.intermediate, max_position_embeddings=spec.max_positions,
        tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.02)
    config._attn_implementation = "sdpa"
    return config


def build_tiny_model(seed: int = 0, spec: TinyModelSpec = TinyModelSpec(), directory: str | Path | None = None):
    """A randomly initialised tiny Llama and its tokenizer; saved to `directory` when given."""
    import torch
    from transformers import LlamaForCausalLM

    tokenizer = build_char_tokenizer()
    config = _llama_config(spec, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.eval()
    if directory is not None:
        save_model(model, tokenizer, directory)
    return model, tokenizer


def save_model(model, tokenizer, directory: str | Path) -> Path:
    """Write `model` (safetensors) and `tokenizer` as a plain HF directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory), safe_serialization=True)
    tokenizer.save_pretrained(str(directory))
    return directory


def load_model(directory: str | Path, dtype=None):
    """Load a local HF causal LM directory and its tokenizer, never touching a hub."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise ModelError(f"model directory: {directory} has no config.json; build one with `krill model init`")
    kwargs = {"local_files_only": True}
    if dtype is not None:
        kwargs["dtype"] = dtype
    model = AutoModelForCausalLM.from_pretrained(str(directory), **kwargs)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    return model, tokenizer
