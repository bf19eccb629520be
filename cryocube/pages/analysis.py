"""The protocol pages' tables, from leaderboards and runs (rendering and files are the caller's)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

from ..catalog import load_dataset
from ..report.leaderboard import Leaderboard
from ..report.names import dataset_display_name as display
from ..report.names import model_sort_key
from ..report.published import Mismatch
from ..report.records import DEVIATES, RANDOM_INIT, Results, Run
from ..report.tables import MISSING, MODEL, Column, Table, columns, fmt

RANK_NOTE = (
    "Rank: competition ranking per dataset (ties share the best rank), averaged over the datasets a"
    " model has; ties judged at 0.01 mIoU."
)
MARK_NOTE = (
    "Bold = best, underlined = second best (per column; in the average columns only rows averaged "
    "over every dataset are marked)."
)


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


NO_COST = Cost(None, None, None, None, None, None, None, 0)  # a row without runs' costs


def _mean(vals: Sequence[float | None]) -> float | None:
    v = [x for x in vals if x is not None]
    return statistics.fmean(v) if v else None


def _median_int(vals: Sequence[int | None]) -> int | None:
    v = [x for x in vals if x is not None]
    return int(statistics.median(v)) if v else None


def costs(runs: Sequence[Run], measured: dict[str, dict] | None = None) -> dict[str, Cost]:
    """Per display name: median parameters, mean GFLOPs and throughput, max memory, device
    hours; GFLOPs measured (`models.profile.measured_costs`) win over the records' copy."""
    by: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by[r.model_name].append(r)
    out = {}
    for m, rs in by.items():
        hours = {True: 0.0, False: 0.0}  # on a GPU, on a CPU
        for r in rs:
            if r.total_s is not None:
                hours[r.device.startswith("cuda")] += r.total_s / 3600
        prof = (measured or {}).get(rs[0].model)
        gflops = _mean([r.gflops for r in rs])
        source = "catalog" if gflops is not None else ""
        if prof is not None:
            gflops = float(prof["gflops"])
            source = f"measured on {prof.get('device', 'an unnamed device')}"
        out[m] = Cost(
            _median_int([r.params[0] for r in rs]),
            _median_int([r.params[1] for r in rs]),
            gflops,
            _mean([r.samples_per_s for r in rs]),
            max((r.peak_memory_mb for r in rs if r.peak_memory_mb is not None), default=None),
            hours[True],
            hours[False],
            len(rs),
            ", ".join(sorted({r.precision for r in rs})),
            source,
            prof,
        )
    return out


COST_COLUMNS = columns(
    "params_M=Params (M); gflops=GFLOPs; samples_per_s=samples/s; gpu_hours=GPU h; cpu_hours=CPU h",
    decimals={"params_M": 1, "gflops": 1, "samples_per_s": 1, "gpu_hours": 3, "cpu_hours": 3},
)


def leaderboard_table(
    lb: Leaderboard, cost: dict[str, Cost] | None = None, mismatches: Sequence[Mismatch] = ()
) -> Table:
    """The paper's table: mIoU per dataset, average mIoU, average rank (+ printed values, costs)."""
    has_pub = any(r.published_avg is not None or r.published_rank is not None for r in lb.rows)
    cols = [MODEL] + [Column(d, display(d), decimals=lb.decimals) for d in lb.datasets]
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
        raw = [r.name] + [c.mean if (c := r.cells.get(d)) else None for d in lb.datasets]
        raw += [r.avg, r.n_avg, r.avg_rank]
        text = {
            "avg_mIoU": _avg_text(r.avg, r.n_avg, n, lb.decimals),
            "avg_rank": _avg_text(r.avg_rank, r.n_avg, n),
        }
        if has_pub:
            raw += [r.published_avg, r.published_rank]
            for f, v in (("avg_mIoU", r.published_avg), ("avg_rank", r.published_rank)):
                text[f"{f}_published"] = fmt(v) + (" †" if (r.name, f) in bad else "")
        if cost is not None:
            c = cost.get(r.name, NO_COST)
            raw += [c.params_m, c.gflops, c.samples_per_s, c.gpu_hours, c.cpu_hours]
        t.add(raw, text)
    for d in lb.datasets:
        t.mark_best(d, lb.decimals)
    # only rows averaged over every dataset are marked in the average columns
    complete = {i for i, r in enumerate(lb.rows) if r.n_avg == len(lb.datasets)}
    t.mark_best("avg_mIoU", lb.decimals, rows=complete)
    t.mark_best("avg_rank", lb.decimals, higher=False, rows=complete)
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
        f"A missing cell is shown as {MISSING}; an average over fewer than the {n} datasets"
        f" says (k/{n}).",
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


