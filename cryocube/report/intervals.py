"""The uncertainty tables (docs/statistics.md), from the runs' per-tile files (`stats` computes):
cell intervals, across-dataset IQM and mean, probability of improvement, paired comparisons."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .. import store
from ..errors import ReportError
from . import stats
from .leaderboard import Leaderboard
from .names import dataset_display_name
from .records import Run
from .tables import MISSING, MODEL, Column, Table, columns

NOTE_CELL = (
    "mIoU: mean over seeds; interval: 95 % bootstrap ({draws} draws, seed {seed}) of that mean over"
    " the test split, resampling whole scenes (the cube's source) where tiles share one, tiles"
    " otherwise, with the same draws for every seed; seed SD: sample SD over seeds, apart from it"
    " (docs/statistics.md)."
)
NOTE_RANK = (
    "Rank interval: 2.5-97.5 % of the cell's rank over the same draws for every model on the test"
    " split; tied with: models whose intervals overlap this one's."
)


def load_tiles(run: Run) -> stats.TileData | None:
    """The run's per-tile data, where its record says, else beside it (moved); None: old record."""
    pt = run.record.get("per_tile")
    if not isinstance(pt, dict):
        return None
    cands = [str(pt["url"])] if pt.get("url") else []
    base = run.source.rsplit(":", 1)[0].rsplit("/", 1)[0]
    cands.append(store.join(base, "runs", run.run_id, str(pt.get("file") or "per_tile.npz")))
    for url in cands:
        if store.file_exists(url):
            try:
                return stats.read_tiles(store.read_bytes(url), url, pt.get("sha256"))
            except (ValueError, KeyError, OSError) as e:
                raise ReportError(f"{url}: per-tile file of run {run.run_id} unreadable ({e})")
    warnings.warn(
        f"{run.source}: run {run.run_id} names per-tile data ({cands[-1]}) that is not there;"
        " its cell has no interval",
        stacklevel=2,
    )
    return None


@dataclass
class BoardIntervals:
    """One protocol board's uncertainty, and the seed scores behind it."""

    lb: Leaderboard
    cells: dict[tuple[str, str], stats.CellInterval]
    aggregates: dict[str, stats.Aggregate]
    improvement: dict[tuple[str, str], tuple[float, float, float, int]]
    scores: dict[str, dict[str, list[float]]]


def board_intervals(
    lb: Leaderboard, runs: Sequence[Run], *, draws: int = stats.DRAWS, seed: int = stats.SEED
) -> BoardIntervals:
    """The intervals of one leaderboard's cells from the runs they were filled from."""
    by_key = {(r.model_name, r.dataset, r.model, r.seed): r for r in runs}
    cache: dict[str, stats.TileData | None] = {}  # run id -> its tiles, each file read once
    cells: dict[tuple[str, str], stats.CellInterval] = {}
    for d in lb.datasets:
        per_model = {}
        for row in lb.rows:
            if (c := row.cells.get(d)) is None:
                continue
            got = per_model[row.name] = []
            for s, v in zip(c.seeds, c.values):
                keys = [(row.name, d, m, s) for m in c.model_ids]
                r = next((by_key[k] for k in keys if k in by_key), None)
                if r is not None and r.run_id not in cache:
                    cache[r.run_id] = load_tiles(r)
                got.append((v, cache.get(r.run_id) if r is not None else None))
        found = stats.dataset_intervals(d, per_model, draws=draws, seed=seed, board=lb.key)
        cells.update({(m, d): ci for m, ci in found.items()})
    scores = {
        row.name: {d: list(c.values) for d, c in row.cells.items()} for row in lb.rows if row.cells
    }
    aggs = stats.aggregates(scores, draws=draws, seed=seed, board=lb.key)
    poi = stats.improvement_matrix(scores, draws=draws, seed=seed, board=lb.key)
    return BoardIntervals(lb, cells, aggs, poi, scores)


