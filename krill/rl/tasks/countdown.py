"""Countdown: combine the given digits with the allowed operators to hit a target.

Design decisions:
- Prompt `3,7,5>026:` lists single-digit numbers (1-9) and a zero-padded 3-digit target; the
  completion is an expression that uses every number exactly once, in any order, joined by
  the level's operators, with no parentheses, evaluated with the usual precedence (`*` before
  `+`/`-`). Fixed widths make all prompts of a level the same length.
- Targets come from a random expression over the numbers, so every prompt has a solution; the
  reward accepts any correct expression, not only the one the generator drew.
- The answer grammar is strict (digit (op digit)*): anything else scores 0. The expression is
  evaluated by a small precedence parser over that grammar, never by `eval`.
- Levels: 1: three numbers with `+ -`; 2: three numbers with `+ - *`; 3: four numbers with
  `+ - *`. Targets outside 0..999 are redrawn.
"""

from __future__ import annotations

import random
import re
from typing import Any

from krill.rl.tasks.base import Task

_LEVELS: dict[int, tuple[int, str]] = {1: (3, "+-"), 2: (3, "+-*"), 3: (4, "+-*")}


def evaluate_expression(expr: str) -> int:
    """Value of `d(op d)*` with `*` binding tighter than `+` and `-`."""
    tokens = re.findall(r"\d|[+\-*]", expr)
    terms: list[int] = []
    signs: list[int] = []
    term = int(tokens[0])
    sign = 1
    for op, digit in zip(tokens[1::2], tokens[2::2], strict=True):
        if op == "*":
            term *= int(digit)
        else:
            terms.append(term)
            signs.append(sign)
            term, sign = int(digit), (1 if op == "+" else -1)
    terms.append(term)
    signs.append(sign)
    return sum(s * t for s, t in zip(signs, terms, strict=True))


class Countdown(Task):
    """`3,7,5>026:` -> `3*7+5`: any expression over exactly those numbers that hits the target."""

    name = "countdown"
    levels = tuple(sorted(_LEVELS))
    default_level = 1

    @property
    def _count(self) -> int:
        return _LEVELS[self.level][0]

    @property
    def _ops(self) -> str:
        return _LEVELS[self.level][1]

    @property
    def max_new_tokens(self) -> int:
        return 2 * self._count

    def _draw(self, rng: random.Random) -> dict[str, Any]:
        while True:
            numbers = [rng.randint(1, 9) for _ in range(self._count)]
            order = list(numbers)
            rng.shuffle(order)
            ops = [rng.choice(self._ops) for _ in range(self._count - 1)]
            expr = str(order[0]) + "".join(op + str(n) for op, n in zip(ops, order[1:], strict=True))
            target = evaluate_expression(expr)
            if 0 <= target <= 999:
                return {"numbers": numbers, "target": target, "solution": expr}

    def _render(self, metadata: dict[str, Any]) -> str:
        return ",".join(str(n) for n in metadata["numbers"]) + ">" + str(metadata["target"]).zfill(3) + ":"

    def _problem_key(self, metadata: dict[str, Any]) -> str:
        return self._render(metadata)

    def reference(self, metadata: dict[str, Any]) -> str:
        return metadata["solution"]

    def reward(self, metadata: dict[str, Any], completion: str) -> float:
        ops = re.escape(self._ops)
        if not re.fullmatch(rf"[1-9]([{ops}][1-9]){{{self._count - 1}}}", completion):
            return 0.0
        if sorted(int(c) for c in completion[::2]) != sorted(metadata["numbers"]):
            return 0.0
        return 1.0 if evaluate_expression(completion) == metadata["target"] else 0.0
