"""Tasks: deterministic prompts, disjoint splits, strict rewards; the registry."""

from __future__ import annotations

import pytest

from krill.rl.tasks import DEFAULT_TASK, TASKS, TaskError, get_task
from krill.rl.tasks.countdown import evaluate_expression

ALL_LEVELS = [(name, level) for name, cls in TASKS.items() for level in cls.levels]


@pytest.mark.parametrize(("name", "level"), ALL_LEVELS)
def test_prompts_are_deterministic_and_fixed_width(name, level):
    a, b = get_task(name, level), get_task(name, level)
    for split in ("train", "eval"):
        prompts = [a.prompt(i, split) for i in range(50)]
        assert prompts == [b.prompt(i, split) for i in range(50)]
        assert len({len(text) for text, _ in prompts}) == 1
        assert len({text for text, _ in prompts}) > 40


@pytest.mark.parametrize(("name", "level"), ALL_LEVELS)
def test_train_and_eval_are_disjoint(name, level):
    task = get_task(name, level)
    train = {task.prompt(i, "train")[0] for i in range(1000)}
    evals = {task.prompt(i, "eval")[0] for i in range(300)}
    assert not train & evals
    assert all(task.split_of(task.prompt(i, "eval")[1]) == "eval" for i in range(100))


@pytest.mark.parametrize(("name", "level"), ALL_LEVELS)
def test_reference_answers_score_one_and_fit_the_budget(name, level):
    task = get_task(name, level)
    for i in range(200):
        _, meta = task.prompt(i)
        ref = task.reference(meta)
        assert task.reward(meta, ref) == 1.0
        assert len(ref) < task.max_new_tokens


def test_arithmetic_values_and_format():
    task = get_task("arithmetic", 3)
    meta = {"operands": [7, 45, 60], "ops": "+-"}
    assert task._render(meta) == "07+45-60="
    assert task.reference(meta) == "-008"
    assert get_task("arithmetic", 2).reference({"operands": [99, 99, 99], "ops": "++"}) == "297"
    assert get_task("arithmetic", 1).reference({"operands": [7, 5], "ops": "+"}) == "012"


@pytest.mark.parametrize("completion", ["-8", "-0008", " -008", "-008 ", "-008=", "008", "+008", "-009", ""])
def test_arithmetic_reward_is_strict(completion):
    task = get_task("arithmetic", 3)
    assert task.reward({"operands": [7, 45, 60], "ops": "+-"}, completion) == 0.0


def test_countdown_accepts_any_correct_expression_and_nothing_else():
    task = get_task("countdown", 2)
    meta = {"numbers": [3, 7, 5], "target": 26, "solution": "3*7+5"}
    assert task._render(meta) == "3,7,5>026:"
    for good in ("3*7+5", "7*3+5", "5+7*3", "5+3*7"):
        assert task.reward(meta, good) == 1.0
    for bad in ("3*7+5+0", "3*7+6", "21+5", "3*7 +5", "(3*7)+5", "3*7+5=", "3*7", "37-11", "3*7+5\n"):
        assert task.reward(meta, bad) == 0.0
    assert get_task("countdown", 1).reward(meta, "3*7+5") == 0.0  # '*' not allowed on level 1


def test_countdown_precedence():
    assert evaluate_expression("2+3*4") == 14
    assert evaluate_expression("9-2*3-1") == 2
    assert evaluate_expression("2*3*4-5") == 19


def test_registry():
    assert get_task().spec == f"{DEFAULT_TASK}:{TASKS[DEFAULT_TASK].default_level}"
    assert get_task("arithmetic:4").level == 4
    assert get_task("countdown", level=3).name == "countdown"
    with pytest.raises(TaskError, match="unknown task"):
        get_task("poetry")
    with pytest.raises(TaskError, match="level"):
        get_task("arithmetic", 9)
    with pytest.raises(TaskError, match="level"):
        get_task("arithmetic:x")
    with pytest.raises(TaskError, match="index"):
        get_task().prompt(-1)
    with pytest.raises(TaskError, match="split"):
        get_task().prompt(0, "test")
