"""A cube sample -> the RGB picture a VLM sees (the task file's `render:`; docs/vlm.md): phase in a
cyclic colour map beside coherence in grey, a rendered cube as published, a tile's bands. Boxes in
answers are fractions of the phase panel, so the layout never moves them."""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass

import numpy as np

from ..cube import as_text
from ..errors import UserError
from .tasks import RenderSpec, TileRender


@dataclass(frozen=True)
class BandFacts:
    """What drawing a tile needs of a band (role, wavelength pick it; train stats stretch it)."""

    name: str
    role: str
    wavelength_um: float
    mean: float
    std: float


def band_facts(ds) -> tuple[BandFacts, ...]:
    """From an open cube's band coordinates (no pixels)."""
    n = int(ds.sizes["band"])

    def col(name):
        return np.asarray(ds[name].values, np.float64) if name in ds else np.full(n, np.nan)

    roles = as_text(ds["role"].values) if "role" in ds else [""] * n
    cols = map(col, ("wavelength_um", "band_mean", "band_std"))
    return tuple(
        BandFacts(str(b), str(r), float(w), float(m), float(s))
        for b, r, w, m, s in zip(as_text(ds["band"].values), roles, *cols)
    )


def tile_bands(
    facts: tuple[BandFacts, ...], spec: TileRender, where: str = ""
) -> tuple[list[int], str]:
    """(band indices: three for colour, one for grey; the picture in words), or a refusal."""
    rgb = []
    for um in spec.rgb_um:
        near = [
            (abs(f.wavelength_um - um), k)
            for k, f in enumerate(facts)
            if f.role == spec.rgb_role and abs(f.wavelength_um - um) <= spec.rgb_tolerance_um
        ]
        rgb.append(min(near)[1] if near else None)
    if None not in rgb and len(set(rgb)) == 3:
        named = ", ".join(facts[k].name for k in rgb)
        return rgb, f"the tile in natural colour (bands {named} as red, green, blue)"
    if grey := [k for k, f in enumerate(facts) if f.role in spec.grey_roles]:
        return grey[:1], f"the tile's {facts[grey[0]].name} band ({facts[grey[0]].role}) in grey"
    raise UserError(
        f"{where}: no band to draw: no {spec.rgb_role} bands near"
        f" {', '.join(f'{u:g}' for u in spec.rgb_um)} um and no band of role"
        f" {' or '.join(spec.grey_roles)} (bands: {', '.join(f.name for f in facts)}); set the task"
        " file's render: rgb or grey"
    )


def render_tile(
    image: np.ndarray, facts: tuple[BandFacts, ...], spec: TileRender, where: str = ""
) -> np.ndarray:
    """(band, y, x) -> (H, W, 3) uint8; NaN (no data) is black."""
    idx, _ = tile_bands(facts, spec, where)
    chans = []
    for k in idx:
        x = np.asarray(image[k], np.float64)
        if spec.stretch == "statistics":
            f = facts[k]
            lo, hi = f.mean - spec.stds * f.std, f.mean + spec.stds * f.std
        else:
            ok = x[np.isfinite(x)]
            lo, hi = np.percentile(ok, spec.percentiles) if ok.size else (0.0, 1.0)
        hi = hi if hi > lo else lo + 1.0
        chans.append(_scaled(x, float(lo), float(hi)).astype(np.uint8))
    return _enlarged(np.stack(chans * 3 if len(chans) == 1 else chans, -1), spec.scale)


@functools.cache
def _lut(name: str) -> np.ndarray:
    import matplotlib

    rgb = np.asarray(matplotlib.colormaps[name](np.linspace(0, 1, 256)))[:, :3]
    return (rgb * 255).round().astype(np.uint8)


def _scaled(a: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """0..255 indices; NaN (no data) -> 0."""
    x = np.nan_to_num((np.asarray(a, np.float64) - lo) / (hi - lo), nan=0.0)
    return (np.clip(x, 0, 1) * 255).round().astype(np.int64)


def _band(image: np.ndarray, bands: list[str], name: str, where: str) -> np.ndarray:
    if name not in bands:
        raise UserError(
            f"{where}: the cube has no band {name!r} to draw (bands: {', '.join(bands)}); "
            "set the task file's render: bands"
        )
    return image[bands.index(name)]


def render(
    image: np.ndarray,
    bands: list[str],
    spec: RenderSpec | TileRender,
    rendered: bool = False,
    where: str = "",
    facts: tuple[BandFacts, ...] = (),
) -> np.ndarray:
    """(band, y, x) maps -> (H, W, 3) uint8 (`facts`: the cube's bands, for tiles)."""
    if isinstance(spec, TileRender):
        return render_tile(image, facts, spec, where)
    if rendered:
        lo, hi = spec.rendered_range
        phase = np.stack(
            [_scaled(_band(image, bands, b, where), lo, hi) for b in spec.rendered_phase], -1
        ).astype(np.uint8)
        coh = _scaled(_band(image, bands, spec.rendered_coherence, where), lo, hi)
    else:
        phase = _lut(spec.phase_colormap)[
            _scaled(_band(image, bands, spec.phase_band, where), *spec.phase_range)
        ]
        coh = _scaled(_band(image, bands, spec.coherence_band, where), *spec.coherence_range)
    panels = [phase]
    if spec.layout == "side_by_side":
        panels.append(_lut(spec.coherence_colormap)[coh])
    return _enlarged(np.concatenate(panels, axis=1), spec.scale)


def _enlarged(rgb: np.ndarray, scale: int) -> np.ndarray:
    """Each pixel as a scale x scale block (a small tile stays legible to a VLM)."""
    return np.ascontiguousarray(
        rgb.repeat(scale, axis=0).repeat(scale, axis=1) if scale > 1 else rgb
    )


def png_bytes(rgb: np.ndarray) -> bytes:
    """A rendered picture as PNG: lossless, so the gallery shows the very pixels the model saw."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()
