"""The report's figures, as PNG and SVG (the paths returned); `Figure`, not pyplot, so a
notebook's plotting state is left alone."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from .leaderboard import Leaderboard
from .names import dataset_display_name
from .tables import Table

FORMATS = ("png", "svg")
DPI = 110
CELL_TEXT = {"ha": "center", "va": "center", "fontsize": 7}  # a value written in a heatmap cell


def save(fig, stem: Path) -> list[Path]:
    """PNG and SVG at `stem`; SVG text stays text (searchable) and undated, so reruns compare."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in FORMATS:
        p = stem.with_suffix(f".{ext}")
        with matplotlib.rc_context({"svg.fonttype": "none"}):
            fig.savefig(
                p, dpi=DPI, bbox_inches="tight", metadata={"Date": None} if ext == "svg" else None
            )
        paths.append(p)
    return paths


def panel(figsize):
    """A one-panel figure: (figure, axes)."""
    fig = Figure(figsize=figsize)
    return fig, fig.add_subplot()


def finish(
    ax,
    stem: Path,
    title: str,
    xlabel: str = "",
    ylabel: str = "",
    *,
    title_size: float | None = None,
    grid: dict | None = None,
    legend: dict | None = None,
) -> list[Path]:
    """What every one-panel figure ends with: labels, title, grid and legend if given, `save`."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, **({} if title_size is None else {"fontsize": title_size}))
    if grid is not None:
        ax.grid(**grid)
    if legend is not None:
        ax.legend(**legend)
    return save(ax.figure, stem)


def colours(n: int):
    """n distinct colours (tab10, tab20 beyond ten)."""
    cmap = matplotlib.colormaps["tab20" if n > 10 else "tab10"]
    return [cmap(i % cmap.N) for i in range(n)]


def radar_chart(lb: Leaderboard, stem: Path) -> list[Path]:
    """Models across datasets (mean mIoU), one polygon per model; a missing cell breaks its line."""
    ds = lb.datasets
    if len(ds) < 3:  # a radar needs three axes; fall back to grouped bars
        return _grouped_bars(lb, stem)
    angles = np.linspace(0, 2 * math.pi, len(ds), endpoint=False).tolist()
    fig = Figure(figsize=(7.5, 6.5))
    ax = fig.add_subplot(polar=True)
    closed = angles + angles[:1]  # each polygon back to its first dataset
    for row, colour in zip(lb.rows, colours(len(lb.rows))):
        vals = [row.cells[d].mean if d in row.cells else np.nan for d in ds]
        ax.plot(closed, vals + vals[:1], color=colour, lw=1.4, label=row.name, marker="o", ms=3)
    ax.set_xticks(angles)
    ax.set_xticklabels([dataset_display_name(d) for d in ds])
    ax.set_ylim(0, 100)
    # radial tick labels between the first two axes, off the data
    ax.set_rlabel_position(180 / len(ds))
    ax.set_title(f"{lb.title}: mIoU per dataset", pad=18)
    ax.legend(loc="upper left", bbox_to_anchor=(1.08, 1.0), fontsize=8, frameon=False)
    return save(fig, stem)


def _grouped_bars(lb: Leaderboard, stem: Path) -> list[Path]:
    fig, ax = panel(figsize=(max(5, 0.5 * len(lb.rows) * len(lb.datasets)), 4))
    w = 0.8 / max(1, len(lb.datasets))
    x = np.arange(len(lb.rows))
    for k, d in enumerate(lb.datasets):
        means = [r.cells[d].mean if d in r.cells else 0 for r in lb.rows]
        ax.bar(x + k * w, means, w, label=dataset_display_name(d))
    ax.set_xticks(
        x + w * (len(lb.datasets) - 1) / 2, [r.name for r in lb.rows], rotation=45, ha="right"
    )
    return finish(
        ax, stem, f"{lb.title}: mIoU per dataset", "", "mIoU (%)", legend={"frameon": False}
    )


def retention_bars(t: Table, stem: Path) -> list[Path]:
    """Few-shot retention (%) per model, from the retention table."""
    names = t.column_values("model")
    vals = t.column_values("retention")
    keep = [(n, v) for n, v in zip(names, vals) if v is not None]
    fig, ax = panel(figsize=(max(5, 0.45 * len(keep) + 2), 4))
    if keep:
        x = np.arange(len(keep))
        bars = ax.bar(x, [v for _, v in keep], color="#4C72B0")
        ax.bar_label(bars, labels=[f"{v:.1f}" for _, v in keep], fontsize=7, padding=2)
        ax.set_xticks(x, [n for n, _ in keep], rotation=45, ha="right")
    ax.axhline(100, color="grey", lw=0.8, ls="--")
    return finish(ax, stem, t.title, "", "few-shot mIoU / full mIoU (%)")


def cost_scatter(
    points: Sequence[tuple[str, float, float, str]], stem: Path, title: str
) -> list[Path]:
    """Average mIoU against GFLOPs (log axis past a decade), a labelled point per model; each
    point's source ("measured on <device>" | "catalog") marks copied figures, names the device."""
    gs = [g for _, g, _, _ in points]
    # GFLOPs span decades across the catalog
    log = bool(gs) and min(gs) > 0 and max(gs) / min(gs) > 10
    sources = [src for *_, src in points]
    named = [(n + (" (catalog)" if src == "catalog" else ""), g, a) for n, g, a, src in points]
    measured = sorted(
        {src.removeprefix("measured on ") for src in sources if src.startswith("measured on ")}
    )
    xlabel = "GFLOPs per forward pass"
    if measured:
        others = ", others catalog" if "catalog" in sources else ""
        xlabel += f" (measured on {'; '.join(measured)}{others})"
    elif sources:
        xlabel += " (catalog)"
    return labelled_scatter(named, stem, title, xlabel, "average mIoU (%)", log_x=log)


