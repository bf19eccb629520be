"""The protocol pages' tables, from leaderboards and runs (rendering and files are the caller's)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

from ..report.leaderboard import Leaderboard, best_two
from ..report.names import dataset_display_name, model_sort_key
from ..report.published import Mismatch
from ..report.records import DEVIATES, RANDOM_INIT, Results, Run
from ..report.tables import MISSING, Column, Table, columns, fmt

RANK_NOTE = (
    "Rank: competition ranking per dataset (ties share the best rank), averaged over the datasets a"
    " model has; ties judged at 0.01 mIoU."
)
MARK_NOTE = (
    "Bold = best, underlined = second best (per column; in the average columns only rows averaged "
    "over every dataset are marked)."
)


def _d(d: str) -> str:
    return dataset_display_name(d)


def _signed(v: float | None) -> str:
    return MISSING if v is None else f"{v:+.2f}"


def _avg_text(v: float | None, n: int, total: int, decimals: int = 2) -> str:
    if v is None:
        return MISSING
    return fmt(v, decimals) + ("" if n == total else f" ({n}/{total})")


@dataclass
class Cost:
    """What a model's runs of one protocol cost."""

    params_encoder: int | None
    params_decoder: int | None
    gflops: float | None
    samples_per_s: float | None
    peak_memory_mb: float | None
    gpu_hours: float
    cpu_hours: float
    n_runs: int
    precision: str = "fp32"
    # "measured on <device>" (a `list models --profile` cache), "catalog" (copied), "" (none)
    gflops_source: str = ""
    profile: dict | None = None  # the measured profile entry, when one exists

    @property
    def params_m(self) -> float | None:
        """Encoder plus decoder parameters, in millions."""
        parts = [p for p in (self.params_encoder, self.params_decoder) if p is not None]
        return sum(parts) / 1e6 if parts else None


def _mean(vals: Sequence[float | None]) -> float | None:
    v = [x for x in vals if x is not None]
    return statistics.fmean(v) if v else None


def _median_int(vals: Sequence[int | None]) -> int | None:
    v = [x for x in vals if x is not None]
    return int(statistics.median(v)) if v else None


def costs(runs: Sequence[Run], measured: dict[str, dict] | None = None) -> dict[str, Cost]:
    """Per display name: median parameters, mean GFLOPs and throughput, max memory, device hours.
    GFLOPs measured (`models.profile.measured_costs`) win over the records' copy of the catalog's.
    """
    measured = measured or {}
    by: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by[r.model_name].append(r)
    out = {}
    for m, rs in by.items():
        hours = {"cuda": 0.0, "cpu": 0.0}
        for r in rs:
            if r.total_s is not None:
                hours["cuda" if r.device.startswith("cuda") else "cpu"] += r.total_s / 3600
        mem = [r.peak_memory_mb for r in rs if r.peak_memory_mb is not None]
        prof = measured.get(rs[0].model)
        gflops = _mean([r.gflops for r in rs])
        source = "catalog" if gflops is not None else ""
        if prof is not None:
            gflops, source = (
                float(prof["gflops"]),
                f"measured on {prof.get('device', 'an unnamed device')}",
            )
        out[m] = Cost(
            _median_int([r.params[0] for r in rs]),
            _median_int([r.params[1] for r in rs]),
            gflops,
            _mean([r.samples_per_s for r in rs]),
            max(mem) if mem else None,
            hours["cuda"],
            hours["cpu"],
            len(rs),
            ", ".join(sorted({r.precision for r in rs})),
            source,
            prof,
        )
    return out


COST_COLUMNS = columns(
    "params_M=Params (M); gflops=GFLOPs; samples_per_s=samples/s; gpu_hours=GPU h; cpu_hours=CPU h"
)


def _cost_values(c: Cost | None) -> list:
    if c is None:
        return [None] * len(COST_COLUMNS)
    return [c.params_m, c.gflops, c.samples_per_s, c.gpu_hours, c.cpu_hours]


def _cost_texts(c: Cost | None) -> list[str]:
    v = _cost_values(c)
    return [fmt(v[0], 1), fmt(v[1], 1), fmt(v[2], 1), fmt(v[3], 3), fmt(v[4], 3)]


