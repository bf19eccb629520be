"""Confusion matrices (int64, map side) and the metrics computed from their sum (reduce side), with
the reference evaluator's metric names and absent classes fixed (docs/deviations.md)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def confusion_matrix(pred, target, num_classes: int, ignore_index: int = -1) -> np.ndarray:
    """K x K int64 matrix, rows = ground truth, columns = prediction; ignore pixels dropped."""
    p = np.asarray(pred).reshape(-1).astype(np.int64)
    t = np.asarray(target).reshape(-1).astype(np.int64)
    keep = t != ignore_index
    p, t = p[keep], t[keep]
    if t.size and (t.min() < 0 or t.max() >= num_classes):
        raise ValueError(
            f"target values outside 0..{num_classes - 1}:"
            f" {np.unique(t[(t < 0) | (t >= num_classes)])[:5]}"
        )
    return np.bincount(t * num_classes + p, minlength=num_classes * num_classes).reshape(
        num_classes, num_classes
    )


def metrics_from_confusion(cm: np.ndarray, class_names: Iterable[str] | None = None) -> dict:
    """Per-class IoU/F1/precision/recall and their means, in percent."""
    cm = np.asarray(cm, dtype=np.int64)
    k = cm.shape[0]
    names = list(class_names) if class_names is not None else [str(i) for i in range(k)]
    tp = np.diag(cm).astype(np.float64)
    gt = cm.sum(axis=1).astype(np.float64)
    pr = cm.sum(axis=0).astype(np.float64)
    union = gt + pr - tp
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(union > 0, tp / union, np.nan)
        precision = np.where(pr > 0, tp / pr, np.where(gt > 0, 0.0, np.nan))
        recall = np.where(gt > 0, tp / gt, np.nan)
        f1 = np.where(union > 0, 2 * tp / (gt + pr), np.nan)
    total = cm.sum()
    pct = lambda a: {n: None if np.isnan(v) else float(100 * v) for n, v in zip(names, a)}  # noqa: E731
    mean = lambda a: float(100 * np.nanmean(a)) if np.any(~np.isnan(a)) else float("nan")  # noqa: E731
    return {
        "mIoU": mean(iou),
        "mF1": mean(f1),
        "oAcc": float(100 * tp.sum() / total) if total else float("nan"),
        "mAcc": mean(recall),
        "IoU": pct(iou),
        "F1": pct(f1),
        "precision": pct(precision),
        "recall": pct(recall),
        "pixels": int(total),
    }


class TileConfusions:
    """Per-tile confusion matrices of some test positions; they add in any order."""

    __slots__ = ("positions", "cms")

    def __init__(self, positions: np.ndarray, cms: np.ndarray):
        self.positions = np.asarray(positions, dtype=np.int64)
        self.cms = np.asarray(cms, dtype=np.int64)

    def __add__(self, other: TileConfusions) -> TileConfusions:
        return TileConfusions(
            np.concatenate([self.positions, other.positions]), np.concatenate([self.cms, other.cms])
        )

    def ordered(self) -> TileConfusions:
        """The tiles in test-split order (a reduce may have joined blocks in any order)."""
        o = np.argsort(self.positions, kind="stable")
        return TileConfusions(self.positions[o], self.cms[o])

    def total(self) -> np.ndarray:
        """The summed K x K matrix the run is scored on."""
        return self.cms.sum(axis=0, dtype=np.int64)
