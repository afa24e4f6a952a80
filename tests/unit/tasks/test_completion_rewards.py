"""Rewards on sampled token ids: only an answer closed by eos, with no other special token, scores."""

from __future__ import annotations

import pytest

from krill.model.tokenizer import build_char_tokenizer, decode_completion, decode_completions
from krill.rl.tasks import TASKS, get_task

ALL_LEVELS = [(name, level) for name, cls in TASKS.items() for level in cls.levels]
TOK = build_char_tokenizer()
EOS, PAD = TOK.eos_token_id, TOK.pad_token_id
OTHER_SPECIALS = [TOK.bos_token_id, TOK.pad_token_id, TOK.unk_token_id]


def ids_of(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


def score(task, meta, ids) -> float:
    return task.reward(meta, decode_completion(TOK, ids))


def test_the_reported_case_scores_zero():
    task = get_task("arithmetic", 1)
    meta = {"operands": [35, 99], "ops": "+"}
    assert task._render(meta) == "35+99=" and task.reference(meta) == "134" and task.max_new_tokens == 4
    body = ids_of("134")
    assert score(task, meta, body + [EOS]) == 1.0
    for special in OTHER_SPECIALS:
        for at in range(len(body) + 1):
            padded = body[:at] + [special] + body[at:]
            assert len(padded) == task.max_new_tokens  # fills the budget, no eos
            assert score(task, meta, padded) == 0.0
            assert score(task, meta, padded + [EOS]) == 0.0


@pytest.mark.parametrize(("name", "level"), ALL_LEVELS)
def test_a_correct_answer_scores_only_when_closed_by_eos_and_free_of_specials(name, level):
    task = get_task(name, level)
    for i in range(50):
        _, meta = task.prompt(i)
        body = ids_of(task.reference(meta))
        assert score(task, meta, body + [EOS]) == 1.0
        assert score(task, meta, body + [EOS, PAD, PAD]) == 1.0  # padding after eos (batched generation)
        assert score(task, meta, body) == 0.0
        at = i % (len(body) + 1)
        special = OTHER_SPECIALS[i % len(OTHER_SPECIALS)]
        assert score(task, meta, body[:at] + [special] + body[at:]) == 0.0
        assert score(task, meta, body[:at] + [special] + body[at:] + [EOS]) == 0.0
        assert score(task, meta, body + [special, EOS]) == 0.0


@pytest.mark.parametrize(("name", "level"), ALL_LEVELS)
def test_eos_inside_the_answer_cuts_it(name, level):
    task = get_task(name, level)
    for i in range(50):
        _, meta = task.prompt(i)
        body = ids_of(task.reference(meta))
        at = 1 + i % (len(body) - 1)
        assert score(task, meta, body[:at] + [EOS] + body[at:]) == 0.0
        assert score(task, meta, [EOS] + body) == 0.0


@pytest.mark.parametrize(("name", "level"), ALL_LEVELS)
def test_no_answer_scores_zero(name, level):
    task = get_task(name, level)
    for i in range(50):
        assert task.reward(task.prompt(i)[1], "") == 0.0


def test_batched_decode_scores_like_single_decode():
    task = get_task()
    rows, metas = [], []
    for i in range(40):
        _, meta = task.prompt(i)
        body = ids_of(task.reference(meta))
        special = OTHER_SPECIALS[i % len(OTHER_SPECIALS)]
        rows += [body + [EOS], body, body[:1] + [special] + body[1:], body[:1] + [special] + body[1:] + [EOS]]
        metas += [meta] * 4
    texts = decode_completions(TOK, rows)
    assert texts == [decode_completion(TOK, r) for r in rows]
    assert [task.reward(m, t) for m, t in zip(metas, texts, strict=True)] == [1.0, 0.0, 0.0, 0.0] * 40
