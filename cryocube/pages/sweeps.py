"""Report sections of `cryocube tune` studies (default recipe against tuned retrain, importances,
history) and of label-fraction curves (plain runs, `evaluate --fraction`; never tune trials)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.ticker import MaxNLocator

from ..report import plots
from ..report.names import dataset_display_name
from ..report.records import Results, Run, distinct_labels
from ..report.tables import Table, columns

# the encoder mode of a curve's protocol (a frozen encoder at any label share)
ENCODER_MODE = {"frozen": "frozen", "fewshot": "frozen", "finetune": "fine-tuned"}


def _mean(vals: Sequence[float]) -> float | None:
    return sum(vals) / len(vals) if vals else None


def studies_table(res: Results) -> tuple[Table, Table]:
    """Default against tuned test mIoU per tuned run, with the best params; and the importances."""
    tuned = sorted(
        (r for r in res.runs if r.sweep.get("best")),
        key=lambda r: (r.dataset, r.model_name, r.protocol),
    )
    by_id = {r.run_id: r for r in res.runs + res.other_recipes + res.replaced if not r.sweep}
    cols = columns(
        "model=Model; dataset=Dataset; protocol=Protocol; default=Default test mIoU;"
        " tuned=Tuned test mIoU; gain=Gain; best_params=Best params; val=Best val objective;"
        " trials=Trials (complete/pruned/failed); study=Study",
        text="model dataset protocol best_params trials study",
    )
    t = Table("studies", "Hyper-parameter studies: default recipe vs tuned", cols)
    spec = "study=Study; model=Model; dataset=Dataset; param=Parameter; importance=Importance"
    imp_cols = columns(spec, text="study model dataset param")
    imp = Table("importance", "Parameter importance (fANOVA over completed trials)", imp_cols)
    for r in tuned:
        s = r.sweep
        base = by_id.get(str(s.get("baseline_run_id")))
        d, v = (base.miou if base else None), r.miou
        n = s.get("n_trials") or {}
        params = ", ".join(
            f"{k}={x:.3g}" if isinstance(x, float) else f"{k}={x}"
            for k, x in (s.get("params") or {}).items()
        )
        gain = v - d if v is not None and d is not None else None
        trials = "/".join(str(n.get(k, 0)) for k in ("complete", "pruned", "fail"))
        row = [r.model_name, r.dataset, r.protocol, d, v, gain, params, s.get("value"), trials]
        t.add(row + [s.get("study")])
        for k, x in sorted((s.get("importance") or {}).items(), key=lambda kv: -kv[1]):
            imp.add([s.get("study"), r.model_name, dataset_display_name(r.dataset), k, float(x)])
    t.notes.append(
        "Trials are selected on the validation split only (objective: best validation mIoU of the"
        " run); the tuned column is the best trial's retrain on the same split, tested once."
        " Default: the recipe without the study's params, same seed."
    )
    return t, imp


_SMALL = {"title_size": 10, "legend": {"fontsize": 8}}


def history_plot(trials: dict[int, Run], stem: Path, title: str) -> list[Path]:
    """Each trial's validation objective (pruned: at their rung) and the best completed so far."""
    first = next(iter(trials.values())).sweep
    best_of = min if first.get("direction", "maximize") == "minimize" else max
    fig, ax = plots.panel((6.5, 4))
    for state, marker, colour in (
        ("complete", "o", "tab:blue"),
        ("pruned", "x", "tab:red"),
        ("failed", "s", "grey"),
    ):
        pts = [
            (k, r.sweep.get("value")) for k, r in trials.items() if r.sweep.get("state") == state
        ]
        if pts := [(k, v) for k, v in pts if isinstance(v, (int, float))]:
            ax.scatter(*zip(*pts), marker=marker, color=colour, label=state, zorder=3)
    best, xs, ys = None, [], []
    for k, r in trials.items():
        v = r.sweep.get("value")
        if r.sweep.get("state") == "complete" and isinstance(v, (int, float)):
            best = v if best is None else best_of(best, v)
        if best is not None:
            xs.append(k)
            ys.append(best)
    if xs:
        ax.step(xs, ys, where="post", color="black", lw=1.2, label="best so far")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    metric = str(first.get("metric", "val_mIoU"))
    return plots.finish(ax, stem, title, "trial", metric, **_SMALL, grid={"alpha": 0.3})


