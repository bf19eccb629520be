"""Embedding runs in the report: NeuCo-Bench's leaderboard per dataset and, per model, probe Q next
to segmentation mIoU (Spearman): does the cheap probe predict the expensive ranking?"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

import numpy as np

from ...report import plots, stats
from ...report.records import Results, Run, distinct_labels
from ...report.tables import Column, Table, columns, fmt
from .neuco import leaderboard as neuco_leaderboard
from .neuco import q_draws

NOTES = (
    "Rank: per task, runs ranked by -Q (ties share the lower rank); task weight = std of Q across"
    " runs over the sum of those stds; aggregated rank = rank of the weighted sum of ranks"
    " (NeuCo-Bench). So rank 1 need not have the highest mean Q.",
    "Mean Q: NeuCo-Bench's own (per task 2A/(0.02 + dA) over folds, averaged over seeds, then"
    " tasks); its 95 % interval: bootstrap over each run's folds"
    f" ({stats.DRAWS} draws, seeded), covering the spread of the folds only (docs/statistics.md).",
)


def q_interval(runs: list[Run], *names: str) -> tuple[float, float] | None:
    """The 95 % bootstrap interval over folds of a row's mean Q; None for records without folds."""
    folds = [r.record.get("task_folds") for r in runs]
    if not folds or not all(isinstance(f, dict) and f for f in folds):
        return None
    d = q_draws(folds, stats.DRAWS, stats.rng_for("embedding", *names))
    lo, hi = stats.percentile_interval(d)
    return float(lo), float(hi)


def _probe(r: Run) -> dict:
    return r.record.get("probe") or {}


def run_name(r: Run) -> str:
    """A run's row: its model, with the probe named where it is not NeuCo-Bench's linear one."""
    p = _probe(r).get("probe")
    return f"{r.model_name} [{p}]" if p and p != "linear" else r.model_name


def _mean(v: list[float]) -> float:
    v = [x for x in v if x is not None and math.isfinite(x)]
    return float(np.mean(v)) if v else math.nan


def _row_q(runs: list[Run]) -> tuple[dict[str, dict[str, float]], dict[str, list[Run]]]:
    """Per row (model id, recipe): each task's Q averaged over seeds, and the row's runs."""
    names = distinct_labels({(r.model, r.recipe_digest): r for r in runs}, base=run_name)
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    of_row: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        name = names[(r.model, r.recipe_digest)]
        of_row[name].append(r)
        for t, q in (r.metrics.get("task_Q") or {}).items():
            per[name][t].append(math.nan if q is None else float(q))
    q = {
        name: {t: float(np.mean(v)) if v else math.nan for t, v in tasks.items()}
        for name, tasks in per.items()
    }
    return q, of_row


def _leaderboard(ds: str, label_set: str, runs: list[Run], sets: int) -> Table:
    q, of_row = _row_q(runs)
    lb = neuco_leaderboard(q)
    tasks = sorted({t for v in q.values() for t in v})
    tag = f"label set {label_set[:8]}" if sets > 1 else ""
    t = Table(
        name=f"embedding_leaderboard_{ds}" + (f"_{label_set[:8]}" if tag else ""),
        title=f"Embedding probes on {ds}" + (f" ({tag})" if tag else "") + ": NeuCo-Bench ranking",
        columns=columns(
            "rank=Rank; model=Model; q_mean=Mean Q; q_interval=95 % interval (folds); q_lo=; q_hi=",
            text="model q_interval",
            hidden="q_lo q_hi",
        )
        + [Column(f"q_{k}", k) for k in tasks],
    )
    for row in lb.rows:
        name = row["run"]
        iv = q_interval(of_row[name], ds, label_set, name)
        lo, hi = iv if iv else (None, None)
        shown = f"[{fmt(lo, 3)}, {fmt(hi, 3)}]" if iv else "no per-fold data"
        per_task = [q[name].get(k) for k in tasks]
        t.add(
            [row["aggregated_rank"], name, row["mean_score"], shown, lo, hi] + per_task,
            [fmt(row["aggregated_rank"], 0), str(name), fmt(row["mean_score"], 3), shown]
            + [fmt(v, 3) for v in (lo, hi, *per_task)],
        )
    t.notes += NOTES
    if tag:
        t.notes.append(
            f"Label set {label_set[:8]}: tasks {', '.join(tasks)}; {ds} has runs on"
            f" {sets} label sets, each ranked on its own."
        )
    if lb.dropped:
        t.notes.append(
            "Dropped for a NaN Q (more than 30% of a task's probes failed, without a finite"
            f" score): {', '.join(lb.dropped)}"
        )
    return t


