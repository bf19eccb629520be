"""Vectorised, seeded intervals: a cluster bootstrap of each cell's test split, and rliable's IQM,
mean and probability of improvement across datasets (docs/statistics.md: what each covers)."""

from __future__ import annotations

import hashlib
import io
import itertools
import math
import zlib
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

DRAWS = 2000  # bootstrap draws per interval
LEVEL = 0.95
SEED = 0  # the report's bootstrap seed
# below this many scenes a cluster interval covers the truth far less often than it says
# (docs/statistics.md: measured coverage at 2, 5 and 10 scenes)
FEW_SCENES = 10
NO_TILES = "no per-tile data"


def rng_for(*names: object, seed: int = SEED) -> np.random.Generator:
    """A generator seeded by the report's seed and a cell's name (not by the order of cells)."""
    return np.random.default_rng([seed, zlib.crc32("\x1f".join(map(str, names)).encode())])


def percentile_interval(draws: np.ndarray, level: float = LEVEL, axis: int = 0):
    """The percentile interval of bootstrap draws (rliable's default method)."""
    a = (1 - level) / 2 * 100
    return np.nanpercentile(draws, [a, 100 - a], axis=axis)


def cluster_interval(draws: np.ndarray, clusters: int, level: float = LEVEL, axis: int = 0):
    """The interval a cell reports: Hesterberg's (2015) expanded percentile interval of its cluster
    draws, tails at sqrt(n/(n-1)) t_(n-1), not z, for the bootstrap's n-1 over n variance and few
    units' t spread (without it a nominal 95 % covered 91-93 % at 20 scenes; docs/statistics.md)."""
    from scipy import stats as sps

    expanded = 1.0  # one cluster: the whole range of the draws
    if clusters >= 2:
        z = math.sqrt(clusters / (clusters - 1)) * sps.t.ppf(1 - (1 - level) / 2, clusters - 1)
        expanded = float(1 - 2 * sps.norm.sf(z))
    return percentile_interval(draws, expanded, axis=axis)


def miou(cms: np.ndarray) -> np.ndarray:
    """mIoU (%) of confusion matrices (..., K, K), as `metrics_from_confusion` computes it: the
    mean over classes present in prediction or truth; NaN where no class is."""
    cms = np.asarray(cms, dtype=np.float64)
    tp = np.diagonal(cms, axis1=-2, axis2=-1)
    union = cms.sum(-1) + cms.sum(-2) - tp
    present = union > 0
    iou = np.divide(tp, union, out=np.zeros_like(tp), where=present)
    n = present.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, 100 * iou.sum(-1) / n, np.nan)


def boot_miou(counts: np.ndarray, cms: np.ndarray, cluster: np.ndarray) -> np.ndarray:
    """mIoU (draws, seeds) of per-tile confusion (seeds, tiles, K, K) drawn by cluster counts."""
    (seeds, _, k, _), c = cms.shape, counts.shape[1]
    sums = np.zeros((seeds, c, k * k))
    np.add.at(sums, (slice(None), cluster), cms.reshape(seeds, -1, k * k))
    drawn = counts @ np.moveaxis(sums, 1, 0).reshape(c, -1)
    return miou(drawn.reshape(counts.shape[0], seeds, k, k))


@dataclass(frozen=True)
class TileData:
    """A run's test split, tile by tile: confusion (tiles, K, K), cube sample index, scene."""

    confusion: np.ndarray
    sample: np.ndarray
    source: np.ndarray


def read_tiles(data: bytes, where: str, sha256: str | None = None) -> TileData:
    """Parse a per_tile.npz; a checksum that differs from the record's is a ValueError naming it."""
    if sha256 and hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError(f"{where}: sha256 differs from the one its run record names (damaged?)")
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return TileData(
            np.asarray(z["confusion"], dtype=np.int64),
            np.asarray(z["sample"], dtype=np.int64),
            np.asarray(z["source"]).astype(str),
        )


@dataclass
class CellInterval:
    """One (model, dataset) cell: mean over seeds, seed SD, the bootstrap interval of that mean, n
    tiles and scenes, bootstrap rank interval; `draws` (draws,) kept for paired comparisons."""

    model: str
    dataset: str
    mean: float
    seed_sd: float | None
    seeds: int
    lo: float | None = None
    hi: float | None = None
    tiles: int | None = None
    scenes: int | None = None
    unit: str = ""  # "scene" | "tile": what the bootstrap resamples
    rank: tuple[int, int] | None = None
    ties: tuple[str, ...] = ()
    note: str = ""
    draws: np.ndarray | None = field(default=None, repr=False)
    group: str = ""  # the test split's digest: paired only within one


