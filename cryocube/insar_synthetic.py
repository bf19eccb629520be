"""Synthetic interferograms with known answers, for tests and the quickstart (the physics:
docs/insar-cube.md). The truth comes from the noise-free signal, the converter's labels from the
noisy maps, so a test compares the two."""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .catalog import DatasetSpec, load_dataset
from .convert.base import open_reader
from .convert.insar_labels import Rules, box_of, los_to_phase, wrap
from .convert.rawio import write_geotiff
from .synthetic import smooth_field

INCIDENCE_DEG = 35.0  # Sentinel-1 IW mid-swath
HEADING_DEG = -12.0  # ascending track; right-looking, so the look azimuth is heading + 90
PIXEL_M = 100.0
EPOCH = _dt.date(2020, 1, 1)
REVISIT_DAYS = 12


@dataclass
class IfgPair:
    """One generated pair and its truth."""

    id: str  # the sample id a reader reports (the cube's `source`)
    frame: str
    primary: str  # ISO dates
    secondary: str
    wrapped: np.ndarray  # (H, W) float32 rad, as written (GeoTIFF layout)
    coherence: np.ndarray  # (H, W) float32 0..1
    # (H, W) float32 rad, NaN in decorrelated patches (None when the tree has none)
    unwrapped: np.ndarray | None
    # (H, W) noise-free LOS deformation, metres, relative to its median (as InSAR measures it)
    los_m: np.ndarray
    coherence_class: int  # designed class (index into the rules' classes)
    fringes: int  # fringes of the deformation signal over the true box (0 without deformation)
    box: tuple[float, float, float, float] | None  # (x_min, y_min, x_max, y_max) end-exclusive px
    source: str  # "mogi" | "dislocation" | "none"
    atmosphere_level: int  # 0..3 (Hephaestus atmospheric_fringes)
    answers: dict[str, str] = field(default_factory=dict)  # text task -> reference answer
    paths: dict[str, str] = field(default_factory=dict)


@dataclass
class IfgManifest:
    dataset: str
    layout: str
    root: Path
    seed: int
    size: int
    wavelength_m: float
    rules: Rules
    pairs: list[IfgPair] = field(default_factory=list)


# -- physics -----------------------------------------------------------------------------------
def mogi(
    x: np.ndarray, y: np.ndarray, depth: float, dv: float, nu: float = 0.25
) -> tuple[np.ndarray, ...]:
    """(east, north, up) metres of a Mogi source of volume change dv (m^3) at `depth` (m)."""
    r2 = x * x + y * y
    c = (1 - nu) * dv / math.pi / (depth * depth + r2) ** 1.5
    return c * x, c * y, c * depth


def screw_dislocation(
    x: np.ndarray, y: np.ndarray, strike_deg: float, slip: float, locking_m: float
) -> tuple[np.ndarray, ...]:
    """(east, north, up) of a buried strike-slip fault: u = slip/pi * arctan(dist / locking)."""
    s = math.radians(strike_deg)
    along = np.array([math.sin(s), math.cos(s)])
    dist = x * along[1] - y * along[0]  # signed distance across the fault
    u = slip / math.pi * np.arctan(dist / locking_m)
    return u * along[0], u * along[1], np.zeros_like(u)


def project(u: tuple[np.ndarray, ...]) -> np.ndarray:
    """A displacement (east, north, up) onto the line of sight, positive towards the satellite."""
    th, az = math.radians(INCIDENCE_DEG), math.radians(HEADING_DEG + 90.0)  # the look azimuth
    e = (-math.sin(th) * math.sin(az), -math.sin(th) * math.cos(az), math.cos(th))  # unit (E, N, U)
    return u[0] * e[0] + u[1] * e[1] + u[2] * e[2]


def turbulence(
    rng: np.random.Generator, h: int, w: int, sigma: float, beta: float = 8 / 3
) -> np.ndarray:
    """Power-law (P(k) ~ k^-beta) random screen with std `sigma`."""
    ky = np.fft.fftfreq(h)[:, None]
    kx = np.fft.rfftfreq(w)[None, :]
    k = np.hypot(ky, kx)
    k[0, 0] = np.inf
    f = np.fft.irfft2(np.fft.rfft2(rng.standard_normal((h, w))) * k ** (-beta / 2), s=(h, w))
    return sigma * (f - f.mean()) / (f.std() + 1e-12)