def leaderboard_tables(res: Results) -> list[Table]:
    """One NeuCo-Bench leaderboard per dataset and label set (never pooling other labels' runs)."""
    by_ds: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for r in res.of("embedding"):
        by_ds[(r.dataset, str(r.record.get("label_set") or ""))].append(r)
    sets = Counter(ds for ds, _ in by_ds)
    return [_leaderboard(ds, ls, runs, sets[ds]) for (ds, ls), runs in sorted(by_ds.items())]


def spearman(a: list[float], b: list[float]) -> float:
    """NaN below three pairs or where a side is constant: n/a, not a correlation of noise."""
    if len(a) < 3:
        return math.nan
    from scipy.stats import spearmanr

    rho = spearmanr(a, b).statistic
    return float(rho) if rho == rho else math.nan


def _paired(emb: list[Run], seg: list[Run]) -> tuple[dict, dict, dict, set]:
    """Probe Q and mIoU per model on the datasets both ran (else over all), with display names."""
    shared = {r.dataset for r in emb} & {r.dataset for r in seg}
    key = (lambda r: (r.model, r.dataset)) if shared else (lambda r: (r.model,))
    q, m, names = defaultdict(list), defaultdict(list), {}
    for r in (r for r in emb if not shared or r.dataset in shared):
        q[key(r)].append(r.metrics.get("Q"))
    for r in (r for r in seg if not shared or r.dataset in shared):
        m[key(r)].append(r.miou)
        names[key(r)] = r.model_name
    return q, m, names, shared


def probe_vs_segmentation(
    res: Results, protocol: str = "frozen"
) -> tuple[Table, list[tuple[str, float, float]]] | None:
    """Per model: probe Q and segmentation mIoU (shared datasets, else means), rank-correlated."""
    seg = [r for r in res.runs if r.protocol == protocol and math.isclose(r.fraction, 1.0)]
    if not res.of("embedding") or not seg:
        return None
    linear = [r for r in res.of("embedding") if _probe(r).get("probe", "linear") == "linear"]
    q, m, names, shared = _paired(linear or res.of("embedding"), seg)
    both = sorted(k for k in q if k in m)
    if not both:
        return None
    t = Table(
        name="probe_vs_segmentation",
        title=f"Probe Q against {protocol} segmentation mIoU",
        columns=columns("model=Model; dataset=Dataset; q=Probe Q; miou=mIoU", "model dataset"),
    )
    pts = []
    for k in both:
        qq, mm = _mean(q[k]), _mean(m[k])
        ds = k[1] if len(k) > 1 else "all (means)"
        t.add([names[k], ds, qq, mm], [names[k], ds, fmt(qq, 3), fmt(mm, 2)])
        pts.append((names[k] + (f" ({ds})" if len(k) > 1 and len(shared) > 1 else ""), qq, mm))
    finite = [(a, b) for _, a, b in pts if math.isfinite(a) and math.isfinite(b)]
    rho = spearman([a for a, _ in finite], [b for _, b in finite])
    t.notes.append(
        f"Spearman rank correlation between probe Q and mIoU over {len(finite)} (model, dataset)"
        " pairs: " + (f"{rho:.2f}" if math.isfinite(rho) else "n/a (fewer than 3 pairs)")
    )
    return t, pts


def sections(page, res: Results) -> None:
    """The family's report section: NeuCo-Bench rankings, probe Q against mIoU."""
    if not res.of("embedding"):
        return
    sec = page.section("Embedding probes (NeuCo-Bench)")
    for t in leaderboard_tables(res):
        page.table(sec, "embedding", t)
    both = probe_vs_segmentation(res)
    if both is not None:
        t, pts = both
        page.table(sec, "embedding", t)
        title, axes = "Probe Q against segmentation mIoU", ("probe Q (NeuCo-Bench)", "mIoU (%)")
        fig = plots.labelled_scatter(pts, page.stem("probe_q_vs_miou"), title, *axes)
        page.figure(sec, fig, t.notes[-1])