def _mark_complete(
    t: Table, lb: Leaderboard, key: str, values: dict[int, float | None], higher: bool
) -> None:
    eligible = {i: v for i, v in values.items() if v is not None and lb.complete(lb.rows[i])}
    t.mark(best_two(eligible, higher_is_better=higher, decimals=lb.decimals), key)


def leaderboard_table(
    lb: Leaderboard, cost: dict[str, Cost] | None = None, mismatches: Sequence[Mismatch] = ()
) -> Table:
    """The paper's table: mIoU per dataset, average mIoU, average rank (+ printed values and
    costs)."""
    has_pub = any(r.published_avg is not None or r.published_rank is not None for r in lb.rows)
    cols = [Column("model", "Model", numeric=False)] + [Column(d, _d(d)) for d in lb.datasets]
    cols += columns(
        "avg_mIoU=Avg mIoU; n_datasets=datasets; avg_rank=Avg rank", hidden="n_datasets"
    )
    if has_pub:
        cols += columns("avg_mIoU_published=Avg (printed); avg_rank_published=Rank (printed)")
    t = Table(
        "leaderboard", f"{lb.title}: mIoU (%)", cols + (COST_COLUMNS if cost is not None else [])
    )
    bad = {(m.model, m.field) for m in mismatches}
    n = len(lb.datasets)
    for r in lb.rows:
        cells = [r.cells.get(d) for d in lb.datasets]
        raw = [r.name] + [c.mean if c else None for c in cells] + [r.avg, r.n_avg, r.avg_rank]
        text = [r.name] + [fmt(c.mean if c else None, lb.decimals) for c in cells]
        text += [
            _avg_text(r.avg, r.n_avg, n, lb.decimals),
            str(r.n_avg),
            _avg_text(r.avg_rank, r.n_avg, n),
        ]
        if has_pub:
            raw += [r.published_avg, r.published_rank]
            text += [
                fmt(v) + (" †" if (r.name, f) in bad else "")
                for v, f in ((r.published_avg, "avg_mIoU"), (r.published_rank, "avg_rank"))
            ]
        if cost is not None:
            raw += _cost_values(cost.get(r.name))
            text += _cost_texts(cost.get(r.name))
        t.add(raw, text)
    for d in lb.datasets:
        means = {i: r.cells[d].mean for i, r in enumerate(lb.rows) if d in r.cells}
        t.mark(best_two(means, decimals=lb.decimals), d)
    _mark_complete(t, lb, "avg_mIoU", {i: r.avg for i, r in enumerate(lb.rows)}, True)
    _mark_complete(t, lb, "avg_rank", {i: r.avg_rank for i, r in enumerate(lb.rows)}, False)
    t.notes += _leaderboard_notes(lb, cost, mismatches)
    return t


def _leaderboard_notes(
    lb: Leaderboard, cost: dict[str, Cost] | None, mismatches: Sequence[Mismatch]
) -> list[str]:
    n, notes = len(lb.datasets), []
    if any(r.name.endswith(RANDOM_INIT) for r in lb.rows):
        notes.append(
            f"Rows marked{RANDOM_INIT} ran a pretrained model WITHOUT its checkpoint"
            " (--allow-random-weights): they measure the pipeline, not the model."
        )
    if any(DEVIATES in r.name for r in lb.rows):
        notes.append(
            f"Rows marked{DEVIATES}…) ran with a declared deviation from the Cryo-Bench reference"
            " in effect (docs/deviations.md); --set follow_reference=true runs the reference's"
            " behaviour."
        )
    notes += [
        RANK_NOTE,
        MARK_NOTE,
        (
            f"A missing cell is shown as {MISSING}; an average over fewer than the {n} datasets"
            f" says (k/{n})."
        ),
    ]
    if len(lb.seeds) > 1:
        notes.append(
            f"Cells are means over seeds {', '.join(map(str, lb.seeds))}; see the robustness table."
        )
    if mismatches:
        notes.append(
            "† printed value differs from the one recomputed from the per-dataset numbers: "
            + "; ".join(map(str, mismatches))
            + "."
        )
    if cost is not None:
        srcs = sorted({c.gflops_source for c in cost.values() if c.gflops_source})
        notes.append(
            "Cost: parameters = encoder + decoder (median over runs), samples/s averaged over the"
            " model's runs, GPU/CPU hours = total wall time of the runs on each device; encoder"
            f" GFLOPs per sample {' / '.join(srcs) if srcs else 'not recorded'} (the cost table"
            " says which per model)."
        )
    return notes + lb.notes


