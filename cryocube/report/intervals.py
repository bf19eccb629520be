"""The uncertainty tables (docs/statistics.md): cells with bootstrap intervals over test scenes,
across-dataset IQM and mean, probability of improvement, paired comparisons. `stats` computes; this
module reads the runs' per-tile files and lays the figures out."""

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
from .tables import MISSING, Column, Table, columns, fmt

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


def tiles_url(run: Run) -> list[str]:
    """Where a run's per_tile.npz may be: the URL its record names, else beside its record (a moved
    results folder)."""
    pt = run.record.get("per_tile")
    if not isinstance(pt, dict):
        return []
    cands = [str(pt["url"])] if pt.get("url") else []
    base = run.source.rsplit(":", 1)[0].rsplit("/", 1)[0]
    cands.append(store.join(base, "runs", run.run_id, str(pt.get("file") or "per_tile.npz")))
    return cands


def load_tiles(run: Run) -> stats.TileData | None:
    """The run's per-tile confusion matrices; None for a record from before they were kept."""
    cands = tiles_url(run)
    if not cands:
        return None
    sha = (run.record.get("per_tile") or {}).get("sha256")
    for url in cands:
        if store.file_exists(url):
            try:
                return stats.read_tiles(store.read_bytes(url), url, sha)
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
    cache: dict[str, stats.TileData | None] = {}
    cells: dict[tuple[str, str], stats.CellInterval] = {}
    for d in lb.datasets:
        per_model = {}
        for row in lb.rows:
            c = row.cells.get(d)
            if c is None:
                continue
            ids = c.model_ids or ("",)
            got = []
            for s, v in zip(c.seeds, c.values):
                r = next(
                    (by_key[(row.name, d, m, s)] for m in ids if (row.name, d, m, s) in by_key),
                    None,
                )
                if r is not None and r.run_id not in cache:
                    cache[r.run_id] = load_tiles(r)
                got.append((v, cache.get(r.run_id) if r is not None else None))
            per_model[row.name] = got
        for m, ci in stats.dataset_intervals(
            d, per_model, draws=draws, seed=seed, board=lb.key
        ).items():
            cells[(m, d)] = ci
    scores = {
        row.name: {d: list(c.values) for d, c in row.cells.items()} for row in lb.rows if row.cells
    }
    aggs = stats.aggregates(scores, draws=draws, seed=seed, board=lb.key)
    poi = stats.improvement_matrix(scores, draws=draws, seed=seed, board=lb.key)
    return BoardIntervals(lb, cells, aggs, poi, scores)


def _range(r: tuple[int, int] | None) -> str:
    if r is None:
        return MISSING
    return str(r[0]) if r[0] == r[1] else f"{r[0]}–{r[1]}"


def _rank_columns(title: str = "Rank interval") -> list[Column]:
    """The columns `_rank_cells` fills: best and worst rank (hidden), their range, the ties."""
    return [
        Column("rank_best", "", show=False),
        Column("rank_worst", "", show=False),
        Column("rank", title, numeric=False),
        Column("ties", "Tied with", numeric=False),
    ]


def _interval_cells(v, lo, hi, decimals: int = 2) -> tuple[list, list]:
    """(raw, text) of the three columns a value with its interval takes: value, low, high."""
    text = [stats.interval_text(v, lo, hi, decimals), fmt(lo, decimals), fmt(hi, decimals)]
    return [v, lo, hi], text


def _rank_cells(rk: tuple[int, int] | None, ties: tuple[str, ...]) -> tuple[list, list]:
    """(raw, text) of `_rank_columns`: the bootstrap rank interval and the models tied with it."""
    best, worst = rk if rk else (None, None)
    raw = [best, worst, _range(rk), ", ".join(ties) or None]
    return raw, [fmt(best), fmt(worst), _range(rk), ", ".join(ties) or MISSING]