def _rank_columns(title: str = "Rank interval") -> list[Column]:
    """What `_ranked` fills: best and worst rank (CSV/JSON only), their range, the ties."""
    spec = f"rank_best=; rank_worst=; rank={title}; ties=Tied with"
    return columns(spec, "rank ties", "rank_best rank_worst")


def _ranked(rk: tuple[int, int] | None, ties: tuple[str, ...]) -> list:
    """The bootstrap rank interval and the models tied with it, as `_rank_columns` hold them."""
    text = MISSING if rk is None else str(rk[0]) if rk[0] == rk[1] else f"{rk[0]}–{rk[1]}"
    return [*(rk or (None, None)), text, ", ".join(ties) or None]


def cells_table(bi: BoardIntervals) -> Table:
    """Every segmentation cell: interval, seed SD, rank interval, ties, a note where it is weak."""
    lb = bi.lb
    cols = columns(
        "model=Model; dataset=Dataset; miou=mIoU [95 % interval]; lo=; hi=; seed_sd=Seed SD;"
        " seeds=Seeds; tiles=Tiles; scenes=Scenes; resampled=Resampled",
        text="model dataset resampled",
        hidden="lo hi",
        decimals=dict.fromkeys(("lo", "hi", "seed_sd"), lb.decimals),
    )
    cols += _rank_columns() + [Column("note", "Note", numeric=False)]
    t = Table("intervals", f"{lb.title}: mIoU with 95 % intervals over test scenes", cols)
    for d in lb.datasets:
        for row in lb.rows:
            if (c := bi.cells.get((row.name, d))) is None:
                continue
            t.add(
                [row.name, d, c.mean, c.lo, c.hi, c.seed_sd, c.seeds, c.tiles, c.scenes]
                + [c.unit or None, *_ranked(c.rank, c.ties), c.note or None],
                {
                    "dataset": dataset_display_name(d),
                    "miou": stats.interval_text(c.mean, c.lo, c.hi, lb.decimals),
                    "note": c.note or "",
                },
            )
    t.notes += [
        NOTE_CELL.format(draws=stats.DRAWS, seed=stats.SEED),
        NOTE_RANK,
        f"A cell on fewer than {stats.FEW_SCENES} scenes says so: its interval covers the truth"
        " less often than 95 % (docs/statistics.md).",
    ]
    return t


def aggregate_table(bi: BoardIntervals) -> Table:
    """Per model: IQM and mean of its (dataset, seed) scores, with their intervals and IQM rank."""
    lb = bi.lb
    ends = "iqm_lo iqm_hi mean_lo mean_hi"  # the intervals' ends: CSV/JSON only
    cols = columns(
        "model=Model; iqm=IQM [95 % interval]; iqm_lo=; iqm_hi=; mean=Mean [95 % interval];"
        " mean_lo=; mean_hi=; datasets=Datasets; runs=Runs",
        "model",
        ends,
        dict.fromkeys(ends.split(), lb.decimals),
    ) + _rank_columns("IQM rank interval")
    title = f"{lb.title}: across datasets (IQM and mean of (dataset, seed) mIoU)"
    t = Table("across_datasets", title, cols)
    for m, a in sorted(bi.aggregates.items(), key=lambda kv: -kv[1].iqm):
        t.add(
            [m, a.iqm, a.iqm_lo, a.iqm_hi, a.mean, a.mean_lo, a.mean_hi, a.datasets, a.runs]
            + _ranked(a.rank, a.ties),
            {
                "iqm": stats.interval_text(a.iqm, a.iqm_lo, a.iqm_hi, lb.decimals),
                "mean": stats.interval_text(a.mean, a.mean_lo, a.mean_hi, lb.decimals),
            },
        )
    t.notes.append(
        "IQM: the 25 % trimmed mean of every (dataset, seed) mIoU of the model (rliable's"
        " aggregate_iqm); intervals: 95 % stratified bootstrap, the seeds resampled within each"
        f" dataset ({stats.DRAWS} draws). They cover seed variation only, not the choice of the"
        f" {len(lb.datasets)} dataset(s) nor the test tiles (docs/statistics.md). Scores are raw"
        " mIoU, not normalised per dataset."
    )
    return t