_ROBUST = (
    ("mean", "{} mean ± std (n)", True),
    ("std", "{} std", False),
    ("n", "{} seeds", False),
    ("Q", "{} Q", True),
    ("rank", "{} rank (range)", True),
    ("rank_best", "", False),
    ("rank_worst", "", False),
)


def _robust_cells(c, decimals: int) -> tuple[list, list[str]]:
    """One dataset's cells of the robustness table: mean ± std (n), Q, the rank and its range."""
    if c is None:
        return [None] * len(_ROBUST), [MISSING] * len(_ROBUST)
    best, worst = c.rank_range or (c.rank, c.rank)
    ms = fmt(c.mean, decimals) + (f" ± {fmt(c.std, decimals)}" if c.std is not None else "")
    rk = str(c.rank) + (f" ({best}–{worst})" if best != worst else "")
    return [c.mean, c.std, c.n, c.stability, c.rank, best, worst], [
        f"{ms} ({c.n})",
        fmt(c.std),
        str(c.n),
        fmt(c.stability, 1),
        rk,
        str(best),
        str(worst),
    ]


def _place_cells(pr: tuple[int, int] | None) -> tuple[list, list[str]]:
    """The place over per-seed leaderboards: its best, worst, range and whether seeds flip it."""
    if pr is None:
        return [None] * 4, [MISSING] * 4
    span = f"{pr[0]}–{pr[1]}"
    return [pr[0], pr[1], span, pr[0] != pr[1]], [
        str(pr[0]),
        str(pr[1]),
        span if pr[0] != pr[1] else str(pr[0]),
        fmt(pr[0] != pr[1]),
    ]


def robustness_table(lb: Leaderboard) -> Table:
    """Mean ± std over seeds, stability Q and the rank interval per cell, and the place over
    seeds."""
    cols = [Column("model", "Model", numeric=False)]
    cols += [
        Column(f"{d}_{k}", h.format(_d(d)), show) for d in lb.datasets for k, h, show in _ROBUST
    ]
    cols += columns(
        "place=Place; place_best=; place_worst=; place_over_seeds=Place over seeds;"
        " seed_flip=Seeds flip it",
        text="place_over_seeds seed_flip",
        hidden="place_best place_worst",
    )
    t = Table("robustness", f"{lb.title}: robustness over seeds", cols)
    for r in lb.rows:
        raw, text = [r.name], [r.name]
        for d in lb.datasets:
            cr, ct = _robust_cells(r.cells.get(d), lb.decimals)
            raw, text = raw + cr, text + ct
        pr, pt = _place_cells(r.place_range)
        t.add(raw + [r.place] + pr, text + [fmt(r.place)] + pt)
    for d in lb.datasets:
        q = {i: r.cells[d].stability for i, r in enumerate(lb.rows) if d in r.cells}
        t.mark(best_two(q, decimals=1), f"{d}_Q")
    t.notes += [
        "mean ± std: over seeds, sample std (ddof 1); n = number of seeds.",
        (
            "Q = 2·A/(0.02 + ΔA) with A = mean/100 and ΔA = population std/100 over seeds"
            " (NeuCo-Bench's stability-weighted score; 100 = perfect and perfectly repeatable);"
            " shown from two seeds on."
        ),
        (
            "Rank (range): the rank of the mean, and the best–worst rank the cell could take if"
            " every model's score were any of its seeds' scores; a range means seeds can flip the"
            " ranking."
        ),
        (
            "Place: position by average rank; place over seeds: the range of that position over"
            " per-seed leaderboards."
        ),
    ]
    return t


def _two_boards(base: Leaderboard, other: Leaderboard) -> tuple[list[str], list[str]]:
    """The datasets both boards have (the other's where none is shared), every model of either."""
    datasets = [d for d in base.datasets if d in other.datasets] or list(other.datasets)
    return datasets, sorted(set(base.model_names) | set(other.model_names), key=model_sort_key)