def dataset_intervals(
    dataset: str,
    cells: Mapping[str, Sequence[tuple[float, TileData | None]]],
    *,
    draws: int = DRAWS,
    seed: int = SEED,
    board: str = "",
) -> dict[str, CellInterval]:
    """Every model's cell on one dataset: {model: [(seed's mIoU, its tiles or None), ...]};
    one test split shares its draws (ranks, paired differences); no per-tile data, no interval."""
    out: dict[str, CellInterval] = {}
    groups: dict[str, list[str]] = {}
    for m, runs in cells.items():
        vals = np.array([v for v, _ in runs], dtype=float)
        sd = float(np.std(vals, ddof=1)) if vals.size > 1 else None
        c = CellInterval(m, dataset, float(vals.mean()), sd, int(vals.size))
        out[m] = c
        tiles = [t for _, t in runs]
        if any(t is None for t in tiles):
            c.note = NO_TILES
            continue
        # the test split's digest: a cell's seeds must share one
        keys = {hashlib.sha256(np.ascontiguousarray(t.sample).tobytes()).hexdigest() for t in tiles}
        if len(keys) > 1:
            c.note = "seeds tested on different tiles: no interval"
            continue
        c.group = keys.pop()[:12]
        groups.setdefault(c.group, []).append(m)
    for key, models in groups.items():
        first = cells[models[0]][0][1]
        scenes, cluster = np.unique(first.source, return_inverse=True)
        n_tiles, n_scenes = first.sample.size, scenes.size
        unit = "tile" if n_scenes == n_tiles else "scene"
        # each draw picks n_scenes scenes with replacement: (draws, scenes) counts
        rng = rng_for(board, dataset, key, seed=seed)
        counts = rng.multinomial(n_scenes, np.full(n_scenes, 1 / n_scenes), size=draws)
        for m in models:
            c = out[m]
            cms = np.stack([t.confusion for _, t in cells[m]])
            d = np.nanmean(boot_miou(counts, cms, cluster), axis=1)
            c.draws = d
            c.lo, c.hi = (float(x) for x in cluster_interval(d, n_scenes))
            c.tiles, c.scenes, c.unit = int(n_tiles), int(n_scenes), unit
            if unit == "scene" and n_scenes < FEW_SCENES:
                c.note = f"only {n_scenes} scenes: the interval is too narrow to trust"
        rank_and_ties({m: out[m] for m in models}, lambda c: (c.lo, c.hi))
    return out


def rank_and_ties(cells: dict, interval) -> None:
    """Each cell's 2.5-97.5 % rank over the draws they share (a lone cell: 1); its ties: the cells
    whose `interval(cell)` (lo, hi) overlaps its own."""
    mat = np.stack([c.draws for c in cells.values()], axis=1)  # (draws, cells)
    ranks = 1 + (mat[:, None, :] > mat[:, :, None]).sum(-1)
    best = np.percentile(ranks, 2.5, axis=0, method="lower")
    worst = np.percentile(ranks, 97.5, axis=0, method="higher")
    spans = {m: interval(c) for m, c in cells.items()}
    for (m, c), b, w in zip(cells.items(), best, worst):
        lo, hi = spans[m]
        c.rank = (int(b), int(w))
        c.ties = tuple(
            o
            for o, (o_lo, o_hi) in spans.items()
            if o != m and None not in (lo, o_lo) and o_lo <= hi and lo <= o_hi
        )


def paired_difference(a: CellInterval, b: CellInterval) -> tuple[float, float, float] | str:
    """A - B with its interval over the same draws and tiles; a sentence where they cannot pair."""
    if a.draws is None or b.draws is None:
        return NO_TILES
    if a.group != b.group:
        return "not tested on the same tiles: no paired interval"
    lo, hi = cluster_interval(a.draws - b.draws, a.scenes)
    return a.mean - b.mean, float(lo), float(hi)


def trimmed_mean(a: np.ndarray, axis: int = -1, cut: float = 0.25) -> np.ndarray:
    """scipy.stats.trim_mean along `axis`: int(cut * n) values cut from each end after sorting."""
    a = np.sort(np.asarray(a, dtype=float), axis=axis)
    n = a.shape[axis]
    k = int(cut * n)
    return np.take(a, np.arange(k, n - k), axis=axis).mean(axis=axis)


def _resample(rng: np.random.Generator, s, draws: int) -> np.ndarray:
    """(draws, n) draws with replacement of the n scores `s`."""
    s = np.asarray(s, dtype=float)
    return s[rng.integers(0, s.size, size=(draws, s.size))]


