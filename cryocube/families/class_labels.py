"""Image-level labels of a Cryo-Bench tile cube from its per-tile class fractions, read by `probe
--tasks-from` and the Cryo-Bench questions alike, so a VLM is scored against the probe's labels."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..cube import as_text


@dataclass(frozen=True)
class ClassLabels:
    name: str  # the cube's class name
    slug: str  # as probe task names spell it (`<slug>_present__cls`, `<slug>_fraction__regr`)
    present: np.ndarray  # per sample 1.0 / 0.0 (the class occurs among the tile's labelled pixels)
    fraction: np.ndarray  # per sample: its share of the labelled pixels


def slug(name: str) -> str:
    """The class name as probe task names spell it: lower-case a-z0-9 runs joined by '_'."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "class"


def class_labels(ds) -> tuple[np.ndarray, list[ClassLabels]]:
    """(labelled, per class labels) of an open tile cube; a tile with no labelled pixel has none."""
    frac = np.asarray(ds["class_fraction"].values, dtype=np.float64)
    labelled = frac.sum(axis=1) > 0
    return labelled, [
        ClassLabels(str(name), slug(str(name)), (frac[:, c] > 0).astype(float), frac[:, c])
        for c, name in enumerate(as_text(ds["class"].values))
    ]
