"""Leaderboards: cells over seeds, averages, competition ranks ("1224", at the displayed precision)
and their robustness over seeds (stability Q, rank intervals); the tables' notes say so."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from .names import dataset_sort_key, model_sort_key
from .records import Run, busiest
from .tables import K, rounded

Q_EPS = 0.02  # NeuCo-Bench: Q_t = 2 * A_t / (0.02 + dA_t)


def competition_ranks(
    values: Mapping[K, float], *, higher_is_better: bool = True, decimals: int | None = None
) -> dict[K, int]:
    """Rank = 1 + the number of strictly better values: ties share the best rank ("1224")."""
    sign = -1.0 if higher_is_better else 1.0
    keyed = {
        k: sign * rounded(v, decimals)
        for k, v in values.items()
        if v is not None and math.isfinite(v)
    }
    return {k: 1 + sum(1 for o in keyed.values() if o < x) for k, x in keyed.items()}


def stability_q(values: Sequence[float]) -> float | None:
    """NeuCo-Bench's Q on percent scores: 2*(mean/100) / (0.02 + pstd/100); None below two seeds."""
    if len(values) < 2:
        return None
    return 2 * (statistics.fmean(values) / 100) / (Q_EPS + statistics.pstdev(values) / 100)


@dataclass
class Cell:
    """One (model, dataset) score: one value per seed."""

    seeds: tuple[int, ...]
    values: tuple[float, ...]
    model_ids: tuple[str, ...] = ()
    rank: int | None = None
    rank_range: tuple[int, int] | None = None

    @property
    def n(self) -> int:
        """Seeds behind the cell; std and stability need two."""
        return len(self.values)

    @property
    def mean(self) -> float:
        """The cell's score: mean over its seeds, what ranks and averages use."""
        return statistics.fmean(self.values)

    @property
    def std(self) -> float | None:
        """Sample std over seeds (ddof 1); None for a single seed."""
        return statistics.stdev(self.values) if self.n >= 2 else None

    @property
    def stability(self) -> float | None:
        """NeuCo-Bench's stability Q over the seeds; None below two."""
        return stability_q(self.values)


@dataclass
class Row:
    name: str
    cells: dict[str, Cell] = field(default_factory=dict)
    avg: float | None = None
    n_avg: int = 0
    avg_rank: float | None = None
    place: int | None = None  # competition rank of avg_rank among the rows
    place_range: tuple[int, int] | None = None  # over per-seed leaderboards (>= 2 seeds)
    published_avg: float | None = None  # only for imported tables
    published_rank: float | None = None


@dataclass
class Leaderboard:
    key: str  # file/section name, e.g. "frozen"
    title: str
    protocol: str
    fraction: float
    datasets: list[str]
    rows: list[Row]
    decimals: int = 2
    notes: list[str] = field(default_factory=list)
    seeds: tuple[int, ...] = ()

    def row(self, name: str) -> Row | None:
        """A row by display name; None where this board lacks the model (compared boards differ)."""
        return next((r for r in self.rows if r.name == name), None)

    def mean(self, model: str, dataset: str) -> float | None:
        """A cell's mean over seeds; None where the model or the dataset is missing."""
        r = self.row(model)
        c = r.cells.get(dataset) if r else None
        return c.mean if c else None

    @property
    def model_names(self) -> list[str]:
        """Display names in the board's row order."""
        return [r.name for r in self.rows]


def _rank_rows(
    rows: Mapping[str, Mapping[str, float]], datasets: Sequence[str], decimals: int | None
) -> tuple[dict[str, dict[str, int]], dict[str, float]]:
    """Per-dataset competition ranks and the mean rank over the datasets each row has."""
    ranks: dict[str, dict[str, int]] = {m: {} for m in rows}
    for d in datasets:
        col = competition_ranks({m: v[d] for m, v in rows.items() if d in v}, decimals=decimals)
        for m, k in col.items():
            ranks[m][d] = k
    return ranks, {m: statistics.fmean(rk.values()) for m, rk in ranks.items() if rk}