def cells_table(bi: BoardIntervals) -> Table:
    """Every segmentation cell with its interval, seed SD, rank interval and ties, and a note where
    the interval is missing or weak."""
    lb = bi.lb
    t = Table(
        "intervals",
        f"{lb.title}: mIoU with 95 % intervals over test scenes",
        columns(
            "model=Model; dataset=Dataset; miou=mIoU [95 % interval]; lo=; hi=; seed_sd=Seed SD;"
            " seeds=Seeds; tiles=Tiles; scenes=Scenes; resampled=Resampled",
            text="model dataset resampled",
            hidden="lo hi",
        )
        + _rank_columns()
        + [Column("note", "Note", numeric=False)],
    )
    for d in lb.datasets:
        for row in lb.rows:
            c = bi.cells.get((row.name, d))
            if c is None:
                continue
            iv_raw, iv_text = _interval_cells(c.mean, c.lo, c.hi, lb.decimals)
            rk_raw, rk_text = _rank_cells(c.rank, c.ties)
            raw = [
                row.name, d, *iv_raw, c.seed_sd, c.seeds, c.tiles, c.scenes, c.unit or None,
                *rk_raw, c.note or None,
            ]  # fmt: skip
            text = [
                row.name, dataset_display_name(d), *iv_text, fmt(c.seed_sd, lb.decimals),
                str(c.seeds), fmt(c.tiles), fmt(c.scenes), c.unit or MISSING, *rk_text,
                c.note or "",
            ]  # fmt: skip
            t.add(raw, text)
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
    t = Table(
        "across_datasets",
        f"{lb.title}: across datasets (IQM and mean of (dataset, seed) mIoU)",
        columns(
            "model=Model; iqm=IQM [95 % interval]; iqm_lo=; iqm_hi=; mean=Mean [95 % interval];"
            " mean_lo=; mean_hi=; datasets=Datasets; runs=Runs",
            text="model",
            hidden="iqm_lo iqm_hi mean_lo mean_hi",
        )
        + _rank_columns("IQM rank interval"),
    )
    for m, a in sorted(bi.aggregates.items(), key=lambda kv: -kv[1].iqm):
        iqm_raw, iqm_text = _interval_cells(a.iqm, a.iqm_lo, a.iqm_hi, lb.decimals)
        mean_raw, mean_text = _interval_cells(a.mean, a.mean_lo, a.mean_hi, lb.decimals)
        rk_raw, rk_text = _rank_cells(a.rank, a.ties)
        t.add(
            [m, *iqm_raw, *mean_raw, a.datasets, a.runs, *rk_raw],
            [m, *iqm_text, *mean_text, str(a.datasets), str(a.runs), *rk_text],
        )
    n = len(lb.datasets)
    t.notes.append(
        "IQM: the 25 % trimmed mean of every (dataset, seed) mIoU of the model (rliable's"
        " aggregate_iqm); intervals: 95 % stratified bootstrap, the seeds resampled within each"
        f" dataset ({stats.DRAWS} draws). They cover seed variation only, not the choice of the"
        f" {n} dataset(s) nor the test tiles (docs/statistics.md). Scores are raw mIoU, not"
        " normalised per dataset."
    )
    return t


def improvement_table(bi: BoardIntervals) -> Table:
    """The probability that the row model beats the column model on a dataset, with its interval."""
    lb = bi.lb
    models = [m for m in lb.model_names if m in bi.scores]
    t = Table(
        "improvement",
        f"{lb.title}: probability of improvement P(row > column)",
        [Column("model", "Model", numeric=False)]
        + [
            c
            for i, m in enumerate(models)
            for c in (
                Column(f"vs_{i}", m),
                Column(f"vs_{i}_lo", "", show=False),
                Column(f"vs_{i}_hi", "", show=False),
            )
        ],
    )
    for x in models:
        raw, text = [x], [x]
        for y in models:
            v = bi.improvement.get((x, y))
            cr, ct = ([None] * 3, [MISSING] * 3) if v is None else _interval_cells(*v[:3])
            raw, text = raw + cr, text + ct
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
    """A - B per board and dataset where both ran, with the interval of the same draws on the
    same test tiles; None where no board has both."""
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
            iv_raw, iv_text = _interval_cells(diff, lo, hi)
            t.add(
                [bi.lb.title, d, ca.mean, cb.mean, *iv_raw, ca.tiles, ca.scenes, note],
                [bi.lb.title, dataset_display_name(d), fmt(ca.mean), fmt(cb.mean), *iv_text]
                + [fmt(ca.tiles), fmt(ca.scenes), note],
            )
    if not t.rows:
        return None
    t.notes.append(
        "Paired bootstrap: each draw resamples the test scenes once and scores both models (every"
        " seed) on them, so the interval is that of the difference on the same tiles."
    )
    return t


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
