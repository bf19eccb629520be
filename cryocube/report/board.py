"""A board laid out from the cells runs contribute, for any family that writes them and draws no
board of its own.

A cell is one figure of a run on a split: {task, metric, unit, split, samples (a hash of the sample
ids), n, value, ci_low, ci_high[, class]}. A column is one (task, metric); its cells must share
unit, split and samples, so a column compares like with like, and a cell over other samples is
refused in one sentence.
"""

from __future__ import annotations

from .records import ResultsError, Run
from .tables import MISSING, Column, Table


def cell_text(c: dict) -> str:
    """How a board cell prints: value, its 95 % interval when the run has one, and n."""
    lo, hi = c.get("ci_low"), c.get("ci_high")
    ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else ""
    return f"{c['value']:.2f}{ci} n={c['n']}"


def cells_table(runs: list[Run], name: str, title: str) -> Table:
    """One row per run (by display name), one column per (task, metric) of the runs' overall cells
    (class None)."""
    columns: dict[tuple[str, str], dict] = {}
    for r in runs:
        for c in r.metrics.get("cells") or []:
            if c.get("class") is not None:
                continue
            key = (c["task"], c["metric"])
            first = columns.setdefault(key, c)
            for f in ("unit", "split", "samples"):
                if c.get(f) != first.get(f):
                    raise ResultsError(
                        f"{r.source}: the {key[0]} {key[1]} cell of {r.model_name} has {f}"
                        f" {c.get(f)!r}, its column {first.get(f)!r}: cells over other samples or"
                        " units are never compared"
                    )
    keys = sorted(columns)
    t = Table(
        name,
        title,
        [Column("model", "Model", numeric=False)]
        + [Column(f"{k[0]}/{k[1]}", f"{k[0]} {k[1]} ({columns[k]['unit']})") for k in keys],
    )
    for r in sorted(runs, key=lambda r: (r.model_name, r.run_id)):
        by = {
            (c["task"], c["metric"]): c
            for c in r.metrics.get("cells") or []
            if c.get("class") is None
        }
        t.add(
            [r.model_name] + [by[k]["value"] if k in by else None for k in keys],
            [r.model_name] + [cell_text(by[k]) if k in by else MISSING for k in keys],
        )
    t.notes.append(
        "Each cell: value [95 % interval] and n, on the split its column names; one unit and one"
        f" sample set per column ({', '.join(sorted({columns[k]['split'] for k in keys}))} split)."
    )
    return t
