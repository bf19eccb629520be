"""Qualitative panels: image, label and (when a run stored them) prediction of chosen test tiles,
from the cube and a run's `predictions.zarr` (`pred(sample, y, x)`, `sample`: cube index)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Sequence

import matplotlib
import matplotlib.colors
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .. import cube, store
from ..errors import CubeReadError, UserError
from ..report.plots import save
from ..report.records import Run

IGNORE_COLOUR = (0.85, 0.85, 0.85)
RGB_BANDS = (("B4", "B3", "B2"), ("red", "green", "blue"), ("R", "G", "B"))


def open_cube(url: str):
    """The cube of a panel, even incomplete; unopenable or without image/label: a CubeReadError."""
    try:
        with warnings.catch_warnings():
            # "not consolidated" fallback is fine here
            warnings.simplefilter("ignore", RuntimeWarning)
            ds = cube.open_cube(url, allow_incomplete=True)
    except UserError:
        raise
    except Exception as e:  # zarr/fsspec raise many kinds; the user needs the URL and the reason
        raise CubeReadError(f"{url}: cannot open the cube ({type(e).__name__}: {e})") from None
    for var in ("image", "label"):
        if var not in ds:
            raise CubeReadError(
                f"{url}: the cube has no '{var}' array (found: {', '.join(ds.data_vars)})"
            )
    return ds


def default_samples(ds, n: int = 4, split: str = "test") -> list[int]:
    """The first n samples of the split (all samples if the cube has no split coordinate)."""
    if "split" in ds.coords:
        # vlen strings come back as StringDType
        splits = np.array([str(v) for v in ds["split"].values])
        idx = np.flatnonzero(splits == split)
        if idx.size:
            return [int(i) for i in idx[:n]]
    return list(range(min(n, ds.sizes["sample"])))


def _class_palette(ds) -> tuple[list[str], list]:
    classes = ds.attrs.get("classes") or []
    names, colours = [], []
    for k, c in enumerate(classes):
        c = c if isinstance(c, dict) else {"name": str(c)}
        names.append(c.get("name", f"class {k}"))
        try:  # a named colour, else (none, or one matplotlib cannot read) tab10's
            colours.append(matplotlib.colors.to_rgb(c.get("colour") or c.get("color")))
        except ValueError:
            colours.append(matplotlib.colormaps["tab10"](k % 10)[:3])
    return names, colours


def colourise(label: np.ndarray, colours: list) -> np.ndarray:
    """Class indices -> RGB; ignore (<0) and out-of-range values in light grey."""
    n = max(len(colours), int(label.max()) + 1 if label.size else 0)
    lut = np.array(
        list(colours)
        + [matplotlib.colormaps["tab10"](k % 10)[:3] for k in range(len(colours), n)]
        + [IGNORE_COLOUR],
        dtype=float,
    )
    idx = np.where((label < 0) | (label >= n), n, label)
    return lut[idx]


def to_display(image: np.ndarray, band_names: Sequence[str]) -> np.ndarray:
    """(band, y, x) -> RGB (or grey) in [0, 1], 2-98 percentile stretch per channel."""
    names = [str(b) for b in band_names]
    chans = next(
        ([names.index(b) for b in trio] for trio in RGB_BANDS if all(b in names for b in trio)), [0]
    )
    img = np.asarray(image, dtype=float)[chans]
    out = np.zeros_like(img)
    for k, ch in enumerate(img):
        finite = ch[np.isfinite(ch)]
        if finite.size:
            lo, hi = np.percentile(finite, [2, 98])
            out[k] = np.clip((np.nan_to_num(ch, nan=lo) - lo) / (hi - lo if hi > lo else 1.0), 0, 1)
    rgb = out.transpose(1, 2, 0)
    return np.repeat(rgb, 3, axis=2) if len(chans) == 1 else rgb


def _prediction_panel(ax, pred, label: np.ndarray, colours: list) -> None:
    if pred is None:
        ax.text(0.5, 0.5, "no prediction\nfor this sample", ha="center", va="center", fontsize=8)
        ax.set_title("prediction", fontsize=8)
        return
    p = np.asarray(pred).astype(int)
    ax.imshow(colourise(p, colours), interpolation="nearest")
    valid = label >= 0
    acc = f" (pixel acc {(p[valid] == label[valid]).mean() * 100:.1f}%)" if valid.any() else ""
    ax.set_title("prediction" + acc, fontsize=8)


def qualitative_panels(
    cube_url: str,
    predictions_url: str | None,
    samples: Sequence[int] | None,
    out: str | Path,
    *,
    title: str | None = None,
) -> list[Path]:
    """A figure (PNG + SVG at stem `out`), a row per sample: image, label[, prediction]."""
    ds = open_cube(cube_url)
    samples = list(samples) if samples else default_samples(ds)
    n_samples = ds.sizes["sample"]
    if bad := [s for s in samples if not 0 <= s < n_samples]:
        raise CubeReadError(f"{cube_url}: sample(s) {bad} out of range (the cube has {n_samples})")
    pred, pred_row = None, {}
    if predictions_url is not None:
        try:
            g = store.open_group(str(predictions_url), "r")
            pred, index = g["pred"], np.asarray(g["sample"][:]).astype(int)
        except Exception as e:
            raise CubeReadError(
                f"{predictions_url}: cannot read predictions (needs arrays 'pred' and 'sample'):"
                f" {e}"
            ) from None
        pred_row = {int(s): k for k, s in enumerate(index)}
    names, colours = _class_palette(ds)
    band_names = (
        ds["band"].values if "band" in ds.coords else [str(i) for i in range(ds.sizes["band"])]
    )
    ncol = 3 if pred is not None else 2
    fig = Figure(figsize=(3.0 * ncol, 3.0 * len(samples) + 0.9), layout="constrained")
    axes = fig.subplots(len(samples), ncol, squeeze=False)
    for row, s in zip(axes, samples):
        item = ds.isel(sample=s)
        label = np.asarray(item["label"].values).astype(int)
        scene = str(item["scene"].values) if "scene" in item.coords else ""
        split = str(item["split"].values) if "split" in item.coords else ""
        row[0].imshow(to_display(item["image"].values, band_names))
        where = (f" · {scene}" if scene else "") + (f" ({split})" if split else "")
        row[0].set_title(f"sample {s}{where}", fontsize=8)
        row[1].imshow(colourise(label, colours), interpolation="nearest")
        row[1].set_title("label", fontsize=8)
        if pred is not None:
            _prediction_panel(row[2], pred[pred_row[s]] if s in pred_row else None, label, colours)
        for ax in row:
            ax.set(xticks=[], yticks=[])
    handles = [
        Patch(color=c, label=n) for n, c in [*zip(names, colours), ("ignore", IGNORE_COLOUR)]
    ]
    ncol = min(len(handles), 4)
    fig.legend(handles=handles, loc="outside lower center", ncol=ncol, fontsize=8, frameon=False)
    fig.suptitle(
        title or f"{ds.attrs.get('dataset', Path(str(cube_url)).name)}: test tiles", fontsize=10
    )
    return save(fig, Path(out))


def find_predictions(run: Run, sources: Sequence[str]) -> str | None:
    """Where a run's predictions.zarr lives: a URL in the record, or <results>[/runs]/<run_id>/."""
    rec = run.record
    cands = [rec.get("predictions"), rec.get("predictions_url")]
    if rec.get("run_dir"):
        cands.append(store.join(str(rec.get("run_dir")), "predictions.zarr"))
    for src in sources if run.run_id else ():
        base = str(src).rsplit("/", 1)[0]
        cands += [store.join(base, *d, run.run_id, "predictions.zarr") for d in ((), ("runs",))]
    return next((str(c) for c in cands if c and store.exists(str(c))), None)
