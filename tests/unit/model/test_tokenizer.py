"""The character tokenizer: round trips, loads through AutoTokenizer, completions cut at eos."""

from __future__ import annotations

from transformers import AutoTokenizer

from krill.model.tokenizer import ALPHABET, build_char_tokenizer, decode_completion, save_char_tokenizer
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
                assert decode_completion(tok, tok(answer, add_special_tokens=False)["input_ids"]) == answer
    assert tok.unk_token_id not in tok(ALPHABET)["input_ids"]


def test_special_tokens_are_distinct():
    tok = build_char_tokenizer()
    ids = {tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id}
    assert len(ids) == 4 and None not in ids


def test_decode_completion_cuts_at_first_eos():
    tok = build_char_tokenizer()
    body = tok("123", add_special_tokens=False)["input_ids"]
    eos, pad = tok.eos_token_id, tok.pad_token_id
    assert decode_completion(tok, body + [eos] + body + [pad]) == "123"
    assert decode_completion(tok, body) == "123"
    assert decode_completion(tok, [eos] + body) == ""