def retention_table(full: Leaderboard, few: Leaderboard) -> Table:
    """Few-shot retention: few-shot mIoU / full-label mIoU, per dataset and on the averages."""
    datasets, models = _two_boards(full, few)
    pct = int(round(few.fraction * 100))
    cols = [Column("model", "Model", numeric=False)] + [Column(d, f"{_d(d)} %") for d in datasets]
    cols += columns(
        f"avg_fewshot=Avg mIoU {pct}%; avg_full=Avg mIoU 100%; retention=Retention %;"
        " n_datasets=datasets"
    )
    t = Table(
        "fewshot_retention", f"Few-shot retention ({pct}% labels vs 100%, frozen encoder)", cols
    )
    ret = {}
    for i, m in enumerate(models):
        pairs = {d: (few.mean(m, d), full.mean(m, d)) for d in datasets}
        both = {
            d: p for d, p in pairs.items() if p[0] is not None and p[1] is not None and p[1] > 0
        }
        per = [100 * both[d][0] / both[d][1] if d in both else None for d in datasets]
        a10 = _mean([p[0] for p in both.values()])
        a100 = _mean([p[1] for p in both.values()])
        ret[i] = 100 * a10 / a100 if a10 is not None and a100 else None
        t.add([m] + per + [a10, a100, ret[i], len(both)])
    t.mark(best_two(ret, decimals=2), "retention")
    t.notes += [
        f"Retention = average {pct}%-label mIoU / average 100%-label mIoU × 100, over the datasets"
        " where the model has both (count in the last column); per-dataset columns are the same"
        " ratio."
    ]
    return t


def finetune_gain_table(frozen: Leaderboard, finetune: Leaderboard) -> Table:
    """Fine-tuning gain over the frozen encoder, in mIoU points and relative %."""
    datasets, models = _two_boards(frozen, finetune)
    cols = [Column("model", "Model", numeric=False)]
    for d in datasets:
        cols += [Column(f"{d}_gain", f"{_d(d)} Δ (rel.)"), Column(f"{d}_rel_pct", "", show=False)]
    cols += columns("avg_gain=Avg Δ mIoU; avg_rel_pct=Avg relative %; n_datasets=datasets")
    t = Table("finetune_gain", "Fine-tuning gain over the frozen encoder", cols)
    rels = {}
    for i, m in enumerate(models):
        raw, text, gains, rel = [m], [m], [], []
        for d in datasets:
            fz, ft = frozen.mean(m, d), finetune.mean(m, d)
            if fz is None or ft is None:
                raw += [None, None]
                text += [MISSING, MISSING]
                continue
            g, rp = ft - fz, (100 * (ft - fz) / fz if fz else None)
            gains.append(g)
            rel.append(rp)
            raw += [g, rp]
            text += [f"{g:+.2f}" + (f" ({rp:+.1f}%)" if rp is not None else ""), fmt(rp, 1)]
        ag, ar = _mean(gains), _mean(rel)
        rels[i] = ar
        t.add(
            raw + [ag, ar, len(gains)],
            text
            + [
                _signed(ag),
                _signed(ar),
                str(len(gains)),
            ],
        )
    t.mark(best_two(rels, decimals=2), "avg_rel_pct")
    t.notes += [
        "Δ = fine-tuned mIoU − frozen mIoU (points); relative = Δ / frozen × 100; averages over the"
        " datasets where the model has both protocols (the paper reports the average relative"
        " improvement)."
    ]
    return t


def _class_order(dataset: str, names: set[str]) -> list[str]:
    try:
        from ..catalog import load_dataset

        order = [c.name for c in load_dataset(dataset).classes]
    except Exception:  # unknown dataset or catalog not readable: keep the records' own order
        order = []
    return [c for c in order if c in names] + sorted(names - set(order))


