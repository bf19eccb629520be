"""Labels derived from interferogram maps at convert time, by rules whose parameters are the
layout's `derive:`; `RULES_TEXT` and `LOS_CONVENTION` go into the cube's attrs with them."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np

from ..errors import ConvertError, FieldError
from ..mapping import from_mapping, rule

LOS_CONVENTION = (
    "d_los = -lambda / (4 pi) * (phi_unwrapped - median over valid pixels), metres, positive"
    " towards the satellite"
)
RULES_TEXT = {
    "valid": "valid pixels: finite unwrapped phase and coherence >= mask_coherence",
    "coherence_classification": (
        "class = number of thresholds <= the statistic (median) of coherence over finite pixels"
    ),
    "deformation_box": (
        "extent (x_min, y_min, x_max, y_max; end-exclusive px) of valid pixels with |d_los| >"
        " threshold_m, connected regions smaller than min_pixels dropped; none left: no box"
    ),
    "fringe_counting": (
        "round((max - min) / 2 pi) of the unwrapped phase over valid pixels inside the deformation"
        " box; 0 without a box"
    ),
    "deformation_mask": (
        "per pixel: 1 = the pixels the deformation_box rule keeps, 0 = other valid pixels, -1"
        " (ignore) = invalid pixels; so the box of the mask's 1s is the deformation box"
    ),
}
MASK_IGNORE = -1  # catalog.CUBE_IGNORE_INDEX: every cube stores ignore pixels as -1


@dataclass(frozen=True)
class Rules:
    """The `derive:` parameters of a layout (defaults are the catalog's documented values)."""

    NOUN: ClassVar[str] = "derive: parameter"
    ERROR: ClassVar[type] = ConvertError

    coherence_statistic: str = rule(
        "median", key="coherence_classification.statistic", choices=("median", "mean")
    )
    coherence_thresholds: tuple[float, ...] = rule(
        (0.3, 0.6), key="coherence_classification.thresholds"
    )
    coherence_classes: tuple[str, ...] = rule(
        ("low", "medium", "high"), key="coherence_classification.classes"
    )
    mask_coherence: float = 0.3
    threshold_m: float = rule(0.01, key="deformation_box.threshold_m")
    min_pixels: int = rule(4, key="deformation_box.min_pixels")

    def __post_init__(self):
        t = self.coherence_thresholds
        if len(self.coherence_classes) != len(t) + 1 or list(t) != sorted(t):
            raise FieldError(
                "derive.coherence_classification needs ascending thresholds and one class more"
                " than thresholds"
            )

    @classmethod
    def from_options(cls, d: dict, where: str) -> "Rules":
        """A layout's `derive:` block with the documented defaults, checked."""
        return from_mapping(cls, d, f"{where}.derive")

    def as_attrs(self) -> dict:
        """The parameters as the `derive:` block nests them, the LOS convention and the rule
        sentences: the cube says how its labels were made."""
        out: dict = {}
        for f in fields(self):
            group, _, key = f.metadata.get("key", f.name).rpartition(".")
            v = getattr(self, f.name)
            (out.setdefault(group, {}) if group else out)[key] = list(v) if type(v) is tuple else v
        return {**out, "los_convention": LOS_CONVENTION, "rules": dict(RULES_TEXT)}


def phase_to_los(phase: np.ndarray, wavelength_m: float) -> np.ndarray:
    """LOS displacement (m) of an (unwrapped) phase (rad): -lambda / (4 pi) * phase."""
    return -wavelength_m / (4 * math.pi) * phase


def los_to_phase(los_m: np.ndarray, wavelength_m: float) -> np.ndarray:
    """Radians from metres, the inverse of `phase_to_los` (the synthetic generator uses it)."""
    return -4 * math.pi / wavelength_m * los_m


def wrap(phase: np.ndarray) -> np.ndarray:
    """Phase wrapped into (-pi, pi]."""
    dtype = np.asarray(phase).dtype
    return np.angle(np.exp(1j * phase)).astype(dtype if dtype.kind == "f" else np.float64)


def coherence_class(coherence: np.ndarray, rules: Rules) -> int:
    """The coherence class by the rule's statistic over finite pixels; -1 if none is finite."""
    c = coherence[np.isfinite(coherence)]
    if c.size == 0:
        return -1
    stat = float(np.median(c) if rules.coherence_statistic == "median" else c.mean())
    return int(np.searchsorted(np.asarray(rules.coherence_thresholds), stat, side="right"))


def valid_mask(unwrapped: np.ndarray, coherence: np.ndarray, rules: Rules) -> np.ndarray:
    """The pixels labels may use: finite unwrapped phase and coherence >= `mask_coherence`."""
    return np.isfinite(unwrapped) & np.isfinite(coherence) & (coherence >= rules.mask_coherence)


def relative_los(unwrapped: np.ndarray, valid: np.ndarray, wavelength_m: float) -> np.ndarray:
    """LOS relative to the valid pixels' median (unwrapped phase has no absolute zero)."""
    ref = float(np.median(unwrapped[valid])) if valid.any() else 0.0
    return phase_to_los(unwrapped - ref, wavelength_m)


def kept_regions(mask: np.ndarray, min_pixels: int) -> np.ndarray:
    """The pixels of `mask` in connected regions (4-neighbour) of >= min_pixels."""
    from scipy import ndimage

    lab, n = ndimage.label(mask)
    if n == 0:
        return np.zeros(mask.shape, bool)
    keep = np.flatnonzero(np.bincount(lab.ravel()) >= min_pixels)
    return np.isin(lab, keep[keep > 0])


def box_of(mask: np.ndarray, min_pixels: int) -> tuple[float, float, float, float] | None:
    """End-exclusive box of all regions of >= min_pixels of `mask` (None if none is left)."""
    ys, xs = np.nonzero(kept_regions(mask, min_pixels))
    if xs.size == 0:
        return None
    return float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)


