"""The character tokenizer: round trips, loads through AutoTokenizer, completions cut at eos, no other special."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from krill.model.tokenizer import (
    ALPHABET,
    build_char_tokenizer,
    decode_completion,
    decode_completions,
    save_char_tokenizer,
)
from krill.rl.tasks import TASKS, get_task


def test_round_trip_every_task_prompt_and_answer(tmp_path):
    save_char_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    for name, cls in TASKS.items():
        for level in cls.levels:
            task = get_task(name, level)
            for i in range(20):
                text, meta = task.prompt(i)
                ids = tok(text)["input_ids"]
                assert ids[0] == tok.bos_token_id and len(ids) == len(text) + 1
                assert tok.decode(ids, skip_special_tokens=True) == text
                answer = task.reference(meta)
                body = tok(answer, add_special_tokens=False)["input_ids"]
                assert decode_completion(tok, body + [tok.eos_token_id]) == answer
    assert tok.unk_token_id not in tok(ALPHABET)["input_ids"]


def test_special_tokens_are_distinct():
    tok = build_char_tokenizer()
    ids = {tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id}
    assert len(ids) == 4 and None not in ids


def test_decode_completion_cuts_at_first_eos():
    tok = build_char_tokenizer()
    body = tok("123", add_special_tokens=False)["input_ids"]
    eos, pad = tok.eos_token_id, tok.pad_token_id
    assert decode_completion(tok, body + [eos]) == "123"
    assert decode_completion(tok, body + [eos] + body + [pad]) == "123"  # what follows eos is not the completion
    assert decode_completion(tok, body + [eos, eos, pad, pad]) == "123"  # batched generation pads after eos
    assert decode_completion(tok, [eos] + body) == ""
    assert decode_completion(tok, body[:2] + [eos] + body[2:]) == "12"


@pytest.mark.parametrize("special", ["<bos>", "<pad>", "<unk>"])
@pytest.mark.parametrize("at", [0, 1, 3])
@pytest.mark.parametrize("with_eos", [True, False])
def test_a_special_token_before_eos_leaves_no_answer(special, at, with_eos):
    tok = build_char_tokenizer()
    body = tok("123", add_special_tokens=False)["input_ids"]
    ids = body[:at] + [tok.convert_tokens_to_ids(special)] + body[at:] + ([tok.eos_token_id] if with_eos else [])
    assert decode_completion(tok, ids) == ""
    assert decode_completions(tok, [ids, body + [tok.eos_token_id]]) == ["", "123"]


def test_a_completion_without_eos_has_no_answer():
    tok = build_char_tokenizer()
    body = tok("123", add_special_tokens=False)["input_ids"]
    assert decode_completion(tok, body) == ""
    assert decode_completion(tok, []) == ""
    assert decode_completions(tok, [body, [], body + [tok.eos_token_id]]) == ["", "", "123"]
    assert decode_completions(tok, []) == []


def test_any_token_the_tokenizer_marks_special_leaves_no_answer():
    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<tool>"]})
    tok.add_tokens(["<plain>"])
    body = tok("123", add_special_tokens=False)["input_ids"]
    eos = tok.eos_token_id
    assert decode_completion(tok, body[:1] + tok.convert_tokens_to_ids(["<tool>"]) + body[1:] + [eos]) == ""
    assert decode_completion(tok, body[:1] + tok.convert_tokens_to_ids(["<plain>"]) + body[1:] + [eos]) == "1<plain>23"


def _bundle_files(tmp_path):
    from krill.model.tokenizer import save_char_tokenizer

    save_char_tokenizer(tmp_path / "tok")
    return {p.name: p.read_bytes() for p in (tmp_path / "tok").iterdir()}


def test_tokenizer_from_honest_files(tmp_path):
    from krill.model.tokenizer import build_char_tokenizer, tokenizer_from_files

    tok = tokenizer_from_files(_bundle_files(tmp_path))
    ref = build_char_tokenizer()
    assert tok("12+3=")["input_ids"] == ref("12+3=")["input_ids"] and tok.eos_token_id == ref.eos_token_id


@pytest.mark.parametrize(("change", "match"), [
    (lambda f: f | {"tokenizer.json": b"not json"}, "do not load \\(JSONDecodeError"),
    (lambda f: {k: v for k, v in f.items() if k != "tokenizer.json"}, "no tokenizer.json"),
    (lambda f: f | {"tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "nope"}}).encode()}, "do not load"),
    (lambda f: f | {"tokenizer_config.json": json.dumps(
        {k: v for k, v in json.loads(f["tokenizer_config.json"]).items() if k != "eos_token"}).encode()},
     "no eos token"),
])
def test_hostile_tokenizer_files_are_a_model_error(tmp_path, change, match):
    """A bundle's files that do not load were a bare JSONDecodeError / ValueError, and one without eos loaded
    with eos None; every role loads the run's tokenizer from the publisher's bundle."""
    from krill.errors import ModelError
    from krill.model.tokenizer import tokenizer_from_files

    with pytest.raises(ModelError, match=match):
        tokenizer_from_files(change(_bundle_files(tmp_path)))
