"""NeuCo-Bench (Embed2Scale challenge) scoring: the numbers that turn per-fold probe scores into Q,
pure functions so that the protocol runs alike in one process and fold by fold on a cluster."""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Iterable, NamedTuple

import numpy as np

from cryocube.errors import NeuCoError

from ... import store
from ...record import clean

Q_EPS = 0.02  # the FAQ's epsilon: Q_t = 2 * A_t / (0.02 + dA_t), capped at 100 when A_t = 1


def standardize(X: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """NaN -> 0, then (X - mu) / sigma with ONE scalar mean and population std over all of X, or of
    X[rows] (NeuCo-Bench's code: the labelled rows; its docs: the file)."""
    X = np.asarray(X, dtype=np.float32)
    X = np.where(np.isnan(X), np.float32(0.0), X)
    ref = X if rows is None else X[np.asarray(rows, dtype=np.int64)]
    if ref.size == 0:
        return X
    # NeuCo-Bench's arithmetic to the bit: float32 reductions over pandas' column-major array
    ref = np.asfortranarray(ref)
    mu = ref.mean()
    sigma = ref.std()
    if sigma == 0 or not np.isfinite(sigma):
        sigma = np.float32(1.0)
    return np.ascontiguousarray((X - mu) / sigma, dtype=np.float32)


def scale_labels(y: np.ndarray) -> np.ndarray:
    """Min-max labels to [0, 1] per task (per column of a 2-D y); constant labels: 0, NaN stays."""
    y = np.asarray(y, dtype=np.float64)
    cols = y.reshape(y.shape[0], -1) if y.ndim > 1 else y.reshape(-1, 1)
    out = np.full(cols.shape, np.nan)
    for j in range(cols.shape[1]):
        c = cols[:, j]
        ok = ~np.isnan(c)
        if not ok.any():
            continue
        lo, hi = c[ok].min(), c[ok].max()
        out[ok, j] = (c[ok] - lo) / (hi - lo) if hi > lo else 0.0
    return out.reshape(y.shape)


def shuffle_splits(
    n: int, k: int, test_size: float = 0.1, seed: int = 42
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Repeated random train/test splits, index for index sklearn's ShuffleSplit."""
    n, k = int(n), int(k)
    if k < 1:
        raise NeuCoError(f"the number of probe splits must be at least 1, got {k}.")
    if not 0 < test_size < 1:
        raise NeuCoError(f"test_size must lie strictly between 0 and 1, got {test_size}.")
    # same float expression as sklearn, so ceil(0.1 * 30) == 4 there too
    n_test = math.ceil(test_size * n)
    n_train = n - n_test
    if n_train < 1 or n_test < 1:
        raise NeuCoError(
            f"{n} labelled samples are too few for a {1 - test_size:.0%}/{test_size:.0%} split."
        )
    rng = np.random.RandomState(seed)
    perms = [rng.permutation(n) for _ in range(k)]
    return [(p[n_test : n_test + n_train], p[:n_test]) for p in perms]


def _scores(scores: Iterable[float]) -> np.ndarray:
    """Fold scores as a float64 vector; a probe without a finite score (None, NaN, inf): NaN."""
    out = np.array([np.nan if s is None else float(s) for s in scores], dtype=np.float64)
    out[~np.isfinite(out)] = np.nan
    return out


def task_stats(scores: Iterable[float]) -> tuple[float, float, float]:
    """(A_t, dA_t, Q_t): nanmean, population nanstd and 2*A/(0.02+dA) of a task's fold scores."""
    s = _scores(scores)
    s = s[~np.isnan(s)]
    if s.size == 0:
        return math.nan, math.nan, math.nan
    a, da = float(s.mean()), float(s.std())
    return a, da, 2.0 * a / (Q_EPS + da)


def q_draws(
    runs: list[dict[str, Iterable[float]]], draws: int, rng: np.random.Generator
) -> np.ndarray:
    """Bootstrap draws of a row's mean Q (folds resampled per run and task, averaged as the
    leaderboard does): the interval over folds NeuCo-Bench's Q lacks (docs/statistics.md)."""
    tasks = sorted({t for r in runs for t in r})
    per_task = []
    for t in tasks:
        qs = []
        for s in (_scores(r[t]) for r in runs if t in r):
            if s.size == 0:
                continue
            x = s[rng.integers(0, s.size, size=(draws, s.size))]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a draw of failed folds only
                a, da = np.nanmean(x, axis=1), np.nanstd(x, axis=1)
            qs.append(2.0 * a / (Q_EPS + da))
        if qs:
            per_task.append(np.mean(qs, axis=0))
    return np.mean(per_task, axis=0) if per_task else np.full(draws, math.nan)


def failed_probes(scores: Iterable[float]) -> int:
    """How many of a task's probes gave no finite score (R² 0.0 on equal targets is a score)."""
    return int(np.isnan(_scores(scores)).sum())


def allowed_failures(k: int, max_nan_fraction: float = 0.3) -> int:
    """floor(fraction * k): the challenge allows 3 failed probes of 10 per task."""
    return math.floor(max_nan_fraction * k + 1e-9)


def nan_rule(scores: Iterable[float], max_nan_fraction: float = 0.3) -> bool:
    """True if at most floor(fraction * k) probes failed (gave no finite score): 3 of 10."""
    s = _scores(scores)
    return failed_probes(s) <= allowed_failures(s.size, max_nan_fraction)


def _mean(values: Iterable[float]) -> float:
    """Plain mean over tasks: one NaN task makes the run's overall score NaN, visibly."""
    v = list(values)
    return float(np.mean(v)) if v else math.nan


def summarize(task_scores: dict[str, list[float]], max_nan_fraction: float = 0.3) -> dict[str, Any]:
    """The `results_summary.json` content (Q, A, std, fold scores, failed probes, the NaN rule)."""
    q, a, sd, folds, failed, failing = {}, {}, {}, {}, {}, []
    for task, scores in task_scores.items():
        a[task], sd[task], q[task] = task_stats(scores)
        folds[task] = [float(x) for x in _scores(scores)]
        failed[task] = failed_probes(scores)
        if not nan_rule(scores, max_nan_fraction):
            failing.append(task)
    return {
        "overall_q_score": _mean(q.values()),
        "overall_acc_score": _mean(a.values()),
        "task_q_scores": q,
        "task_acc_scores": a,
        "task_std_scores": sd,
        "task_fold_scores": folds,
        "task_failed_probes": failed,
        "tasks_failing_nan_rule": failing,
    }


def _write_json(url: str, obj: Any) -> None:
    store.write_atomic(url, json.dumps(clean(obj), indent=2, allow_nan=False) + "\n")


def write_results(
    out_dir: str | os.PathLike,
    task_scores: dict[str, list[float]],
    meta: dict | None = None,
    summary: dict | None = None,
):
    """NeuCo-Bench's `results_summary.json` and `<task>/<task>_result.json` into a folder or store
    URL (`summary`: default `summarize(task_scores)`) -> the summary file's path."""
    for task in task_scores:  # a folder name each
        if not task or task in (".", "..") or "/" in task or "\\" in task or os.sep in task:
            raise NeuCoError(f"task name {task!r} cannot be used as a folder name in the results.")
    out = str(out_dir).rstrip("/")
    summary = dict(summary or summarize(task_scores))
    for task in task_scores:  # every name checked before any file is written
        _write_json(
            f"{out}/{task}/{task}_result.json",
            {
                "q_stat": summary["task_q_scores"][task],
                "mean_score": summary["task_acc_scores"][task],
                "std_dev": summary["task_std_scores"][task],
                "q_t": summary["task_fold_scores"][task],
            },
        )
    if meta:
        summary["meta"] = dict(meta)
    path = f"{out}/results_summary.json"
    _write_json(path, summary)
    return path if store.is_remote(out) else Path(path)


class Leaderboard(NamedTuple):
    """Rows best first, the runs dropped for a NaN Q, and the task weights used."""

    rows: list[dict[str, Any]]
    dropped: list[str]
    weights: dict[str, float]


def rank_min(values: np.ndarray) -> np.ndarray:
    """Ascending ranks from 1 with ties at their minimum rank (scipy's rankdata(method="min"))."""
    v = np.asarray(values, dtype=np.float64)
    return np.searchsorted(np.sort(v), v, side="left") + 1


def leaderboard(q: dict[str, dict[str, float]]) -> Leaderboard:
    """NeuCo-Bench's dynamic rank aggregation of runs x tasks of Q (std-weighted mean task rank)."""
    tasks = list(dict.fromkeys(t for scores in q.values() for t in scores))
    if not tasks:
        raise NeuCoError("the leaderboard needs at least one task with a Q score.")
    kept, dropped = [], []
    for run, scores in q.items():
        vals = [scores.get(t) for t in tasks]
        if any(v is None or not math.isfinite(float(v)) for v in vals):
            dropped.append(run)
        else:
            kept.append((run, [float(v) for v in vals]))
    if not kept:
        return Leaderboard([], dropped, {t: 1.0 / len(tasks) for t in tasks})
    Q = np.array([v for _, v in kept])  # runs x tasks
    ranks = np.stack([rank_min(-Q[:, j]) for j in range(len(tasks))], axis=1)
    stds = Q.std(axis=0, ddof=1) if len(kept) > 1 else np.zeros(len(tasks))
    w = stds / stds.sum() if stds.sum() > 0 else np.full(len(tasks), 1.0 / len(tasks))
    weighted = ranks @ w
    # Round before ranking so that mathematically equal sums (same ranks, other task order) tie.
    agg = rank_min(np.round(weighted, 12))
    rows = [
        {
            "run": run,
            "mean_score": float(Q[i].mean()),
            "weighted_score": float(weighted[i]),
            "aggregated_rank": int(agg[i]),
            "task_ranks": {t: int(ranks[i, j]) for j, t in enumerate(tasks)},
        }
        for i, (run, _) in enumerate(kept)
    ]
    rows.sort(key=lambda r: (r["aggregated_rank"], -r["mean_score"], r["run"]))
    return Leaderboard(rows, dropped, {t: float(w[j]) for j, t in enumerate(tasks)})
