"""Band statistics (exact merged moments, Chan et al.) and few-shot strata, computed while pixels
are in memory."""

from __future__ import annotations

import numpy as np

from .schema import STATS, _text


def stratum_keys(class_fraction: np.ndarray, bins: int = 3) -> np.ndarray:
    """Few-shot stratum of each sample as the reference sampler builds it: per class bin =
    ceil(ratio * bins) - 1, the bins joined as a string ("2-1": all background, binary task)."""
    cf = np.asarray(class_fraction, dtype=np.float64)
    b = np.ceil(np.round(cf * bins, 9)).astype(int) - 1
    return _text("".join(str(v) for v in row) for row in b)


def merge_moments(
    count: np.ndarray, mean: np.ndarray, m2: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge per-part (count, mean, M2) along axis 0 exactly (Chan et al.), in float64."""
    count, mean, m2 = (np.asarray(a, dtype=np.float64) for a in (count, mean, m2))
    n = count.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mu = np.where(n > 0, (count * np.where(count > 0, mean, 0.0)).sum(axis=0) / n, 0.0)
    dev = np.where(count > 0, mean - mu, 0.0)
    return n, mu, np.where(count > 0, m2, 0.0).sum(axis=0) + (count * dev * dev).sum(axis=0)


def _moments(px: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(count, mean, M2) per band of px (bands, pixels), float32 pairwise sums for float32 px;
    centring first (corrected two-pass) keeps low-contrast bands exact, the mean in float64."""
    n = px.shape[1]
    mean = px.sum(axis=1, dtype=np.float64) / n
    work = px.dtype if px.dtype.kind == "f" else np.float64
    d = px - mean.astype(work)[:, None]  # float32 stays float32; integer bands become float64
    off = d.sum(axis=1).astype(np.float64) / n  # the residue of centring on a rounded mean
    np.square(d, out=d)
    return n, mean, d.sum(axis=1).astype(np.float64) - n * off * off


def partial_stats(images: np.ndarray, labels: np.ndarray, use: np.ndarray) -> np.ndarray:
    """(len(STATS), bands) moments, min and max over valid pixels of the samples in `use`: each
    block task's share of the train statistics, so finalisation never reads the cube again."""
    c = images.shape[1]
    rows = []
    for i in np.flatnonzero(use):
        v = labels[i] >= 0
        nv = int(np.count_nonzero(v))
        if nv == 0:
            continue
        px = images[i].reshape(c, -1) if nv == v.size else images[i][:, v]
        n, mean, m2 = _moments(px)
        rows.append((np.full(c, n), mean, m2, px.min(axis=1), px.max(axis=1)))
    out = np.zeros((len(STATS), c))
    out[3], out[4] = np.inf, -np.inf
    if rows:
        counts, means, m2s, mins, maxs = (np.array(a) for a in zip(*rows))
        out[0], out[1], out[2] = merge_moments(counts, means, m2s)
        out[3], out[4] = mins.min(axis=0), maxs.max(axis=0)
    return out


def combine_stats(parts: np.ndarray) -> dict[str, np.ndarray]:
    """Per-block partials -> mean/std/min/max (population std)."""
    parts = np.asarray(parts, dtype=np.float64)
    count, mean, m2 = merge_moments(parts[:, 0], parts[:, 1], parts[:, 2])
    mn, mx = parts[:, 3].min(axis=0), parts[:, 4].max(axis=0)
    has = count > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        var = np.maximum(m2 / count, 0.0)
    stats = {"mean": mean, "std": np.sqrt(var), "min": mn, "max": mx}
    return {**{k: np.where(has, v, np.nan) for k, v in stats.items()}, "count": count}
