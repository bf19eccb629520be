"""Console progress for long work (rich), quiet when not wanted or not a terminal."""
from __future__ import annotations

import contextlib
import sys


class _Bar:
    def __init__(self, progress, task):
        self._p, self._t = progress, task

    def advance(self, n: float = 1) -> None:
        if self._p is not None:
            self._p.advance(self._t, n)


@contextlib.contextmanager
def progress_bar(label: str, total: float, enabled: bool = True):
    if not enabled:
        yield _Bar(None, None)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    cols = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*cols, transient=not sys.stderr.isatty()) as p:
        yield _Bar(p, p.add_task(label, total=total))
