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
- A run's tokenizer arrives as files from its manifest's bundle (untrusted: the publisher is only
  partly trusted). `tokenizer_from_files` loads them as a fast tokenizer and turns whatever the
  tokenizers / transformers libraries raise on bad files (a `JSONDecodeError` for a tokenizer.json
  that is not JSON, a `ValueError` for a bundle without one) into a `ModelError`, and refuses a
  tokenizer without eos and pad tokens inside its vocabulary, which every role samples and pads
  with (a tokenizer_config.json without `eos_token` loaded with eos None).
- `decode_completion` is the one decode that rewards and evaluation score (workers, verifiers, the
  coordinator, `krill eval`, the TRL bench). It checks token ids, not text: a completion has an
  answer only if it emits eos with no other special token before it. Decoding with special tokens
  skipped would turn `1<bos>34` (no eos) into `134`, a correct answer, and RL would then pay the
  policy for never ending its answers.

Public API:
    ALPHABET                                   the ordinary characters, in id order
    build_char_tokenizer() -> PreTrainedTokenizerFast
    save_char_tokenizer(directory) -> None
    tokenizer_from_files(files: {name: bytes}) -> PreTrainedTokenizerFast     ModelError if unusable
    decode_completion(tokenizer, ids) -> str   the answer before eos, "" if it has none to score
    decode_completions(tokenizer, completions) -> list[str]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from krill.errors import ModelError

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


def tokenizer_from_files(files: Mapping[str, bytes]):
    """A fast tokenizer from the files of a bundle (tokenizer.json and its config files), checked to have
    eos and pad tokens in its vocabulary; `ModelError` naming the fault otherwise."""
    import tempfile

    from transformers import PreTrainedTokenizerFast

    if "tokenizer.json" not in files:
        raise ModelError("tokenizer: the bundle has no tokenizer.json")
    with tempfile.TemporaryDirectory(prefix="krill-tok-") as tmp:
        for name, data in files.items():
            (Path(tmp) / Path(name).name).write_bytes(data)
        try:
            tokenizer = PreTrainedTokenizerFast.from_pretrained(tmp, local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - the libraries raise many types for files they cannot read
            raise ModelError(f"tokenizer: the bundle's files do not load ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from None
    size = len(tokenizer)
    for role in ("eos", "pad"):
        token_id = getattr(tokenizer, f"{role}_token_id")
        if not isinstance(token_id, int) or not 0 <= token_id < size:
            raise ModelError(f"tokenizer: no {role} token in its vocabulary of {size} (id {token_id})")
    return tokenizer


def decode_completion(tokenizer, ids: Sequence[int]) -> str:
    """The answer text of a completion, or "" when the completion has no answer to score.

    The answer is the text of the tokens before the first eos; tokens after that eos are not part
    of the completion (an engine stops sampling there, batched generation pads). A completion with
    no eos, or with any other special token (`<bos>`, `<pad>`, `<unk>`, any token the tokenizer
    marks special) before its eos, has no answer and decodes to "", which every task scores 0
    (no well-formed answer is empty), so such a completion always fails.
    """
    return tokenizer.decode(_answer_ids(ids, tokenizer.eos_token_id, _special_ids(tokenizer)),
                            skip_special_tokens=False)


def decode_completions(tokenizer, completions: Sequence[Sequence[int]]) -> list[str]:
    """`decode_completion` of each of `completions`, decoded in one batched call."""
    eos, special = tokenizer.eos_token_id, _special_ids(tokenizer)
    answers = [_answer_ids(ids, eos, special) for ids in completions]
    return tokenizer.batch_decode(answers, skip_special_tokens=False) if answers else []


def _special_ids(tokenizer) -> set[int]:
    """Every special token id: the named ones and any added token flagged special."""
    added = getattr(tokenizer, "added_tokens_decoder", {})
    return set(tokenizer.all_special_ids) | {int(i) for i, token in added.items() if token.special}


def _answer_ids(ids: Sequence[int], eos: int | None, special: set[int]) -> list[int]:
    """The ids before the first `eos`; none when there is no eos or a special token comes before it."""
    ids = [int(i) for i in ids]
    if eos is None or eos not in ids:
        return []
    answer = ids[: ids.index(eos)]
    return [] if special.intersection(answer) else answer
