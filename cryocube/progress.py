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


def gather(futures: list, label: str, total: float, enabled: bool, weight) -> list:
    """Results of Dask futures in submission order, advancing the bar by `weight(i, result)` as each
    arrives; a failure cancels the rest and re-raises the worker's error."""
    from distributed import as_completed

    index = {f: i for i, f in enumerate(futures)}
    results: list = [None] * len(futures)
    try:
        with progress_bar(label, total=total, enabled=enabled) as bar:
            for f in as_completed(futures):
                i = index[f]
                results[i] = f.result()
                bar.advance(weight(i, results[i]))
    except BaseException:
        for f in futures:
            f.cancel()
        raise
    return results
