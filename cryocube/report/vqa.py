"""The vqa family's report: per task metrics with bootstrap CIs, the coherence confusion matrix, predicted
against true fringe counts, a gallery (picture, question, reference, each model's answer), and
LEADERBOARD.md in InSAR-VLM-Bench's shape with VLMs and GFMs side by side. A board's columns are the
task file's `board:` (catalogs/tasks/*.yaml); a Cryo-Bench tile cube's board has a row per model and class.

GFM rows come from embedding-probe runs on the same cube: an encoder answers the tasks that are
image-level targets (coherence class, fringe count) through its probe, in the probe's own metric
(NeuCo-Bench: F1 for classes, the mean one-vs-rest F1 for the 3-way coherence class, R² for numbers), and
localisation through a segmentation run (mask -> box IoU); it cannot answer free text: those cells say so
instead of being left blank.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from .records import Results, Run
from .tables import MISSING, Column, Table

if TYPE_CHECKING:
    from ..families.vqa.tasks import Board

PROBE_METRIC = {"cls": "probe F1", "regr": "probe R²"}
CANNOT = "cannot answer (encoder)"


def _cell(s: dict | None) -> tuple[float | None, str]:
    if not s or s.get("value") is None or (isinstance(s["value"], float) and math.isnan(s["value"])):
        return None, MISSING
    return s["value"], f"{s['value']:.2f} [{s['ci_low']:.2f}, {s['ci_high']:.2f}]"


def _probe_cell(run: Run, task: str) -> tuple[float | None, str]:
    """The probe's score of a task; a multi-class task probed one-vs-rest (`<task>_<class>_vs_rest__cls`,
    families/embedding/probe.py) shows the mean binary F1 over its classes, and says so."""
    ovr = []
    for name, v in (run.metrics.get("task_A") or {}).items():
        base, _, kind = str(name).partition("__")
        if base == task and v is not None:
            return float(v), f"{float(v):.2f} ({PROBE_METRIC.get(kind, 'probe')})"
        if base.startswith(task + "_") and base.endswith("_vs_rest") and kind == "cls" and v is not None:
            ovr.append(float(v))
    if ovr:
        m = sum(ovr) / len(ovr)
        return m, f"{m:.2f} (probe F1, mean of {len(ovr)} one-vs-rest)"
    return None, MISSING


def _vlm_row(head: list, scored: dict, asked: dict, columns) -> tuple[list, list]:
    """A VLM's board row: `head`, then per column the metric of `scored` (a run's per-task summaries, or one
    class's share of them) with its interval, "not in cube" for a task the run did not ask, and unparsed / n."""
    raw, txt = list(head), list(head)
    for task, m, _ in columns:
        v, s = _cell((scored.get(task) or {}).get("metrics", {}).get(m))
        raw.append(v)
        txt.append(s if task in asked else f"{MISSING} (not in cube)")
    un = sum(int(d.get("unparsed", 0)) for d in scored.values())
    raw.append(un)
    txt.append(f"{un} / {sum(int(d.get('n', 0)) for d in scored.values())}")
    return raw, txt


def board(res: Results, dataset: str) -> "Board":
    """The board of the task file the dataset's VLM runs asked (their records name it); InSAR-VLM-Bench's when
    the file cannot be found."""
    from ..catalog import CatalogError
    from ..families.vqa.tasks import board_of

    for r in sorted((r for r in res.vqa if r.dataset == dataset), key=lambda r: r.model_name):
        for d in (r.record.get("tasks") or {}).values():
            if d.get("source"):
                try:
                    return board_of(Path(str(d["source"])).stem)
                except CatalogError:
                    break
    return board_of("insar")

def _localisers(res: Results, dataset: str) -> dict[str, Run]:
    """model -> its latest segmentation run on `dataset` that scored localisation (families/segmentation/localisation.py)."""
    out: dict[str, Run] = {}
    for r in sorted((r for r in res.runs if r.dataset == dataset and r.record.get("localisation")), key=lambda r: r.created):
        out[r.model] = r
    return out


