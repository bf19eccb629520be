"""Interferogram -> the RGB picture a VLM sees: phase through a cyclic colour map, coherence in grey,
side by side or the phase alone (the task's `render:`). Rendered cubes (Hephaestus' PNG bands) are
shown as published. Boxes in answers are fractions of the phase panel, so the layout never moves them.
"""
from __future__ import annotations

import functools

import numpy as np

from ...errors import UserError
from .tasks import RenderSpec


@functools.cache
def _lut(name: str) -> np.ndarray:
    import matplotlib

    return (np.asarray(matplotlib.colormaps[name](np.linspace(0, 1, 256)))[:, :3] * 255).round().astype(np.uint8)


def _scaled(a: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """0..255 indices; NaN (no data) -> 0."""
    x = np.nan_to_num((np.asarray(a, np.float64) - lo) / (hi - lo), nan=0.0)
    return (np.clip(x, 0, 1) * 255).round().astype(np.int64)


def _band(image: np.ndarray, bands: list[str], name: str, where: str) -> np.ndarray:
    if name not in bands:
        raise UserError(f"{where}: the cube has no band {name!r} to draw (bands: {', '.join(bands)}); "
                        "set the task file's render: bands")
    return image[bands.index(name)]


def render(image: np.ndarray, bands: list[str], spec: RenderSpec, rendered: bool = False, where: str = "") -> np.ndarray:
    """(band, y, x) maps -> (H, W, 3) uint8."""
    if rendered:
        lo, hi = spec.rendered_range
        phase = np.stack([_scaled(_band(image, bands, b, where), lo, hi) for b in spec.rendered_phase], -1).astype(np.uint8)
        coh = _scaled(_band(image, bands, spec.rendered_coherence, where), lo, hi)
    else:
        phase = _lut(spec.phase_colormap)[_scaled(_band(image, bands, spec.phase_band, where), *spec.phase_range)]
        coh = _scaled(_band(image, bands, spec.coherence_band, where), *spec.coherence_range)
    panels = [phase]
    if spec.layout == "side_by_side":
        panels.append(_lut(spec.coherence_colormap)[coh])
    out = np.concatenate(panels, axis=1)
    if spec.scale > 1:
        out = out.repeat(spec.scale, axis=0).repeat(spec.scale, axis=1)
    return np.ascontiguousarray(out)


def png_bytes(rgb: np.ndarray) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()