def improvement_table(bi: BoardIntervals) -> Table:
    """The probability that the row model beats the column model on a dataset, with its interval."""
    models = [m for m in bi.lb.model_names if m in bi.scores]
    cols = [MODEL]
    for i, m in enumerate(models):  # the column model's P, and its interval's ends hidden
        cols += [
            Column(f"vs_{i}", m),
            Column(f"vs_{i}_lo", "", False),
            Column(f"vs_{i}_hi", "", False),
        ]
    t = Table("improvement", f"{bi.lb.title}: probability of improvement P(row > column)", cols)
    for x in models:
        raw, text = [x], {}
        for i, y in enumerate(models):
            v = bi.improvement.get((x, y))
            raw += [None] * 3 if v is None else list(v[:3])
            if v is not None:
                text[f"vs_{i}"] = stats.interval_text(*v[:3])
        t.add(raw, text)
    t.notes.append(
        "P(X > Y) + 0.5 P(X = Y) over every pair of seeds, averaged over the datasets both models"
        " have (rliable's probability_of_improvement); 95 % interval from resampling each model's"
        " seeds independently within each dataset. 0.5: no difference."
    )
    return t


def paired_table(
    boards: Sequence[BoardIntervals], a: str, b: str, name: str = "paired"
) -> Table | None:
    """A - B per board and dataset both ran, paired over the same draws; None where none has."""
    t = Table(
        name,
        f"{a} against {b}: paired differences of mIoU",
        [
            *columns("board=Protocol; dataset=Dataset", text="board dataset"),
            Column("a", a),
            Column("b", b),
            Column("diff", f"{a} − {b} [95 % interval]"),
            *columns("lo=; hi=; tiles=Tiles; scenes=Scenes; note=Note", "note", "lo hi"),
        ],
        notes=[
            "Paired bootstrap: each draw resamples the test scenes once and scores both models"
            " (every seed) on them, so the interval is that of the difference on the same tiles."
        ],
    )
    for bi in boards:
        for d in bi.lb.datasets:
            ca, cb = bi.cells.get((a, d)), bi.cells.get((b, d))
            if ca is None or cb is None:
                continue
            p = stats.paired_difference(ca, cb)
            diff, lo, hi, note = (
                (ca.mean - cb.mean, None, None, p) if isinstance(p, str) else (*p, "")
            )
            if not note:
                note = (
                    "differs (interval excludes 0)"
                    if lo > 0 or hi < 0
                    else "no difference shown (interval contains 0)"
                )
            t.add(
                [bi.lb.title, d, ca.mean, cb.mean, diff, lo, hi, ca.tiles, ca.scenes, note],
                {"dataset": dataset_display_name(d), "diff": stats.interval_text(diff, lo, hi)},
            )
    return t if t.rows else None


def resolve_model(name: str, boards: Sequence[BoardIntervals]) -> str:
    """A display name from a catalog id or display name given to --compare."""
    names = {m for bi in boards for m in bi.lb.model_names}
    if name in names:
        return name
    for bi in boards:
        for row in bi.lb.rows:
            if any(name in c.model_ids for c in row.cells.values()):
                return row.name
    raise ReportError(
        f"--compare: no model {name!r} among the ranked runs (found: {', '.join(sorted(names))})"
    )


def profile_taus(scores: dict[str, dict[str, list[float]]]) -> np.ndarray:
    """The thresholds a performance profile is drawn at: the span of every score, 101 steps."""
    flat = [v for per in scores.values() for vs in per.values() for v in vs]
    lo, hi = (min(flat), max(flat)) if flat else (0.0, 100.0)
    pad = max(1.0, 0.05 * (hi - lo))
    return np.linspace(lo - pad, hi + pad, 101)