def leaderboard(res: Results, dataset: str) -> Table:
    b = board(res, dataset)
    if b.per_class:
        return class_leaderboard(res, dataset, b)
    BOARD = b.columns
    t = Table(f"leaderboard_{dataset}", f"{b.title} on {dataset}: VLMs and GFMs side by side",
              [Column("model", "Model", numeric=False), Column("kind", "Kind", numeric=False)]
              + [Column(f"{task}.{m}", h) for task, m, h in BOARD] + [Column("unparsed", "Unparsed")])
    for r in sorted((r for r in res.vqa if r.dataset == dataset), key=lambda r: r.model_name):
        tasks = r.metrics.get("tasks") or {}
        t.add(*_vlm_row([r.model_name, "VLM"], tasks, tasks, BOARD))
    seg = _localisers(res, dataset)
    probed = sorted((r for r in res.embedding if r.dataset == dataset), key=lambda r: r.model_name)
    for r in probed + sorted((r for m, r in seg.items() if m not in {p.model for p in probed}), key=lambda r: r.model_name):
        kind = "GFM (probe)" if r.family == "embedding" else "GFM (segmentation)"
        raw, txt = [r.model_name, kind], [r.model_name, kind]
        for task, m, _ in BOARD:
            if (task, m) == ("deformation_localization", "box_iou") and r.model in seg:
                v, s = _cell(seg[r.model].record["localisation"])
                raw.append(v)
                txt.append(f"{s} (segmentation, mask->box)")
            elif task in ("deformation_localization", "noise_assessment"):
                raw.append(None)
                txt.append(CANNOT)
            elif r.family != "embedding":
                raw.append(None)
                txt.append(f"{MISSING} (no probe run)")
            else:
                v, s = _probe_cell(r, task)
                raw.append(v)
                txt.append(s)
        raw.append(None)
        txt.append(MISSING)
        t.add(raw, txt)
    t.notes = ["values with 95 % bootstrap intervals; MAE in fringes (lower is better), the rest in %",
               "an unparsed answer counts as wrong (IoU 0, F1 0, MAE against the task's unparsed value)",
               "GFM rows: the embedding probe's own metric (NeuCo-Bench F1 / R²; the 3-way coherence class as the mean "
               "F1 of one-vs-rest binary probes), not the VLM metric; encoders cannot write text; their localisation "
               "IoU comes from a segmentation run on the cube (`cryocube evaluate --protocol frozen`): the box of the "
               "predicted deformation mask against the reference box, on that run's test split"]
    if any(r.random_init for r in res.vqa + res.embedding + list(seg.values()) if r.dataset == dataset):
        t.notes.append("(random init) rows measure the pipeline, not a model")
    return t


def class_leaderboard(res: Results, dataset: str, b: "Board") -> Table:
    """A Cryo-Bench tile cube: per model and class, the VLM's answers against the labels `probe --tasks-from`
    derives, beside each encoder's probe of the same labels (the column's `probe:` task of that class)."""
    from ..families.class_labels import slug

    t = Table(f"leaderboard_{dataset}", f"{b.title} on {dataset}: VLMs and GFMs side by side, per class",
              [Column("model", "Model", numeric=False), Column("kind", "Kind", numeric=False),
               Column("class", "Class", numeric=False)]
              + [Column(f"{task}.{m}", h) for task, m, h in b.columns] + [Column("unparsed", "Unparsed")])
    vlms = sorted((r for r in res.vqa if r.dataset == dataset), key=lambda r: r.model_name)
    classes = sorted({c for r in vlms for d in (r.metrics.get("tasks") or {}).values() for c in d.get("by_class") or {}})
    for r in vlms:
        tasks = r.metrics.get("tasks") or {}
        for c in ([None] if len(classes) > 1 else []) + classes:  # None: every class together
            per = {k: (d if c is None else (d.get("by_class") or {}).get(c) or {}) for k, d in tasks.items()}
            t.add(*_vlm_row([r.model_name, "VLM", c or "all"], per, tasks, b.columns))
    for r in sorted((r for r in res.embedding if r.dataset == dataset), key=lambda r: r.model_name):
        for c in classes:
            raw, txt = [r.model_name, "GFM (probe)", c], [r.model_name, "GFM (probe)", c]
            for probe in b.probes:
                v, s = _probe_cell(r, f"{slug(c)}_{probe}") if probe else (None, CANNOT)
                raw.append(v)
                txt.append(s)
            raw.append(None)
            txt.append(MISSING)
            t.add(raw, txt)
    t.notes = ["VLM rows: the test split's tiles with labelled pixels, one question per tile, task and class; values with "
               "95 % bootstrap intervals (accuracy in %, MAE as a fraction of the tile); references are the labels "
               "`cryocube probe --tasks-from` derives from the tile's class fractions",
               "an unparsed answer counts as wrong (MAE against the task's unparsed value)",
               "GFM rows: the embedding probe's own metric (NeuCo-Bench F1 for presence, R² for fraction, over random "
               "90/10 splits of every labelled tile), not the VLM metric; – where the probe had no task (a class in "
               "every tile or in none)"]
    if any(r.random_init for r in res.vqa + res.embedding if r.dataset == dataset):
        t.notes.append("(random init) rows measure the pipeline, not a model")
    return t