def per_class_tables(lb: Leaderboard, runs: Sequence[Run]) -> list[Table]:
    """Per dataset: IoU of every class (mean over the seeds of the runs behind each cell)."""
    tables = []
    for d in lb.datasets:
        per_model: dict[str, dict[str, list[float]]] = {}
        for r in runs:
            cell = lb.row(r.model_name).cells.get(d) if lb.row(r.model_name) else None
            if r.dataset != d or cell is None or (cell.model_ids and r.model not in cell.model_ids):
                continue
            for c, v in r.class_iou.items():
                per_model.setdefault(r.model_name, {}).setdefault(c, []).append(v)
        if not per_model:
            continue
        classes = _class_order(d, {c for v in per_model.values() for c in v})
        models = [m for m in lb.model_names if m in per_model]
        t = Table(
            f"per_class_iou_{d}",
            f"{lb.title}: per-class IoU (%) on {_d(d)}",
            [Column("model", "Model", numeric=False)] + [Column(c, c) for c in classes],
        )
        for m in models:
            t.add([m] + [_mean(per_model[m].get(c, [])) for c in classes])
        for j, c in enumerate(classes, 1):
            t.mark(best_two({i: row[j] for i, row in enumerate(t.rows)}, decimals=lb.decimals), c)
        t.notes.append(
            "Mean over seeds of each class's test IoU; mIoU averages these classes, background"
            " included."
        )
        tables.append(t)
    return tables


def cost_table(lb: Leaderboard, cost: dict[str, Cost]) -> Table:
    """Accuracy beside what it cost, per model: parameters, GFLOPs (and where they come from),
    throughput, memory, device hours."""
    cols = columns(
        "model=Model; avg_mIoU=Avg mIoU; params_encoder_M=Encoder params (M);"
        " params_decoder_M=Decoder params (M); gflops=GFLOPs; gflops_source=GFLOPs from;"
        " encoder_samples_per_s=Encoder fwd samples/s; samples_per_s=samples/s;"
        " peak_memory_mb=Peak MB; gpu_hours=GPU h; cpu_hours=CPU h; n_runs=runs;"
        " precision=precision",
        text="model gflops_source precision",
    )
    t = Table("cost", f"{lb.title}: accuracy against cost", cols)
    for r in (r for r in lb.rows if r.name in cost):
        c = cost[r.name]
        pe, pd_ = (None if p is None else p / 1e6 for p in (c.params_encoder, c.params_decoder))
        enc = c.profile.get("samples_per_s") if c.profile else None
        enc_text = MISSING
        if enc:
            enc_text = (
                f"{fmt(enc, 2)} ({c.profile.get('precision')}, batch {c.profile.get('batch')})"
            )
        # (raw, decimals or the text) per column after the model's name
        cells = [
            (r.avg, _avg_text(r.avg, r.n_avg, len(lb.datasets))),
            (pe, 2),
            (pd_, 2),
            (c.gflops, 1),
            (c.gflops_source or None, c.gflops_source or MISSING),
            (enc, enc_text),
            (c.samples_per_s, 1),
            (c.peak_memory_mb, 0),
            (c.gpu_hours, 3),
            (c.cpu_hours, 3),
            (c.n_runs, str(c.n_runs)),
            (c.precision, c.precision),
        ]
        t.add(
            [r.name] + [v for v, _ in cells],
            [r.name] + [fmt(v, d) if isinstance(d, int) else d for v, d in cells],
        )
    t.notes.append(
        "GFLOPs: encoder forward per sample. 'measured on <device>': `cryocube list models"
        " --profile` (torch FlopCounterMode, 1 multiply-add = 2 FLOPs, attention counted);"
        " 'catalog': the published figure copied from the catalog (measured on the reference code),"
        " where no profile exists. Encoder fwd samples/s: the profile's, on its device; samples/s:"
        " training throughput of the runs. Hours = sum of the runs' total time."
    )
    return t


_VS_PAPER = (("ours", "ours"), ("paper", "paper"), ("delta", "Δ"))