def labelled_scatter(
    points: Sequence[tuple[str, float, float]],
    stem: Path,
    title: str,
    xlabel: str,
    ylabel: str,
    log_x: bool = False,
) -> list[Path]:
    """One labelled point per model (accuracy against cost, probe Q against mIoU)."""
    fig, ax = panel(figsize=(6.5, 4.5))
    for (name, x, y), colour in zip(points, colours(len(points))):
        ax.scatter([x], [y], color=colour, s=36, zorder=3)
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 3), fontsize=7)
    if log_x:
        ax.set_xscale("log")
    return finish(ax, stem, title, xlabel, ylabel, grid={"visible": True, "alpha": 0.3})


def per_class_heatmap(tables: Sequence[Table], stem: Path, title: str) -> list[Path]:
    """One panel per dataset: models × classes, colour = IoU (%), value written in each cell."""
    n = len(tables)
    heights = [max(1.5, 0.3 * len(t.rows) + 1) for t in tables]
    widths = [max(2.5, 1.0 * (len(t.columns) - 1) + 1.5) for t in tables]
    fig = Figure(figsize=(sum(widths) + 1, max(heights) + 0.8), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False, gridspec_kw={"width_ratios": widths})
    same_rows = len({tuple(row[0] for row in t.rows) for t in tables}) == 1  # label models once
    im = None
    for k, (ax, t) in enumerate(zip(axes[0], tables)):
        classes = [c.header for c in t.columns[1:]]
        data = np.array(
            [[np.nan if v is None else v for v in row[1:]] for row in t.rows], dtype=float
        )
        im = ax.imshow(data, vmin=0, vmax=100, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(classes)), classes, rotation=45, ha="right", fontsize=8)
        models = [row[0] for row in t.rows] if k == 0 or not same_rows else []
        ax.set_yticks(range(len(t.rows)), models, fontsize=8)
        for (i, j), v in np.ndenumerate(data):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.0f}", **CELL_TEXT, color="white" if v < 60 else "black")
        ax.set_title(t.title.rsplit(" on ", 1)[-1])
    if im is not None:
        fig.colorbar(im, ax=list(axes[0]), shrink=0.8, label="IoU (%)", pad=0.01)
    fig.suptitle(title)
    return save(fig, stem)


def interval_estimates(rows: Sequence[tuple], stem: Path, title: str) -> list[Path]:
    """rliable's interval plot, IQM and mean panels; rows: (model, IQM, lo, hi, mean, lo, hi), an
    interval's ends None where it has none (one seed per dataset: the point alone)."""
    n = len(rows)
    fig = Figure(figsize=(8, 0.45 * n + 1.4), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    cs = colours(n)
    for k, (ax, name) in enumerate(zip(axes, ("IQM", "Mean"))):
        for i, row in enumerate(rows):
            v, lo, hi = row[1 + 3 * k : 4 + 3 * k]
            lo, hi = (v, v) if lo is None else (lo, hi)
            ax.barh(i, hi - lo, left=lo, height=0.6, color=cs[i], alpha=0.75)
            ax.vlines(v, i - 0.3, i + 0.3, color="black", lw=1.2)
        ax.set_xlabel(f"{name} mIoU (%)")
        ax.grid(True, axis="x", alpha=0.3)
    # shared y axis: its labels are set once (the right panel hides them)
    axes[0].set_yticks(range(n), [r[0] for r in rows])
    axes[1].tick_params(labelleft=False)
    axes[0].invert_yaxis()
    fig.suptitle(title)
    return save(fig, stem)


def improvement_heatmap(
    models: Sequence[str], prob: np.ndarray, lo: np.ndarray, hi: np.ndarray, stem: Path, title: str
) -> list[Path]:
    """P(row > column) per model pair with its interval (NaN: the diagonal, no common dataset)."""
    n = len(models)
    fig, ax = panel(figsize=(1.3 * n + 2.5, 0.9 * n + 1.5))
    im = ax.imshow(prob, vmin=0, vmax=1, cmap="RdBu", aspect="auto")
    for (i, j), v in np.ndenumerate(prob):
        if np.isfinite(v):
            text = f"{v:.2f}\n[{lo[i, j]:.2f}, {hi[i, j]:.2f}]"
            ax.text(j, i, text, **CELL_TEXT, color="white" if abs(v - 0.5) > 0.3 else "black")
    ax.set_xticks(range(n), models, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(n), models, fontsize=8)
    fig.colorbar(im, ax=ax, label="P(X > Y)")
    return finish(ax, stem, title, "Y", "X")


def performance_profile(
    taus: np.ndarray, curves: dict[str, np.ndarray], stem: Path, title: str
) -> list[Path]:
    """rliable's performance profile: each model's share of (dataset, seed) runs above each mIoU."""
    fig, ax = panel(figsize=(6.5, 4.2))
    for (name, frac), colour in zip(curves.items(), colours(len(curves))):
        ax.plot(taus, frac, color=colour, lw=1.6, label=name)
    ax.set_ylim(-0.02, 1.02)
    labels = ("mIoU threshold τ (%)", "fraction of runs with mIoU > τ")
    legend = {"fontsize": 7, "loc": "lower left"}
    return finish(ax, stem, title, *labels, grid={"visible": True, "alpha": 0.3}, legend=legend)