# per dataset: (key, header, shown); the rank's ends are CSV/JSON only
_ROBUST = (
    ("mean", "{} mean ± std (n)", True),
    ("std", "{} std", False),
    ("n", "{} seeds", False),
    ("Q", "{} Q", True),
    ("rank", "{} rank (range)", True),
    ("rank_best", "", False),
    ("rank_worst", "", False),
)


def robustness_table(lb: Leaderboard) -> Table:
    """Per cell mean ± std over seeds, stability Q and rank interval; the place over seeds."""
    cols = [MODEL] + [
        Column(f"{d}_{k}", h.format(display(d)), show, decimals=1 if k == "Q" else 2)
        for d in lb.datasets
        for k, h, show in _ROBUST
    ]
    cols += columns(
        "place=Place; place_best=; place_worst=; place_over_seeds=Place over seeds;"
        " seed_flip=Seeds flip it",
        text="place_over_seeds seed_flip",
        hidden="place_best place_worst",
    )
    t = Table("robustness", f"{lb.title}: robustness over seeds", cols)
    for r in lb.rows:
        raw, text = [r.name], {}
        for d in lb.datasets:
            c = r.cells.get(d)
            if c is None:
                raw += [None] * len(_ROBUST)
                continue
            best, worst = c.rank_range or (c.rank, c.rank)
            raw += [c.mean, c.std, c.n, c.stability, c.rank, best, worst]
            std = f" ± {fmt(c.std, lb.decimals)}" if c.std is not None else ""
            text[f"{d}_mean"] = f"{fmt(c.mean, lb.decimals)}{std} ({c.n})"
            text[f"{d}_rank"] = str(c.rank) + (f" ({best}–{worst})" if best != worst else "")
        pr = r.place_range
        raw += [r.place] + (
            [pr[0], pr[1], f"{pr[0]}–{pr[1]}", pr[0] != pr[1]] if pr else [None] * 4
        )
        if pr and pr[0] == pr[1]:
            text["place_over_seeds"] = str(pr[0])
        t.add(raw, text)
    for d in lb.datasets:
        t.mark_best(f"{d}_Q", 1)
    t.notes += [
        "mean ± std: over seeds, sample std (ddof 1); n = number of seeds.",
        "Q = 2·A/(0.02 + ΔA) with A = mean/100 and ΔA = population std/100 over seeds"
        " (NeuCo-Bench's stability-weighted score; 100 = perfect and perfectly repeatable);"
        " shown from two seeds on.",
        "Rank (range): the rank of the mean, and the best–worst rank the cell could take if"
        " every model's score were any of its seeds' scores; a range means seeds can flip the"
        " ranking.",
        "Place: position by average rank; place over seeds: the range of that position over"
        " per-seed leaderboards.",
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
    cols = [MODEL] + [Column(d, f"{display(d)} %") for d in datasets]
    cols += columns(
        f"avg_fewshot=Avg mIoU {pct}%; avg_full=Avg mIoU 100%; retention=Retention %;"
        " n_datasets=datasets"
    )
    title = f"Few-shot retention ({pct}% labels vs 100%, frozen encoder)"
    t = Table("fewshot_retention", title, cols)
    for m in models:
        pairs = {d: (few.mean(m, d), full.mean(m, d)) for d in datasets}
        both = {d: p for d, p in pairs.items() if None not in p and p[1] > 0}
        per = [100 * both[d][0] / both[d][1] if d in both else None for d in datasets]
        a10 = _mean([p[0] for p in both.values()])
        a100 = _mean([p[1] for p in both.values()])
        ret = 100 * a10 / a100 if a10 is not None and a100 else None
        t.add([m] + per + [a10, a100, ret, len(both)])
    t.mark_best("retention")
    t.notes += [
        f"Retention = average {pct}%-label mIoU / average 100%-label mIoU × 100, over the datasets"
        " where the model has both (count in the last column); per-dataset columns are the same"
        " ratio."
    ]
    return t


def finetune_gain_table(frozen: Leaderboard, finetune: Leaderboard) -> Table:
    """Fine-tuning gain over the frozen encoder, in mIoU points and relative %."""
    datasets, models = _two_boards(frozen, finetune)
    cols = [MODEL]
    for d in datasets:
        cols += [
            Column(f"{d}_gain", f"{display(d)} Δ (rel.)"),
            Column(f"{d}_rel_pct", "", False, decimals=1),
        ]
    cols += columns("avg_gain=Avg Δ mIoU; avg_rel_pct=Avg relative %; n_datasets=datasets")
    t = Table("finetune_gain", "Fine-tuning gain over the frozen encoder", cols)
    for m in models:
        raw, text, gains, rel = [m], {}, [], []
        for d in datasets:
            fz, ft = frozen.mean(m, d), finetune.mean(m, d)
            if fz is None or ft is None:
                raw += [None, None]
                continue
            g, rp = ft - fz, (100 * (ft - fz) / fz if fz else None)
            gains.append(g)
            rel.append(rp)
            raw += [g, rp]
            text[f"{d}_gain"] = f"{g:+.2f}" + (f" ({rp:+.1f}%)" if rp is not None else "")
        ag, ar = _mean(gains), _mean(rel)
        t.add(
            raw + [ag, ar, len(gains)], text | {"avg_gain": _signed(ag), "avg_rel_pct": _signed(ar)}
        )
    t.mark_best("avg_rel_pct")
    t.notes += [
        "Δ = fine-tuned mIoU − frozen mIoU (points); relative = Δ / frozen × 100; averages over the"
        " datasets where the model has both protocols (the paper reports the average relative"
        " improvement)."
    ]
    return t


def _class_order(dataset: str, names: set[str]) -> list[str]:
    try:
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
        t = Table(
            f"per_class_iou_{d}",
            f"{lb.title}: per-class IoU (%) on {display(d)}",
            [MODEL] + [Column(c, c) for c in classes],
            notes=[
                "Mean over seeds of each class's test IoU; mIoU averages these classes, background"
                " included."
            ],
        )
        for m in (m for m in lb.model_names if m in per_model):
            t.add([m] + [_mean(per_model[m].get(c, [])) for c in classes])
        for c in classes:
            t.mark_best(c, lb.decimals)
        tables.append(t)
    return tables


def cost_table(lb: Leaderboard, cost: dict[str, Cost]) -> Table:
    """Accuracy beside cost per model: parameters, GFLOPs and their source, speed, memory, hours."""
    cols = columns(
        "model=Model; avg_mIoU=Avg mIoU; params_encoder_M=Encoder params (M);"
        " params_decoder_M=Decoder params (M); gflops=GFLOPs; gflops_source=GFLOPs from;"
        " encoder_samples_per_s=Encoder fwd samples/s; samples_per_s=samples/s;"
        " peak_memory_mb=Peak MB; gpu_hours=GPU h; cpu_hours=CPU h; n_runs=runs;"
        " precision=precision",
        text="model gflops_source precision",
        decimals=dict(gflops=1, samples_per_s=1, peak_memory_mb=0, gpu_hours=3, cpu_hours=3),
    )
    t = Table("cost", f"{lb.title}: accuracy against cost", cols)
    for r in (r for r in lb.rows if r.name in cost):
        c = cost[r.name]
        enc = c.profile.get("samples_per_s") if c.profile else None
        how = f" ({c.profile.get('precision')}, batch {c.profile.get('batch')})" if enc else ""
        text = {
            "avg_mIoU": _avg_text(r.avg, r.n_avg, len(lb.datasets)),
            "encoder_samples_per_s": fmt(enc) + how if enc else MISSING,
        }
        params = [None if p is None else p / 1e6 for p in (c.params_encoder, c.params_decoder)]
        t.add(
            [r.name, r.avg, *params, c.gflops, c.gflops_source or None, enc, c.samples_per_s]
            + [c.peak_memory_mb, c.gpu_hours, c.cpu_hours, c.n_runs, c.precision],
            text,
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
    """Our runs beside the paper: ours / paper / Δ per dataset, then averages over common ones."""
    datasets = [d for d in paper.datasets if d in ours.datasets]
    models = [m for m in paper.model_names if ours.row(m)] + [
        m for m in ours.model_names if not paper.row(m)
    ]
    cols = [MODEL]
    for d in datasets:
        cols += [Column(f"{d}_{k}", f"{display(d)} {h}") for k, h in _VS_PAPER]
    cols += columns(
        "avg_ours=Avg ours; avg_paper=Avg paper; avg_delta=Avg Δ; n_datasets=datasets;"
        " rank_ours=Avg rank ours; rank_paper=Avg rank paper"
    )
    title = "Our runs beside the published Cryo-Bench table (frozen, 100% labels)"
    t = Table("published_comparison", title, cols)
    for m in models:
        raw, text, o_l, p_l = [m], {}, [], []
        for d in datasets:
            o, p = ours.mean(m, d), paper.mean(m, d)
            dl = o - p if o is not None and p is not None else None
            if dl is not None:
                o_l.append(o)
                p_l.append(p)
            raw += [o, p, dl]
            text[f"{d}_delta"] = _signed(dl)
        ao, ap = _mean(o_l), _mean(p_l)
        ad = ao - ap if ao is not None and ap is not None else None
        ro, rp = ours.row(m), paper.row(m)
        ranks = [ro.avg_rank if ro else None, rp.published_rank if rp else None]
        t.add(raw + [ao, ap, ad, len(o_l), *ranks], text | {"avg_delta": _signed(ad)})
    t.notes += [
        "Δ = ours − paper (mIoU points). Averages over the datasets where both have a number.",
        "Avg rank ours ranks our models among themselves; the paper's rank is among its 16 rows"
        " as printed.",
    ]
    return t


def consistency_table(lb: Leaderboard, mismatches: Sequence[Mismatch]) -> Table:
    """The printed averages and ranks against those recomputed from the cells; mismatches marked."""
    cols = columns(
        "model=Model; avg_printed=Avg printed; avg_recomputed=Avg recomputed; avg_ok=Avg agrees;"
        " rank_printed=Rank printed; rank_recomputed=Rank recomputed; rank_ok=Rank agrees",
        text="model avg_ok rank_ok",
        decimals={"avg_recomputed": 3, "rank_recomputed": 3},
    )
    title = f"{lb.title}: printed averages and ranks against the per-dataset numbers"
    t = Table("consistency", title, cols)
    bad = {(m.model, m.field) for m in mismatches}
    for i, r in enumerate(lb.rows):
        a_ok = None if r.published_avg is None else (r.name, "avg_mIoU") not in bad
        k_ok = None if r.published_rank is None else (r.name, "avg_rank") not in bad
        t.add([r.name, r.published_avg, r.avg, a_ok, r.published_rank, r.avg_rank, k_ok])
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
    """Failed runs listed (never averaged), with notes on replaced records and recipes left out."""
    cols = [
        Column(k, k.replace("_", " "), numeric=k in ("fraction", "seed"))
        for k in ("run_id", "model", "dataset", "protocol", "fraction", "seed", "error", "source")
    ]
    t = Table("failures", "Failed runs (listed, never averaged)", cols)
    for r in sorted(results.failures, key=lambda r: (r.protocol, r.model, r.dataset, r.seed)):
        error = (r.error or "").strip()
        last = error.splitlines()[-1][:200] if r.error else ""
        raw = [r.run_id, r.model, r.dataset, r.protocol, r.fraction, r.seed, error, r.source]
        t.add(raw, {"dataset": display(r.dataset), "seed": str(r.seed), "error": last})
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