def build_leaderboard(
    samples: Mapping[tuple[str, str], Iterable[tuple[int, float]]],
    *,
    key: str,
    title: str,
    protocol: str = "",
    fraction: float = 1.0,
    datasets: Sequence[str] | None = None,
    models: Sequence[str] | None = None,
    decimals: int = 2,
    model_ids: Mapping[tuple[str, str], Sequence[str]] | None = None,
) -> Leaderboard:
    """Leaderboard from {(model, dataset): [(seed, mIoU), ...]}, in the paper's order."""
    samples = {k: sorted(v) for k, v in samples.items() if v}
    if datasets is None:
        datasets = sorted({d for _, d in samples}, key=dataset_sort_key)
    if models is None:
        models = sorted({m for m, _ in samples}, key=model_sort_key)
    datasets, rows = list(datasets), []
    for m in models:
        row = Row(m)
        for d in datasets:
            if (m, d) in samples:
                seeds, vals = zip(*samples[(m, d)])
                row.cells[d] = Cell(
                    tuple(seeds),
                    tuple(float(v) for v in vals),
                    tuple((model_ids or {}).get((m, d), ())),
                )
        rows.append(row)
    seeds = tuple(sorted({s for v in samples.values() for s, _ in v}))
    lb = Leaderboard(key, title, protocol, fraction, datasets, rows, decimals, seeds=seeds)
    _fill_ranks(lb)
    return lb


def _fill_ranks(lb: Leaderboard) -> None:
    means = {r.name: {d: c.mean for d, c in r.cells.items()} for r in lb.rows}
    ranks, avg_rank = _rank_rows(means, lb.datasets, lb.decimals)
    for r in lb.rows:
        vals = [c.mean for c in r.cells.values()]
        r.n_avg = len(vals)
        r.avg = statistics.fmean(vals) if vals else None
        r.avg_rank = avg_rank.get(r.name)
        for d, c in r.cells.items():
            c.rank = ranks[r.name][d]
            # the best and worst rank were each model's score any of its seeds'
            others = [o.cells[d].values for o in lb.rows if o is not r and d in o.cells]
            lo, hi = (rounded(f(c.values), lb.decimals) for f in (min, max))
            c.rank_range = (
                1 + sum(rounded(min(o), lb.decimals) > hi for o in others),
                1 + sum(rounded(max(o), lb.decimals) > lo for o in others),
            )
    places = competition_ranks(
        {r.name: r.avg_rank for r in lb.rows if r.avg_rank is not None},
        higher_is_better=False,
        decimals=lb.decimals,
    )
    for r in lb.rows:
        r.place = places.get(r.name)
    if len(lb.seeds) < 2:
        return
    per_seed: dict[str, list[int]] = {}
    for s in lb.seeds:
        vals = {
            r.name: {d: c.values[c.seeds.index(s)] for d, c in r.cells.items() if s in c.seeds}
            for r in lb.rows
        }
        _, ar = _rank_rows({m: v for m, v in vals.items() if v}, lb.datasets, lb.decimals)
        for m, p in competition_ranks(ar, higher_is_better=False, decimals=lb.decimals).items():
            per_seed.setdefault(m, []).append(p)
    for r in lb.rows:
        if r.name in per_seed:
            r.place_range = (min(per_seed[r.name]), max(per_seed[r.name]))
    if any(r.place_range and r.place_range[0] != r.place_range[1] for r in lb.rows):
        lb.notes.append(
            "The order by average rank differs between seeds: see the place range in the robustness"
            " table."
        )


def leaderboard_from_runs(
    runs: Sequence[Run], *, key: str, title: str, protocol: str, fraction: float, decimals: int = 2
) -> Leaderboard:
    """Runs grouped by (display name, dataset); a cell never mixes catalog ids of one display name
    (croma_optical/croma_sar): the one with most runs (then newest) fills it, the notes say so."""
    by_cell: dict[tuple[str, str], dict[str, list[Run]]] = {}
    for r in runs:
        by_cell.setdefault((r.model_name, r.dataset), {}).setdefault(r.model, []).append(r)
    samples, ids, notes = {}, {}, []
    order = {id(r): i for i, r in enumerate(runs)}
    for (m, d), variants in by_cell.items():
        pick = busiest(variants, order)
        if len(variants) > 1:
            others = ", ".join(sorted(set(variants) - {pick}))
            notes.append(
                f"{m} on {d}: runs of {pick} are shown; runs of {others} are left out of this cell."
            )
        samples[(m, d)] = [(r.seed, r.miou) for r in variants[pick]]
        ids[(m, d)] = [pick]
    kw = {"protocol": protocol, "fraction": fraction, "decimals": decimals, "model_ids": ids}
    lb = build_leaderboard(samples, key=key, title=title, **kw)
    lb.notes.extend(sorted(notes))
    return lb