def task_table(res: Results, dataset: str) -> Table:
    t = Table(f"tasks_{dataset}", f"Per task metrics on {dataset}",
              [Column("model", "Model", numeric=False), Column("task", "Task", numeric=False),
               Column("metric", "Metric", numeric=False), Column("value", "Value"), Column("ci_low", "CI low"),
               Column("ci_high", "CI high"), Column("n", "n"), Column("unparsed", "Unparsed"),
               Column("prompt", "Prompt sha256", numeric=False)])
    for r in sorted((r for r in res.vqa if r.dataset == dataset), key=lambda r: r.model_name):
        for task, d in (r.metrics.get("tasks") or {}).items():
            for m, s in d.get("metrics", {}).items():
                t.add([r.model_name, task, m, s["value"], s["ci_low"], s["ci_high"], s["n"], d.get("unparsed"),
                       ((r.record.get("tasks") or {}).get(task) or {}).get("prompt_sha256", "")])
        t.notes.append(generation_cost(r))
    return t


def phrasing_table(res: Results, dataset: str) -> Table | None:
    """Per model and task asked in several phrasings (a task file's `prompts:`): the primary metric's mean and spread
    over the phrasings, each on the same samples; the board shows the first phrasing only. None: no such task."""
    import statistics

    t = Table(f"phrasings_{dataset}", f"Prompt phrasings on {dataset}: mean and spread over each task's phrasings",
              [Column("model", "Model", numeric=False), Column("task", "Task", numeric=False),
               Column("metric", "Metric", numeric=False), Column("phrasings", "Phrasings"), Column("mean", "Mean"),
               Column("sd", "SD"), Column("min", "Min"), Column("max", "Max"), Column("first", "First (board)"),
               Column("unparsed", "Unparsed per phrasing", numeric=False)])
    for r in sorted((r for r in res.vqa if r.dataset == dataset), key=lambda r: r.model_name):
        for task, d in (r.metrics.get("tasks") or {}).items():
            ph = d.get("phrasings") or []
            m = next(iter(d.get("metrics") or {}), None)
            vals = [p["metrics"][m]["value"] for p in ph if m and m in p.get("metrics", {})]
            if len(vals) < 2:
                continue
            t.add([r.model_name, task, m, len(vals), statistics.fmean(vals), statistics.stdev(vals), min(vals), max(vals),
                   vals[0], " / ".join(f"{p['unparsed']}{' (MC)' if p.get('multiple_choice') else ''}" for p in ph)])
    if not t.rows:
        return None
    t.notes = ["SD: the sample standard deviation over phrasings; MC: the multiple-choice phrasing (lettered options); "
               "every phrasing is asked of the same samples"]
    return t


def generation_cost(r: Run) -> str:
    """The run's cost per example: worker seconds inside generate() per question (model load, rendering and
    parsing left out), from the record's generation_stats; answers kept from an earlier run were not timed."""
    g = r.record.get("generation_stats") or {}
    n, sec = int(g.get("questions_generated") or 0), (r.record.get("timings") or {}).get("generate_s")
    if not n or not sec:
        return f"{r.model_name}: no generation timed (answers kept from an earlier run)"
    return (f"{r.model_name}: {sec / n:.3g} s per example ({n} questions generated in {sec:.3g} s, "
            f"batch {(r.record.get('generation') or {}).get('batch', '?')}, {r.record.get('torch_threads')} torch threads, "
            f"{(r.record.get('precision') or {}).get('effective', '?')})")