def ramp(rng: np.random.Generator, h: int, w: int, amplitude: float) -> np.ndarray:
    """A plane whose range over the image is `amplitude` (rad), in a random direction."""
    a = rng.uniform(0, 2 * math.pi)
    yy, xx = np.mgrid[0:h, 0:w]
    p = math.cos(a) * xx + math.sin(a) * yy
    return amplitude * (p - p.min()) / max(float(np.ptp(p)), 1e-9) - amplitude / 2


def phase_noise_std(coherence: np.ndarray, looks: int = 4) -> np.ndarray:
    """Cramer-Rao phase std of a multilooked pair, capped at uniform phase's (pi/sqrt 3)."""
    g = np.clip(coherence, 1e-3, 0.999)
    return np.minimum(np.sqrt(1 - g * g) / (g * math.sqrt(2 * looks)), math.pi / math.sqrt(3))


def _deformation(
    kind: str, rng, size: int, fringes: int, wavelength: float, rules: Rules
) -> np.ndarray:
    """LOS deformation (m) scaled so its thresholded box spans `fringes` cycles."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    cx, cy = rng.uniform(0.35, 0.65) * size, rng.uniform(0.35, 0.65) * size
    x, y = (xx - cx) * PIXEL_M, (yy - cy) * PIXEL_M
    if kind == "mogi":
        shape = project(mogi(x, y, depth=rng.uniform(0.08, 0.14) * size * PIXEL_M, dv=1.0))
    else:  # through the centre: both sides clear the threshold (a fault's far field never decays)
        x, y = (xx - size / 2) * PIXEL_M, (yy - size / 2) * PIXEL_M
        strike = rng.uniform(0, 180)
        locking = rng.uniform(0.05, 0.1) * size * PIXEL_M
        shape = project(screw_dislocation(x, y, strike, 1.0, locking))
    # InSAR measures relative displacement: the truth is referenced as the converter does
    shape = shape - np.median(shape)
    shape = shape / np.abs(shape).max()

    def span(amp: float) -> float:  # the fringe-count rule on the noise-free signal
        d = amp * shape
        box = box_of(np.abs(d) > rules.threshold_m, rules.min_pixels)
        if box is None:
            return 0.0
        x0, y0, x1, y1 = (int(v) for v in box)
        return float(np.ptp(los_to_phase(d[y0:y1, x0:x1], wavelength))) / (2 * math.pi)

    lo, hi = 0.0, (fringes + 2) * wavelength  # span(hi) > fringes
    for _ in range(60):  # bisection: the span grows with the amplitude
        amp = 0.5 * (lo + hi)
        lo, hi = (amp, hi) if span(amp) < fringes else (lo, amp)
    return hi * shape


def _patches(rng, size: int, avoid: tuple | None, k: int) -> np.ndarray:
    """Up to k decorrelated elliptical patches, kept clear of the (dilated) deformation box."""
    yy, xx = np.mgrid[0:size, 0:size]
    out = np.zeros((size, size), bool)
    for _ in range(k):
        for _try in range(20):
            cx, cy, r = rng.uniform(0, size), rng.uniform(0, size), rng.uniform(0.06, 0.11) * size
            if avoid is not None:
                x0, y0, x1, y1 = avoid
                if x0 - r - 3 < cx < x1 + r + 3 and y0 - r - 3 < cy < y1 + r + 3:
                    continue
            out |= ((xx - cx) / r) ** 2 + ((yy - cy) / (0.7 * r)) ** 2 < 1
            break
    return out


def synth_pair(
    rng: np.random.Generator,
    i: int,
    size: int,
    wavelength: float,
    rules: Rules,
    with_unwrapped: bool = True,
    heavy_atmosphere: bool = False,
) -> dict:
    """Maps and truth of pair `i`; class cycles low/medium/high, source none/mogi/dislocation."""
    ncls = len(rules.coherence_classes)
    cls = i % ncls
    edges = [0.0, *rules.coherence_thresholds, 1.0]
    level = 0.5 * (edges[cls] + edges[cls + 1])
    kinds = ("mogi", "dislocation", "mogi", "none")
    kind = "none" if cls == 0 else kinds[(i // ncls) % len(kinds)]
    fringes = int(rng.integers(1, 4)) if kind != "none" else 0
    los = np.zeros((size, size))
    if kind != "none":
        los = _deformation(kind, rng, size, fringes, wavelength, rules)
    box = box_of(np.abs(los) > rules.threshold_m, rules.min_pixels) if kind != "none" else None
    atmo_level = int(rng.integers(0, 4))
    sigma = (0.1 + 0.35 * atmo_level) if heavy_atmosphere else (0.05 + 0.07 * atmo_level)
    signal = (
        los_to_phase(los, wavelength)
        + turbulence(rng, size, size, sigma)
        + ramp(rng, size, size, rng.uniform(0.2, 1.0))
    )
    coh = np.clip(level + 0.02 * smooth_field(rng, size, size, size / 8), 0.01, 0.99)
    patch = _patches(rng, size, box, int(rng.integers(1, 3)))
    coh = np.where(patch, rng.uniform(0.01, 0.08, coh.shape), coh)
    noisy = signal + rng.standard_normal(coh.shape) * phase_noise_std(coh)
    wrapped = wrap(np.where(patch, rng.uniform(-math.pi, math.pi, coh.shape), noisy))
    # unwrappers mask decorrelated areas
    unw = np.where(patch, np.nan, signal + 0.05 * rng.standard_normal(coh.shape))
    return {
        "wrapped": wrapped.astype(np.float32),
        "coherence": coh.astype(np.float32),
        "unwrapped": unw.astype(np.float32) if with_unwrapped else None,
        "los_m": los,
        "coherence_class": cls,
        "fringes": fringes,
        "box": box,
        "source": kind,
        "atmosphere_level": atmo_level,
        "answers": _answers(kind, box, atmo_level, bool(patch.any()), rules.coherence_classes[cls]),
    }


def _answers(kind: str, box, atmo_level: int, patch: bool, coherence: str) -> dict[str, str]:
    """The reference answers of the two text tasks, from what the pair was made of."""
    shapes = {"mogi": "a Mogi-type inflation ring", "dislocation": "a linear fault offset"}
    words = [shapes.get(kind, "no deformation")]
    if box is not None:
        words.append(f"centred near x={(box[0] + box[2]) / 2:.0f}, y={(box[1] + box[3]) / 2:.0f}")
    noise = [
        f"{('weak', 'moderate', 'strong', 'very strong')[atmo_level]} turbulent atmosphere",
        "an orbital ramp",
        "one decorrelated patch" if patch else "no decorrelated patch",
        f"{coherence} coherence",
    ]
    return {"deformation_localization": " ".join(words), "noise_assessment": ", ".join(noise)}


# -- the raw tree ------------------------------------------------------------------------------
def make_interferograms(
    root: str | Path,
    n: int = 9,
    size: int = 64,
    seed: int = 0,
    dataset: str | DatasetSpec = "insar",
    layout: str | None = None,
    unwrapped: bool = True,
    annotate: bool = True,
    frames: int = 1,
) -> IfgManifest:
    """Write `n` pairs in the dataset's raw layout under `root`; returns their truth. "insar":
    GeoTIFFs (`unwrapped=False`: no unwrapped_phase.tif, annotations carry the true boxes);
    "hephaestus": PNG renderings and annotations, heavier atmosphere. `frames` > 1 spreads pairs."""
    spec = dataset if isinstance(dataset, DatasetSpec) else load_dataset(dataset)
    layout = layout or sorted(spec.layouts)[0]
    reader = open_reader(spec, layout)
    rules = reader.rules
    wavelength = reader.wavelength_m
    rng = np.random.default_rng(seed)
    m = IfgManifest(spec.id, layout, Path(root), seed, size, wavelength, rules)
    hephaestus = getattr(reader, "rendered", False)
    for i in range(n):
        d = synth_pair(rng, i, size, wavelength, rules, unwrapped and not hephaestus, hephaestus)
        p0 = EPOCH + _dt.timedelta(days=REVISIT_DAYS * i)
        p1 = p0 + _dt.timedelta(days=REVISIT_DAYS * int(rng.integers(1, 4)))
        frame = reader.frame_name(i % frames) if (frames > 1 or hephaestus) else ""
        pair = IfgPair("", frame, p0.isoformat(), p1.isoformat(), **d)
        pair.id, pair.paths = reader.write_pair(
            str(root), pair, annotate=annotate, boxes=not unwrapped, index=i
        )
        m.pairs.append(pair)
    m.pairs.sort(key=lambda p: p.id)
    return m


# -- damage for bad-input tests ----------------------------------------------------------------
def _annotation(m: IfgManifest, p: IfgPair, **fields) -> str:
    path = Path(p.paths["annotation"])
    path.write_text(json.dumps(json.loads(path.read_text()) | fields))
    return p.paths["annotation"]


def _bad_date(m: IfgManifest, p: IfgPair, secondary: str = "20201301") -> str:
    """Rename the pair's folder to an impossible secondary date; returns the new folder."""
    key = "wrapped_phase" if "wrapped_phase" in p.paths else "insar"
    old = os.path.dirname(p.paths[key])
    name = f"{os.path.basename(old).split('_')[0]}_{secondary}"
    new = os.path.join(os.path.dirname(old), name)
    os.rename(old, new)
    if "annotation" in p.paths:
        # GeoTIFF layout: the annotation lies in the pair folder
        if p.paths["annotation"].startswith(old + os.sep):
            p.paths["annotation"] = os.path.join(new, os.path.basename(p.paths["annotation"]))
            _annotation(m, p, pair=name)
        else:
            _annotation(m, p, secondary_date=secondary)
    return new