def improvement(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) + 0.5 P(X = Y) over all seed pairs (Mann-Whitney U / (n m)) of the last axes."""
    x, y = np.asarray(x, float)[..., :, None], np.asarray(y, float)[..., None, :]
    return ((x > y) + 0.5 * (x == y)).mean(axis=(-2, -1))


@dataclass
class Aggregate:
    """One model's across-dataset figures on one board."""

    model: str
    datasets: int
    runs: int
    iqm: float
    iqm_lo: float | None  # None: one seed per dataset, no interval
    iqm_hi: float | None
    mean: float
    mean_lo: float | None
    mean_hi: float | None
    rank: tuple[int, int] | None = None
    ties: tuple[str, ...] = ()
    draws: np.ndarray | None = field(default=None, repr=False)  # (draws,) IQM


def aggregates(
    scores: Mapping[str, Mapping[str, Sequence[float]]],
    *,
    draws: int = DRAWS,
    seed: int = SEED,
    board: str = "",
) -> dict[str, Aggregate]:
    """{model: {dataset: seed scores}} -> IQM (rliable's aggregate_iqm) and mean with stratified
    bootstrap intervals (seeds resampled within each dataset), and the IQM's rank interval."""
    out = {}
    for m, per in scores.items():
        ds = sorted(per)
        arrs = [np.asarray(per[d], dtype=float) for d in ds]
        rng = rng_for(board, "aggregate", m, seed=seed)
        res = np.concatenate([_resample(rng, a, draws) for a in arrs], axis=1)
        iq, mn = trimmed_mean(res, axis=1), res.mean(axis=1)
        flat = np.concatenate(arrs)
        (il, ih), (ml, mh) = percentile_interval(iq), percentile_interval(mn)
        if all(a.size < 2 for a in arrs):  # one seed per dataset: nothing to resample
            il = ih = ml = mh = None
        f = lambda v: None if v is None else float(v)  # noqa: E731
        out[m] = Aggregate(
            m, len(ds), int(flat.size), float(trimmed_mean(flat)), f(il), f(ih),
            float(flat.mean()), f(ml), f(mh), draws=iq,
        )  # fmt: skip
    rank_and_ties(out, lambda a: (a.iqm_lo, a.iqm_hi))
    return out


def improvement_matrix(
    scores: Mapping[str, Mapping[str, Sequence[float]]],
    *,
    draws: int = DRAWS,
    seed: int = SEED,
    board: str = "",
) -> dict[tuple[str, str], tuple[float, float, float, int]]:
    """{(X, Y): (P(X > Y), lo, hi, datasets)} over both's datasets; the interval resamples each
    model's seeds independently within each dataset (rliable's StratifiedIndependentBootstrap)."""
    out = {}
    for x, y in itertools.permutations(scores, 2):
        common = sorted(set(scores[x]) & set(scores[y]))
        if not common:
            continue
        rng = rng_for(board, "improvement", x, y, seed=seed)
        boot = np.zeros(draws)
        for d in common:
            bx = _resample(rng, scores[x][d], draws)
            boot += improvement(bx, _resample(rng, scores[y][d], draws))
        lo, hi = percentile_interval(boot / len(common))
        # rliable's probability_of_improvement: the mean over datasets of each one's P(X > Y)
        point = float(np.mean([improvement(scores[x][d], scores[y][d]) for d in common]))
        out[(x, y)] = (point, float(lo), float(hi), len(common))
    return out


def performance_profile(
    scores: Mapping[str, Mapping[str, Sequence[float]]], taus: np.ndarray
) -> dict[str, np.ndarray]:
    """rliable's score distribution: the fraction of a model's (dataset, seed) runs scoring above
    each threshold tau (each dataset weighted by its runs, as rliable's flattened matrix)."""
    out = {}
    for m, per in scores.items():
        flat = np.concatenate([np.asarray(v, dtype=float) for v in per.values()])
        out[m] = (flat[:, None] > np.asarray(taus)[None, :]).mean(axis=0)
    return out


def interval_text(v: float | None, lo: float | None, hi: float | None, decimals: int = 2) -> str:
    """'61.47 [60.10, 62.80]'; the value alone where no interval exists."""
    if v is None or not np.isfinite(v):
        return "–"
    if lo is None or hi is None:
        return f"{v:.{decimals}f}"
    return f"{v:.{decimals}f} [{lo:.{decimals}f}, {hi:.{decimals}f}]"