def confusion_tables(res: Results, dataset: str) -> list[Table]:
    out = []
    for r in sorted((r for r in res.vqa if r.dataset == dataset), key=lambda r: r.model_name):
        for task, d in (r.metrics.get("tasks") or {}).items():
            c = d.get("confusion")
            if not c:
                continue
            labels = c["labels"]
            t = Table(f"confusion_{task}_{r.run_id[:8]}", f"{r.model_name}: {task} (rows reference, columns answer)",
                      [Column("reference", "Reference", numeric=False)] + [Column(x, x) for x in labels]
                      + [Column("unparsed", "unparsed")])
            for lab, row in zip(labels, c["matrix"]):
                t.add([lab, *row])
            out.append(t)
    return out


def fringe_plot(res: Results, dataset: str, stem: Path) -> list[Path]:
    from . import plots

    fig, ax = plots._subplots((4.6, 4.2))
    hi = 1.0
    for i, r in enumerate(sorted((r for r in res.vqa if r.dataset == dataset), key=lambda r: r.model_name)):
        pairs = ((r.metrics.get("tasks") or {}).get("fringe_counting") or {}).get("pairs") or []
        pts = [(a, b) for a, b in pairs if b is not None]
        if not pairs:
            continue
        xs, ys = [a for a, _ in pts], [b for _, b in pts]
        hi = max([hi, *xs, *ys])
        ax.scatter(xs, ys, s=18, alpha=0.7, label=f"{r.model_name} ({len(pairs) - len(pts)} unparsed)")
    ax.plot([0, hi], [0, hi], color="#888", lw=0.8, ls="--")
    ax.set_xlabel("true fringe count")
    ax.set_ylabel("answered fringe count")
    ax.set_title(f"Fringe counting on {dataset}")
    ax.legend(fontsize=7)
    return plots.save(fig, stem)


def gallery(res: Results, dataset: str, figures: Path) -> list[tuple[Path | None, str, Table]]:
    """Per gallery sample: its picture (as the first run saw it, copied into `figures`), a caption and a table of
    each model's answers."""
    from .. import store

    runs = sorted((r for r in res.vqa if r.dataset == dataset), key=lambda r: r.model_name)
    if not runs:
        return []
    base = runs[0]
    rdir = str(base.record.get("answers_file", "")).rsplit("/", 1)[0]
    out = []
    for g in base.record.get("gallery") or []:
        t = Table(f"gallery_{g['sample']}", f"sample {g['source']}",
                  [Column("task", "Task", numeric=False), Column("question", "Question", numeric=False),
                   Column("reference", "Reference", numeric=False)]
                  + [Column(f"answer_{k}", r.model_name, numeric=False) for k, r in enumerate(runs)])
        answers = [{(q["task"], q.get("class"), q.get("variant", 0)): q for gg in (r.record.get("gallery") or [])
                    if gg["sample"] == g["sample"] for q in gg["qa"]} for r in runs]
        for q in g["qa"]:
            ref = "; ".join(f"{m}: {v}" for m, v in q["reference"].items())
            row = [q["task"], q["question"], ref] + [(a.get((q["task"], q.get("class"), q.get("variant", 0))) or {}).get("answer", MISSING)
                                                      or "(empty)" for a in answers]
            t.add(row, [str(x) for x in row])
        pic = figures / f"vqa_{dataset}_{g['picture'].rsplit('/', 1)[-1]}"
        try:
            data = store.read_bytes(f"{rdir}/{g['picture']}")
        except (OSError, ValueError):
            pic = None  # the run folder moved: the answers stay, the picture is left out
        else:
            pic.parent.mkdir(parents=True, exist_ok=True)
            pic.write_bytes(data)
        out.append((pic, f"{g['source']}: the picture the models were shown", t))
    return out


def leaderboard_md(res: Results) -> str:
    """LEADERBOARD.md: one InSAR-VLM-Bench-shaped table per dataset (its columns from the task file)."""
    from .tables import to_markdown

    titles = sorted({board(res, d).title for d in {r.dataset for r in res.vqa}}) or ["InSAR-VLM-Bench tasks"]
    parts = [f"# Leaderboard ({'; '.join(titles)})", "",
             "Written by `cryocube report`; every number is read from the run records (results.jsonl).", ""]
    for d in sorted({r.dataset for r in res.vqa}):
        parts += [to_markdown(leaderboard(res, d)), ""]
    return "\n".join(parts)