def _scaled(band: str, fn=lambda a: a, crs: str = "EPSG:32633"):
    """A damage that rewrites one band's GeoTIFF (its transform kept) with its values changed."""

    def damage(m: IfgManifest, p: IfgPair) -> str:
        import rasterio

        a = getattr(p, {"wrapped_phase": "wrapped", "unwrapped_phase": "unwrapped"}.get(band, band))
        with rasterio.open(p.paths[band]) as ds:
            tf = tuple(ds.transform)[:6]
        write_geotiff(p.paths[band], fn(a).astype(np.float32), crs, tf)
        return p.paths[band]

    return damage


def _deleted(band: str):
    """A damage that deletes one band's file; the pair folder is what the error names."""

    def damage(m: IfgManifest, p: IfgPair) -> str:
        Path(p.paths[band]).unlink()
        return str(Path(p.paths[band]).parent)

    return damage


# kind -> (damage(manifest, pair) -> path of the file at fault); layout-specific where named
CORRUPTIONS = {
    "bad_date": _bad_date,  # month 13
    "heph_bad_date": lambda m, p: _bad_date(m, p, "20210230"),  # 30 February
    "phase_range": _scaled("wrapped_phase", lambda a: a * 1.5),
    "phase_degrees": _scaled("wrapped_phase", np.degrees),
    "coherence_range": _scaled("coherence", lambda a: a * 100),
    "missing_coherence": _deleted("coherence"),
    "shape_mismatch": _scaled("unwrapped_phase", lambda a: a[:, :-3]),
    "crs_mismatch": _scaled("coherence", crs="EPSG:32632"),
    "missing_unwrapped": _deleted("unwrapped_phase"),
    "annotation_pair": lambda m, p: _annotation(m, p, pair="19990101_19990113"),
    "annotation_answer": lambda m, p: _annotation(m, p, answers={"weather": "sunny"}),
    "annotation_box": lambda m, p: _annotation(m, p, box=[0, 0, m.size + 10, 5]),
    "heph_missing_pair": lambda m, p: _annotation(m, p, primary_date="19990101"),
    "heph_missing_coherence": _deleted("coherence"),
    "heph_field": lambda m, p: _annotation(m, p, atmospheric_fringes=7),
}


def corrupt_ifg(manifest: IfgManifest, kind: str, index: int = 1) -> str:
    """Damage pair `index` in one way; returns the path a good error message names."""
    if kind not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {kind!r}; known: {', '.join(CORRUPTIONS)}")
    return CORRUPTIONS[kind](manifest, manifest.pairs[index])
