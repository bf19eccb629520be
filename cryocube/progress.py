"""Progress of long work: rich bars and a live run table on a terminal, timestamped lines when piped
to a log, displays updated in place in a Jupyter notebook, nothing with --quiet."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from html import escape

STEPS = 10  # piped output: lines per phase / per run
NOTEBOOK_REFRESH_S = 0.5  # a display updated at most twice a second (each update is a message)


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (IPython's ZMQ shell): displays update in place."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def mode(enabled: bool = True) -> str:
    """quiet, or by stderr: tty, notebook or plain (piped to a log)."""
    if not enabled:
        return "quiet"
    if sys.stderr.isatty():
        return "tty"
    return "notebook" if in_notebook() else "plain"


_DASHBOARDS: set[str] = set()


def show_dashboard(client, enabled: bool = True) -> None:
    """In a notebook, the cluster's dashboard link, once per link (a command says it on opening)."""
    if mode(enabled) != "notebook":
        return
    try:
        link = client.dashboard_link
    except (KeyError, AttributeError):  # a scheduler without a dashboard
        return
    if link and link not in _DASHBOARDS:
        _DASHBOARDS.add(link)
        print(f"Dask dashboard: {link}", flush=True)


class _Display:
    """One notebook display updated in place, at most every NOTEBOOK_REFRESH_S unless forced."""

    def __init__(self):
        self._handle, self._last = None, 0.0

    def show(self, text: str, html: str, force: bool = False) -> None:
        from IPython.display import display

        now = time.monotonic()
        if not force and self._handle is not None and now - self._last < NOTEBOOK_REFRESH_S:
            return
        self._last = now
        body = {"text/plain": text, "text/html": html}
        if self._handle is None:
            self._handle = display(body, raw=True, display_id=True)
        else:
            self._handle.update(body, raw=True)


def say(text: str, enabled: bool = True) -> None:
    """One progress line on stderr (not in quiet mode)."""
    if enabled:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


class _Bar:
    def __init__(self, progress=None, task=None):
        self._p, self._t = progress, task

    def advance(self, n: float = 1) -> None:
        if self._p is not None:
            self._p.advance(self._t, n)


class _PlainBar:
    """Prints `label: 40% (12/30), 8 s` at each tenth of the total and at the end."""

    def __init__(self, label: str, total: float):
        self.label, self.total, self.done = label, max(total, 1e-9), 0.0
        self.t0, self.next = time.perf_counter(), 1

    def advance(self, n: float = 1) -> None:
        self.done += n
        crossed = False
        while self.next <= STEPS and self.done >= self.total * self.next / STEPS - 1e-9:
            self.next, crossed = self.next + 1, True
        if crossed:  # one line per advance, at the highest tenth it reached
            pct, elapsed = 100 * (self.next - 1) // STEPS, time.perf_counter() - self.t0
            say(f"{self.label}: {pct}% ({self.done:g}/{self.total:g}), {elapsed:.0f} s")


class _NotebookBar(_PlainBar):
    """An HTML progress bar in a notebook (where only text renders: `label: 40% (12/30, 8 s)`)."""

    def __init__(self, label: str, total: float):
        super().__init__(label, total)
        self._display = _Display()
        self._show(force=True)

    def _show(self, force: bool = False) -> None:
        frac = min(self.done / self.total, 1.0)
        tail = f"{self.done:g}/{self.total:g}, {time.perf_counter() - self.t0:.0f} s"
        text = f"{self.label}: {100 * frac:.0f}% ({tail})"
        html = (
            f"<div><code>{escape(self.label)}</code> <progress value='{frac:.4f}' max='1'"
            f" style='width:30ex'></progress> {100 * frac:.0f}% ({tail})</div>"
        )
        self._display.show(text, html, force)

    def advance(self, n: float = 1) -> None:
        self.done += n
        self._show(force=self.done >= self.total - 1e-9)


@contextlib.contextmanager
def progress_bar(label: str, total: float, enabled: bool = True):
    """Rich bar on a terminal, a line per tenth when piped; a no-op when quiet or total <= 0."""
    m = mode(enabled)
    if m == "quiet" or total <= 0:
        yield _Bar()
        return
    if m == "plain":
        say(f"{label}: started ({total:g})")
        yield _PlainBar(label, total)
        return
    if m == "notebook":
        bar = _NotebookBar(label, total)
        yield bar
        bar._show(force=True)
        return
    from rich import progress as rp

    text = rp.TextColumn("[bold]{task.description}")
    clocks = (rp.TimeElapsedColumn(), rp.TimeRemainingColumn())
    with rp.Progress(text, rp.BarColumn(), rp.MofNCompleteColumn(), *clocks, transient=False) as p:
        yield _Bar(p, p.add_task(label, total=total))


def gather(futures: list, label: str, total: float, enabled: bool, weight) -> list:
    """Results of Dask futures in submission order, the bar advanced by `weight(i, result)`; a
    failure cancels the rest and re-raises the worker's error."""
    from distributed import as_completed

    index = {f: i for i, f in enumerate(futures)}
    results: list = [None] * len(futures)
    if futures:
        show_dashboard(futures[0].client, enabled)
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