def fraction_curves(res: Results) -> tuple[dict, list[str]]:
    """dataset -> (model label, "frozen" | "fine-tuned") -> fraction -> test mIoU of each seed, a
    curve per model id and recipe (two of either are two curves, labelled apart); and the runs no
    curve shows: a recipe at one label fraction where the model ran others (said)."""
    out: dict[str, dict] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    rep: dict[tuple, Run] = {}  # a run per (dataset, model, recipe digest, mode), for its label
    for r in res.runs + res.other_recipes:
        if not r.sweep and r.miou is not None and (kind := ENCODER_MODE.get(r.protocol)):
            key = (r.model, r.recipe_digest, kind)
            out[r.dataset][key][r.fraction].append(r.miou)
            rep[(r.dataset, *key)] = r
    curves, left = {}, []
    for d, cs in sorted(out.items()):
        names = distinct_labels({k: rep[(d, *k)] for k in cs})
        for (model, digest, kind), pts in sorted(cs.items()):
            mates = [p for (m, _, k), p in cs.items() if (m, k) == (model, kind)]
            if len(pts) == 1 and len({f for p in mates for f in p}) >= 2:
                f = next(iter(pts))
                left.append(
                    f"{dataset_display_name(d)}: {names[(model, digest, kind)]} ({kind}, recipe"
                    f" {digest[:6]}) at fraction {f:g}, {len(pts[f])} run(s)"
                )
        if cs := {k: dict(v) for k, v in cs.items() if len(v) >= 2}:  # a curve: two fractions
            names = distinct_labels({k: rep[(d, *k)] for k in cs})
            curves[d] = {(names[k], k[2]): pts for k, pts in cs.items()}
    return curves, left


def fraction_table(curves: dict) -> Table:
    """The label-fraction curves as numbers: mean mIoU over seeds per curve and fraction."""
    cols = columns(
        "dataset=Dataset; model=Model; encoder=Encoder; fraction=Label fraction;"
        " miou=mIoU (mean over seeds); seeds=seeds",
        text="dataset model encoder",
    )
    t = Table("label_fraction", "Test mIoU against the share of training labels", cols)
    for d, cs in sorted(curves.items()):
        for (m, kind), pts in sorted(cs.items()):
            for f, vals in sorted(pts.items()):
                text = {"dataset": dataset_display_name(d), "fraction": f"{f:g}"}
                t.add([d, m, kind, f, _mean(vals), len(vals)], text)
    return t


def fraction_plot(
    curves: dict[tuple[str, str], dict[float, list[float]]], stem: Path, title: str
) -> list[Path]:
    """A line per model and encoder mode (frozen solid, fine-tuned dashed), log label fraction."""
    fig, ax = plots.panel((6.5, 4.2))
    models = sorted({m for m, _ in curves})
    colour = dict(zip(models, plots.colours(len(models))))
    for (m, kind), pts in sorted(curves.items()):
        fs, ls = sorted(pts), "-" if kind == "frozen" else "--"
        means = [_mean(pts[f]) for f in fs]
        ax.plot(fs, means, marker="o", ms=4, color=colour[m], ls=ls, label=f"{m}, {kind}")
    ax.set_xscale("log")
    grid = {"alpha": 0.3, "which": "both"}
    return plots.finish(
        ax, stem, title, "share of training labels", "test mIoU", **_SMALL, grid=grid
    )


def sections(w: Any, res: Results) -> None:
    """The studies and label-fraction sections, where the results hold either (w: the writer)."""
    if any(r.sweep.get("best") for r in res.runs):
        sec = w.section("Hyper-parameter studies")
        t, imp = studies_table(res)
        w.table(sec, "tune", t)
        if imp.rows:
            w.table(sec, "tune", imp)
        for i, study in enumerate(t.column_values("study")):
            # each trial's latest line (a pruned trial's rung line, then its "pruned" line)
            trials = {
                r.sweep["trial"]: r
                for r in res.trials
                if r.sweep.get("study") == str(study) and isinstance(r.sweep.get("trial"), int)
            }
            if trials := dict(sorted(trials.items())):
                title = f"{study}: optimisation history"
                plot = history_plot(trials, w.stem(f"tune_history_{i}"), title)
                w.figure(sec, plot, f"{study}: validation objective per trial")
    curves, left = fraction_curves(res)
    if curves or left:
        note = (
            f"Left out of the curves, {len(left)} point(s) whose recipe ran at one label"
            " fraction only (a curve joins runs of one recipe, never recipes at other"
            " fractions): " + "; ".join(left) + "."
        )
        sec = w.section("Label-fraction curves", text=note if left else "")
        if curves:
            w.table(sec, "fractions", fraction_table(curves))
        for d, cs in sorted(curves.items()):
            name = dataset_display_name(d)
            plot = fraction_plot(cs, w.stem(f"label_fraction_{d}"), f"{name}: mIoU vs labels")
            caption = f"{name}: test mIoU against the share of training labels"
            w.figure(sec, plot, caption + " (frozen solid, fine-tuned dashed)")
