"""`cryocube inspect`: a cube in words (samples per split, class balance or tasks, band statistics,
chunking)."""

from __future__ import annotations

import numpy as np

from .. import store as _store
from .read import open_cube
from .schema import COMPLETE_ATTR, as_text


def _tile_summary(ds, split, names) -> list[str]:
    scenes, cf = as_text(ds["scene"].values), ds["class_fraction"].values
    lines = [
        f"scenes: {len(np.unique(scenes))}  tile: {ds.sizes['y']}x{ds.sizes['x']}  bands:"
        f" {ds.sizes['band']}  dtype: {ds['image'].dtype}",
        "class balance (mean area fraction per split):",
    ]
    for n in names:
        m = cf[split == n].mean(axis=0) if (split == n).any() else np.zeros(cf.shape[1])
        lines.append(
            f"  {n:<8} " + "  ".join(f"{c}={v:.3f}" for c, v in zip(ds["class"].values, m))
        )
    return lines


def _sample_summary(ds) -> list[str]:
    """Sample cubes: shape, labelled samples per task, answers, what the cube cannot serve."""
    lines = [f"image {dict(ds['image'].sizes)}  dtype: {ds['image'].dtype}"]
    target = np.asarray(ds["target"].values)
    for j, (t, k) in enumerate(zip(as_text(ds["task"].values), as_text(ds["task_type"].values))):
        lines.append(f"  task {t} ({k}): {int(np.isfinite(target[:, j]).sum())} labelled")
    if "answer" in ds:
        ans = as_text(ds["answer"].values)
        for j, t in enumerate(as_text(ds["text_task"].values)):
            lines.append(f"  text {t}: {int((ans[:, j] != '').sum())} answers")
    if "box" in ds:
        boxed = int(np.isfinite(np.asarray(ds["box"].values)).all(axis=1).sum())
        lines.append(f"  box: {boxed} samples with a box")
    # the per-pixel deformation target (segmentation): where each sample's came from
    if "mask_origin" in ds:
        origin = as_text(ds["mask_origin"].values)
        counts = ", ".join(f"{o} {int((origin == o).sum())}" for o in sorted(set(origin.tolist())))
        lines.append(f"  mask (per pixel): {counts}")
    for t, why in (ds.attrs.get("unavailable") or {}).items():
        lines.append(f"  unavailable {t}: {why}")
    return lines


def summary(url: str, storage_options: dict | None = None) -> str:
    """Samples per split, class balance, band statistics beside the published, chunks, size."""
    ds = open_cube(url, storage_options, allow_incomplete=True)
    a = ds.attrs
    state = "complete" if COMPLETE_ATTR in a else "INCOMPLETE (resume with `cryocube convert`)"
    lines = [
        f"cube {url}  [{state}]",
        f"dataset {a.get('dataset')}: {a.get('title', '')}  layout={a.get('layout')}  schema"
        f" v{a.get('schema_version')}",
    ]
    if COMPLETE_ATTR in a:
        lines.append(
            f"checksum {a[COMPLETE_ATTR]['checksum'][:16]}…  written {a[COMPLETE_ATTR]['time']}"
        )
    split = as_text(ds["split"].values)
    names, counts = np.unique(split, return_counts=True)
    shown = ", ".join(f"{n}={c}" for n, c in zip(names, counts))
    lines.append(f"samples: {shown} (total {split.size})")
    lines += _sample_summary(ds) if a.get("kind") == "samples" else _tile_summary(ds, split, names)
    lines.append(
        f"{'band':<17}{'alias':<17}{'role':<11}{'mean':>12}{'pub.mean':>12}{'std':>12}{'pub.std':>12}{'min':>10}{'max':>10}"
    )
    for i in range(ds.sizes["band"]):
        lines.append(
            f"{str(ds['band'].values[i]):<17}{str(ds['alias'].values[i]):<17}{str(ds['role'].values[i]):<11}"
            f"{ds['band_mean'].values[i]:>12.4g}{ds['published_mean'].values[i]:>12.4g}"
            f"{ds['band_std'].values[i]:>12.4g}{ds['published_std'].values[i]:>12.4g}"
            f"{ds['band_min'].values[i]:>10.4g}{ds['band_max'].values[i]:>10.4g}"
        )
    enc = ds["image"].encoding
    lines.append(
        f"image chunks {enc.get('chunks')} shards {enc.get('shards')}  size on disk"
        f" {_store.size_on_disk(url, storage_options) / 1e6:.1f} MB"
    )
    skipped = a.get("skipped_samples") or []
    if skipped:
        lines.append(
            f"skipped {len(skipped)} samples for bad input, e.g. {skipped[0]['source']}:"
            f" {skipped[0]['reason']}"
        )
    return "\n".join(lines)
