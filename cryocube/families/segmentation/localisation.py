"""Deformation localisation by a segmentation run on an interferogram cube, the grounding score a
VLM gets: predicted test mask -> box (`RULE`) -> IoU against the cube's `box`."""

from __future__ import annotations

import numpy as np

from ... import store as _store
from ...convert.insar_labels import box_of
from ...cube import open_cube, sample_ids
from ...questions.metrics import box_iou, summarize
from ..split import samples_hash

RULE = (
    "box of all predicted deformation pixels in connected regions of >= min_pixels (the cube's"
    " deformation_box rule); no such pixel: no box, IoU 0; scored on test samples with a"
    " reference box"
)


def predicted_box(
    pred: np.ndarray, height: int, width: int, positive: int = 1, min_pixels: int = 1
):
    """End-exclusive box of a predicted mask's positive pixels within the pair's extent."""
    return box_of(np.asarray(pred)[:height, :width] == positive, min_pixels)


def box_scores(
    preds, refs, sizes, min_pixels: int = 1, positive: int = 1
) -> tuple[list[float], int, int]:
    """(IoU per sample with a reference box; of the others, those given a box, and their count)."""
    ious, false_boxes, no_ref = [], 0, 0
    for pred, ref, (h, w) in zip(preds, refs, sizes):
        box = predicted_box(pred, h, w, positive, min_pixels)
        if ref is None:
            no_ref += 1
            false_boxes += box is not None
        else:
            ious.append(box_iou(box, ref))
    return ious, false_boxes, no_ref


def localisation(cube_url: str, predictions_url: str, test: np.ndarray, scored: np.ndarray) -> dict:
    """The record's `localisation` entry: box IoU (%), its 95 % interval and n, over the `scored`
    test samples (a labelled reference mask); "no deformation" ones count apart (`false_boxes`)."""
    ds = open_cube(cube_url)
    pred = np.asarray(_store.open_group(predictions_url, "r")["pred"][:])
    box = np.asarray(ds["box"].values, np.float64)[test]
    # each pair's own extent (padding left out), else the whole prediction
    hs, ws = (
        np.asarray(ds[n].values)[test] if n in ds else np.full(test.size, pred.shape[a])
        for n, a in (("height", 1), ("width", 2))
    )
    derivation = ds.attrs.get("derivation") or {}
    min_pixels = int((derivation.get("deformation_box") or {}).get("min_pixels", 1))
    keep = np.flatnonzero(scored)
    refs = [tuple(b) if np.isfinite(b).all() else None for b in box[keep]]
    ious, false_boxes, no_ref = box_scores(
        pred[keep], refs, list(zip(hs[keep], ws[keep])), min_pixels
    )
    ids = sample_ids(ds, cube_url)[test][keep]
    return {
        "task": str(ds.attrs.get("box_task", "deformation_localization")),
        "metric": "box_iou",
        **summarize("box_iou", ious),
        "rule": RULE,
        "min_pixels": min_pixels,
        "unit": "%",
        "split": "test",
        # the board cell's samples
        "samples": samples_hash(str(i) for i, r in zip(ids, refs) if r is not None),
        "false_boxes": int(false_boxes),
        "no_box_samples": int(no_ref),
    }
