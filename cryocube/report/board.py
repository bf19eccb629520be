"""A board laid out from the cells runs contribute, for any family that draws none of its own; a
column compares like with like, a board is one cube on one split (docs/report.md)."""

from __future__ import annotations

from dataclasses import dataclass

from .records import ResultsError, Run
from .tables import MISSING, MODEL, Column, Table


def cell_text(c: dict) -> str:
    """How a board cell prints: value, its 95 % interval when the run has one, and n."""
    lo, hi = c.get("ci_low"), c.get("ci_high")
    ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else ""
    return f"{c['value']:.2f}{ci} n={c['n']}"


def _overall(r: Run) -> list[dict]:
    return [c for c in r.metrics.get("cells") or [] if c.get("class") is None]


def cells_table(runs: list[Run], name: str, title: str) -> Table:
    """A row per run (display name), a column per (task, metric) of its cells of class None."""
    columns: dict[tuple[str, str], dict] = {}
    for r in runs:
        for c in _overall(r):
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
    cols = [Column(f"{k[0]}/{k[1]}", f"{k[0]} {k[1]} ({columns[k]['unit']})") for k in keys]
    t = Table(name, title, [MODEL] + cols)
    for r in sorted(runs, key=lambda r: (r.model_name, r.run_id)):
        by = {(c["task"], c["metric"]): c for c in _overall(r)}
        t.add(
            [r.model_name] + [by[k]["value"] if k in by else None for k in keys],
            [r.model_name] + [cell_text(by[k]) if k in by else MISSING for k in keys],
        )
    t.notes.append(
        "Each cell: value [95 % interval] and n, on the split its column names; one unit and one"
        f" sample set per column ({', '.join(sorted({columns[k]['split'] for k in keys}))} split)."
    )
    return t


@dataclass(frozen=True)
class Cube:
    """A dataset's cube (checksum) and split (digest): tables named by `slug`, headed by `name`."""

    dataset: str
    checksum: str
    split: str
    name: str
    slug: str

    def holds(self, r: Run) -> bool:
        """Whether run `r` was scored on this cube and split."""
        return cube_key(r) == (self.dataset, self.checksum, self.split)


def cube_key(r: Run) -> tuple[str, str, str]:
    """(dataset, cube checksum, board split digest) of a run ("" where an old record lacks one)."""
    split = r.record.get("board_split") or r.record.get("split")
    return (
        r.dataset,
        str(r.cube.get("checksum") or ""),
        str(split.get("digest") or "") if isinstance(split, dict) else "",
    )


def cubes(runs: list[Run]) -> list[Cube]:
    """One board per (dataset, cube, split) the runs were scored on, by dataset and cube name; a
    board's tables are named by its `slug` (the dataset alone while it has one board)."""
    first: dict[tuple, Run] = {}
    for r in sorted(runs, key=lambda r: (r.created, r.run_id)):
        first.setdefault(cube_key(r), r)
    out = []
    for key, r in first.items():
        d, checksum, split = key
        url = str(r.cube.get("url") or "")
        name = url.rstrip("/").rsplit("/", 1)[-1] or d
        mates = [k for k in first if k[0] == d]
        slug = d
        if len(mates) > 1:
            slug += f"_{checksum[:8] or 'cube'}"
            if sum(k[1] == checksum for k in mates) > 1:
                slug += f"_{split[:6] or 'split'}"
        out.append(Cube(d, checksum, split, name, slug))
    return sorted(out, key=lambda c: (c.dataset, c.name, c.checksum, c.split))


def about(cube: Cube) -> str:
    """Which cube and split a board is, beside its name: "cube 1a2b3c4d, split 5e6f7a"."""
    return ", ".join(
        ([f"cube {cube.checksum[:8]}"] if cube.checksum else [])
        + ([f"split {cube.split[:6]}"] if cube.split else [])
    )