def deformation_mask(los_m: np.ndarray, valid: np.ndarray, rules: Rules) -> np.ndarray:
    """int8: 1 deformation (the box rule's pixels: valid ones moving more than `threshold_m` in
    LOS, small regions dropped), 0 other valid pixels, -1 ignore."""
    out = np.where(valid, 0, MASK_IGNORE).astype(np.int8)
    out[kept_regions(valid & (np.abs(los_m) > rules.threshold_m), rules.min_pixels)] = 1
    return out


def box_mask(box, height: int, width: int) -> np.ndarray:
    """int8 map of a human box: 1 inside, 0 outside (None: no deformation, all 0)."""
    out = np.zeros((height, width), np.int8)
    if box is not None:
        x0, y0, x1, y1 = box
        out[max(0, math.floor(y0)) : math.ceil(y1), max(0, math.floor(x0)) : math.ceil(x1)] = 1
    return out


def polygon_mask(polygons: list[list[tuple[float, float]]], height: int, width: int) -> np.ndarray:
    """int8: 1 where a pixel centre lies inside any polygon (even-odd rule), else 0."""
    yy, xx = np.mgrid[0:height, 0:width]
    px, py = xx.ravel() + 0.5, yy.ravel() + 0.5
    out = np.zeros(px.size, bool)
    for poly in polygons:
        inside = np.zeros(px.size, bool)
        pts = list(poly)
        for (xa, ya), (xb, yb) in zip(pts, pts[1:] + pts[:1]):
            if ya == yb:
                continue
            cross = (ya > py) != (yb > py)
            xi = xa + (py - ya) * (xb - xa) / (yb - ya)
            inside ^= cross & (px < xi)
        out |= inside
    return out.reshape(height, width).astype(np.int8)


def fringe_count(unwrapped: np.ndarray, valid: np.ndarray, box) -> int:
    """2 pi cycles of unwrapped phase spanned inside the box (0 without one, as RULES_TEXT says)."""
    if box is None:
        return 0
    x0, y0, x1, y1 = (int(v) for v in box)
    v = unwrapped[y0:y1, x0:x1][valid[y0:y1, x0:x1]]
    return int(round(float(v.max() - v.min()) / (2 * math.pi))) if v.size else 0


def derive(
    coherence: np.ndarray, unwrapped: np.ndarray | None, wavelength_m: float, rules: Rules, box=...
) -> dict:
    """Every derived label of one pair (a given box, e.g. annotated, is also the mask)."""
    out = {
        "coherence_class": coherence_class(coherence, rules),
        "box": None if box is ... else box,
        "fringes": None,
        "mask": None if box is ... else box_mask(box, *coherence.shape),
    }
    if unwrapped is not None:
        valid = valid_mask(unwrapped, coherence, rules)
        if box is ...:
            mask = deformation_mask(relative_los(unwrapped, valid, wavelength_m), valid, rules)
            out["box"], out["mask"] = box_of(mask == 1, 1), mask
        out["fringes"] = fringe_count(unwrapped, valid, out["box"])
    return out