class RunBoard:
    """Training progress of runs from the events their tasks publish, as a live table or lines;
    thread-safe, as events arrive on the Dask client's thread."""

    HEAD = ("run", "epoch", "loss", "val mIoU", "state")

    def __init__(self, labels: dict[str, str], enabled: bool = True):
        self.labels = dict(labels)
        self.mode = mode(enabled)
        self.state: dict[str, dict] = {
            k: {"epoch": 0, "epochs": None, "loss": None, "val": None, "status": "queued"}
            for k in labels
        }
        self._lock = threading.Lock()
        self._live = None
        self._display = _Display() if self.mode == "notebook" else None

    def __enter__(self) -> "RunBoard":
        if self._display is not None:
            self._refresh(force=True)
        elif self.mode == "tty":
            from rich.live import Live

            self._live = Live(self._table(), refresh_per_second=2, transient=False)
            self._live.__enter__()
        elif self.mode == "plain":
            say(f"training {len(self.labels)} run(s)")
        return self

    def __exit__(self, *exc) -> None:
        self._update(force=True)
        if self._live is not None:
            self._live.__exit__(*exc)

    def _rows(self) -> list[tuple[str, ...]]:
        return [
            (
                self.labels[k],
                f"{s['epoch']}/{s['epochs']}" if s["epochs"] else "-",
                f"{s['loss']:.4f}" if s["loss"] is not None else "-",
                f"{s['val']:.2f}" if s["val"] is not None else "-",
                s["status"],
            )
            for k, s in self.state.items()
        ]

    def _title(self) -> str:
        done = sum(1 for s in self.state.values() if s["status"] in ("done", "failed"))
        return f"train + test: {done}/{len(self.state)} runs finished"

    def _refresh(self, force: bool = False) -> None:
        """The notebook's run table, in place (text and HTML)."""
        head, rows = self.HEAD, self._rows()
        text = "\n".join([self._title()] + ["  ".join(r) for r in [head, *rows]])
        cells = lambda r, tag: "".join(f"<{tag}>{escape(c)}</{tag}>" for c in r)  # noqa: E731
        html = (
            f"<table><caption>{escape(self._title())}</caption><tr>{cells(head, 'th')}</tr>"
            + "".join(f"<tr>{cells(r, 'td')}</tr>" for r in rows)
            + "</table>"
        )
        self._display.show(text, html, force)

    def _table(self):
        from rich.table import Table

        t = Table(*self.HEAD, title=self._title(), box=None, pad_edge=False)
        for row in self._rows():
            t.add_row(*row)
        return t

    def event(self, ev: dict) -> None:
        """A task's training event (epoch, loss, val mIoU); runs not on the board are ignored."""
        run = ev.get("run")
        if run not in self.state:
            return
        with self._lock:
            s = self.state[run]
            s["epoch"], s["epochs"] = ev.get("epoch", s["epoch"]), ev.get("epochs", s["epochs"])
            s["status"] = "testing" if ev.get("done") else "training"
            if ev.get("loss") is not None:
                s["loss"] = ev["loss"]
            if ev.get("val_mIoU") is not None:
                s["val"] = ev["val_mIoU"]
            self._update(self._epoch_line(run, ev) if self.mode == "plain" else None)

    def _update(self, line: str | None = None, force: bool = False) -> None:
        """The board's new state: redrawn (notebook, terminal), or `line` said (piped)."""
        if self._display is not None:
            self._refresh(force)
        elif self._live is not None:
            self._live.update(self._table())
        elif self.mode == "plain" and line:
            say(line)

    def _epoch_line(self, run: str, ev: dict) -> str | None:
        """Piped: a line every ~10 % of a run's epochs, at every validation and when it is done."""
        epochs, e = ev.get("epochs") or 1, ev.get("epoch", 0)
        due = ev.get("done") or ev.get("val_mIoU") is not None or e % max(1, epochs // STEPS) == 0
        if not due:
            return None
        s = self.state[run]
        loss = f" loss {s['loss']:.4f}" if ev.get("loss") is not None else ""
        val = f" val mIoU {ev['val_mIoU']:.2f}" if ev.get("val_mIoU") is not None else ""
        done = " (best state kept, testing)" if ev.get("done") else ""
        return f"{self.labels[run]}: epoch {e}/{epochs}{loss}{val}{done}"

    def scoring(self, run: str, tasks: int) -> None:
        """A run's score tasks are submitted (its fit is done)."""
        with self._lock:
            if run in self.state:
                self.state[run]["status"] = f"scoring ({tasks} tasks)"
            self._update(f"{self.labels.get(run, run)}: scoring started ({tasks} tasks)")

    def finish(self, run: str, text: str, failed: bool = False) -> None:
        """Marks a run done or failed; piped output prints `text` (its result or error line)."""
        with self._lock:
            if run in self.state:
                self.state[run]["status"] = "failed" if failed else "done"
            self._update(f"{self.labels.get(run, run)}: {text}", force=True)
