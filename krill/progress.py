"""A progress bar under a long command's status lines (`krill worker run`, `krill verifier run`).

Design decisions:
- rich draws the bar only when stdout is a terminal. Anywhere else (a pipe, a log file, a test,
  the demo reading a role's stdout) it draws nothing and status lines go out exactly as plain
  `click.echo` lines, so whatever parses them is unaffected.
- The status lines stay the record (one per contribution or verdict); the bar only summarises
  them: done out of the target when there is one, a count and elapsed time otherwise. It is
  transient: gone when the command ends, leaving the lines and the final summary.
"""

from __future__ import annotations

import sys
from typing import TextIO

import click


class LineProgress:
    """Status lines with a bar under them; use as a context manager."""

    def __init__(self, description: str, total: int | None = None, stream: TextIO | None = None):
        self.description = description
        self.total = total
        self.completed = 0
        self._stream = stream
        self._progress = None
        self._task = None

    def __enter__(self) -> LineProgress:
        stream = self._stream or sys.stdout
        if stream.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            columns = [SpinnerColumn(), TextColumn("{task.description}")]
            columns += [BarColumn(), MofNCompleteColumn()] if self.total else [TextColumn("{task.completed} done")]
            self._progress = Progress(*columns, TimeElapsedColumn(), console=Console(file=stream), transient=True)
            self._progress.start()
            self._task = self._progress.add_task(self.description, total=self.total)
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def line(self, text: str) -> None:
        """One status line, above the bar."""
        if self._progress is None:
            click.echo(text, file=self._stream)
        else:
            self._progress.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def update(self, completed: int) -> None:
        """Set how much is done (the bar moves; nothing is printed without a terminal)."""
        self.completed = completed
        if self._progress is not None:
            self._progress.update(self._task, completed=completed)