def published_comparison_table(ours: Leaderboard, paper: Leaderboard) -> Table:
    """Our run beside the paper: per dataset ours / paper / Δ, then averages over the shared
    datasets."""
    datasets = [d for d in paper.datasets if d in ours.datasets]
    models = [m for m in paper.model_names if ours.row(m)] + [
        m for m in ours.model_names if not paper.row(m)
    ]
    cols = [Column("model", "Model", numeric=False)]
    for d in datasets:
        cols += [Column(f"{d}_{k}", f"{_d(d)} {h}") for k, h in _VS_PAPER]
    cols += columns(
        "avg_ours=Avg ours; avg_paper=Avg paper; avg_delta=Avg Δ; n_datasets=datasets;"
        " rank_ours=Avg rank ours; rank_paper=Avg rank paper"
    )
    t = Table(
        "published_comparison",
        "Our runs beside the published Cryo-Bench table (frozen, 100% labels)",
        cols,
    )
    for m in models:
        raw, text, o_l, p_l = [m], [m], [], []
        for d in datasets:
            o, p = ours.mean(m, d), paper.mean(m, d)
            dl = o - p if o is not None and p is not None else None
            if dl is not None:
                o_l.append(o)
                p_l.append(p)
            raw += [o, p, dl]
            text += [fmt(o), fmt(p), _signed(dl)]
        ao, ap = _mean(o_l), _mean(p_l)
        ad = ao - ap if ao is not None and ap is not None else None
        ro, rp = ours.row(m), paper.row(m)
        ranks = [ro.avg_rank if ro else None, rp.published_rank if rp else None]
        t.add(
            raw + [ao, ap, ad, len(o_l), *ranks],
            text + [fmt(ao), fmt(ap), _signed(ad), str(len(o_l)), *map(fmt, ranks)],
        )
    t.notes += [
        "Δ = ours − paper (mIoU points). Averages over the datasets where both have a number.",
        (
            "Avg rank ours ranks our models among themselves; the paper's rank is among its 16 rows"
            " as printed."
        ),
    ]
    return t


def consistency_table(lb: Leaderboard, mismatches: Sequence[Mismatch]) -> Table:
    """The printed table's averages and ranks against those recomputed from its own cells; a
    disagreement is marked."""
    cols = columns(
        "model=Model; avg_printed=Avg printed; avg_recomputed=Avg recomputed; avg_ok=Avg agrees;"
        " rank_printed=Rank printed; rank_recomputed=Rank recomputed; rank_ok=Rank agrees",
        text="model avg_ok rank_ok",
    )
    t = Table(
        "consistency",
        f"{lb.title}: printed averages and ranks against the per-dataset numbers",
        cols,
    )
    bad = {(m.model, m.field) for m in mismatches}
    for i, r in enumerate(lb.rows):
        a_ok = None if r.published_avg is None else (r.name, "avg_mIoU") not in bad
        k_ok = None if r.published_rank is None else (r.name, "avg_rank") not in bad
        raw = [r.name, r.published_avg, r.avg, a_ok, r.published_rank, r.avg_rank, k_ok]
        t.add(raw, [r.name] + [fmt(v, 3 if j in (2, 5) else 2) for j, v in enumerate(raw) if j])
        for key, ok in (("avg_ok", a_ok), ("rank_ok", k_ok)):
            if ok is False:
                t.marks[(i, key)] = 1
    t.notes.append(
        f"{len(mismatches)} mismatch(es)"
        + (": " + "; ".join(map(str, mismatches)) if mismatches else "")
        + ". Agreement = within half a unit of the printed precision (±0.005)."
    )
    return t


def failures_table(results: Results) -> Table:
    """The Failures section: failed runs listed (never averaged), with notes on the replaced records
    and the recipes left out."""
    cols = [
        Column(k, k.replace("_", " "), numeric=k in ("fraction", "seed"))
        for k in ("run_id", "model", "dataset", "protocol", "fraction", "seed", "error", "source")
    ]
    t = Table("failures", "Failed runs (listed, never averaged)", cols)
    for r in sorted(results.failures, key=lambda r: (r.protocol, r.model, r.dataset, r.seed)):
        error = (r.error or "").strip()
        last = error.splitlines()[-1][:200] if r.error else ""
        raw = [r.run_id, r.model, r.dataset, r.protocol, r.fraction, r.seed, error, r.source]
        t.add(
            raw,
            raw[:2] + [_d(r.dataset), r.protocol, fmt(r.fraction, 2), str(r.seed), last, r.source],
        )
    if results.replaced:
        t.notes.append(
            f"{len(results.replaced)} older record(s) of repeated runs were replaced by the latest"
            " one."
        )
    if results.other_recipes:
        t.notes.append(
            f"{len(results.other_recipes)} run(s) of another recipe than the one shown for their"
            " model, dataset and protocol are left out of the leaderboards (never averaged with"
            " it); label-fraction curves show each recipe as its own curve."
        )
    return t
