"""The default character tokenizer, built locally with the `tokenizers` library.

Design decisions:
- One token per character over a fixed alphabet (digits, arithmetic operators, '=', a few
  separators) plus `<pad>`, `<bos>`, `<eos>`. Task prompts and answers are short strings over
  this alphabet, so a character vocabulary keeps the model tiny and every answer digit a token.
- It is saved as a plain Hugging Face fast tokenizer (`tokenizer.json` + config files), so
  `AutoTokenizer.from_pretrained(dir, local_files_only=True)` loads it like any other; nothing
  in Krill depends on it being this tokenizer.
- Encoding a text adds `<bos>` in front (a template post-processor); `<eos>` is never added by the
  tokenizer: the model learns to emit it after an answer, and `decode_completion` cuts there.
- Characters outside the alphabet map to `<unk>`, which no task ever produces.

Public API:
    ALPHABET                                   the ordinary characters, in id order
    build_char_tokenizer() -> PreTrainedTokenizerFast
    save_char_tokenizer(directory) -> None
    decode_completion(tokenizer, ids) -> str   completion text up to the first eos
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
ALPHABET = "0123456789+-*/=(),:;>?"


def _vocab() -> dict[str, int]:
    tokens = list(SPECIAL_TOKENS) + list(ALPHABET)
    return {tok: i for i, tok in enumerate(tokens)}


def build_char_tokenizer():
    """A fast tokenizer over `ALPHABET` with `<pad>`, `<bos>`, `<eos>` and `<unk>`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = _vocab()
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
        model_max_length=512, padding_side="left", clean_up_tokenization_spaces=False)


def save_char_tokenizer(directory: str | Path) -> None:
    """Write the default tokenizer into `directory` (created if missing)."""
    build_char_tokenizer().save_pretrained(str(directory))


def decode_completion(tokenizer, ids: Sequence[int]) -> str:
    """The text of a completion: tokens before the first eos, special tokens dropped.

    A completion that never emits eos keeps all its tokens, so it can only match a task's
    answer if that answer is as long as the whole generation budget; tasks size their
    `max_new_tokens` one longer than the longest answer so that such a completion always fails.
    """
    return tokenizer.decode(_before_eos(ids, tokenizer.eos_token_id), skip_special_tokens=True)


def decode_completions(tokenizer, completions: Sequence[Sequence[int]]) -> list[str]:
    """`decode_completion` of each of `completions`, decoded in one batched call."""
    cut = [_before_eos(ids, tokenizer.eos_token_id) for ids in completions]
    return tokenizer.batch_decode(cut, skip_special_tokens=True) if cut else []


def _before_eos(ids: Sequence[int], eos: int) -> list[int]:
    """The token ids before the first `eos` (all of them when there is none)."""
    ids = [int(i) for i in ids]
    return ids[: ids.index(eos)] if eos in ids else ids
