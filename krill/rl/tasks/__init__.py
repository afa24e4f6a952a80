"""Tasks with verifiable rewards, by name.

Design decisions:
- A registry maps a name to a `Task` class; `get_task("arithmetic")` gives the default level,
  `get_task("arithmetic:3")` or `get_task("arithmetic", level=3)` another. Adding a task is one
  class and one line here.
- The default task is `arithmetic` at its default level (see `krill.rl.tasks.arithmetic`).

Public API:
    TASKS: dict[str, type[Task]]
    DEFAULT_TASK = "arithmetic"
    get_task(name: str = DEFAULT_TASK, level: int | None = None) -> Task
    Task, TaskError (from krill.rl.tasks.base)
"""

from __future__ import annotations

from krill.rl.tasks.arithmetic import Arithmetic
from krill.rl.tasks.base import EVAL_PERCENT, SPLITS, Task, TaskError
from krill.rl.tasks.countdown import Countdown

TASKS: dict[str, type[Task]] = {cls.name: cls for cls in (Arithmetic, Countdown)}
DEFAULT_TASK = "arithmetic"


def get_task(name: str = DEFAULT_TASK, level: int | None = None) -> Task:
    """The task `name` (optionally `name:level`) at `level` (default: the task's default)."""
    base, sep, lvl = name.partition(":")
    if sep:
        if level is not None:
            raise TaskError(f"level: given both in {name!r} and as level={level}")
        if not lvl.isdigit():
            raise TaskError(f"task: level in {name!r} is not a number")
        level = int(lvl)
    if base not in TASKS:
        raise TaskError(f"task: unknown task {base!r}; known: {sorted(TASKS)}")
    return TASKS[base](level)


__all__ = ["DEFAULT_TASK", "EVAL_PERCENT", "SPLITS", "TASKS", "Task", "TaskError", "get_task"]
