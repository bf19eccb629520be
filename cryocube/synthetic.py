"""Sample datasets, seeded: small raw trees in each published layout written by the layout's own
reader, with pixels a model can learn from; the manifest keeps what was written, so a test compares
a converted cube with it, and `corrupt` damages one file for bad-input tests."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np

from .catalog import CUBE_IGNORE_INDEX, DatasetSpec, Layout, load_dataset
from .convert.base import open_reader
from .convert.splits import draw_val


# -- the manifest --------------------------------------------------------------------------------
@dataclass
class RawItem:
    """One generated image (tile or scene) and its label."""

    split: str  # train/val/test as a reader must report it (val may live in train/ on disk)
    scene: str  # the id a reader must report (file stem; scene name for AI4Arctic)
    image_path: str
    label_path: str  # equals image_path where the chart is inside the image file
    image: np.ndarray  # (C, H, W) exactly as written, source dtype
    label: np.ndarray  # (H, W) int16 class indices, CUBE_IGNORE_INDEX where ignored
    raw_label: np.ndarray  # (H, W) the values in the label file (before label_map)
    crs: str | None = None
    transform: tuple[float, ...] | None = None


@dataclass
class RawManifest:
    dataset: str
    layout: str
    root: Path
    tile_size: int  # the tile size to convert this small data with
    seed: int
    items: list[RawItem] = field(default_factory=list)

    def split(self, name: str) -> list[RawItem]:
        """One split's items, in the cube's sample order (items are sorted by split, then scene)."""
        return [it for it in self.items if it.split == name]

    @property
    def counts(self) -> dict[str, int]:
        """Items per split: tests check that every split got some."""
        return {s: len(self.split(s)) for s in ("train", "val", "test")}


# -- numpy-only structure ------------------------------------------------------------------------
def smooth_field(rng: np.random.Generator, h: int, w: int, scale: float) -> np.ndarray:
    """Gaussian-filtered white noise (sigma = `scale` px, periodic), zero mean, unit std."""
    noise = rng.standard_normal((h, w))
    fy = np.fft.fftfreq(h)[:, None]
    fx = np.fft.rfftfreq(w)[None, :]
    kernel = np.exp(-2 * np.pi**2 * scale**2 * (fy**2 + fx**2))
    f = np.fft.irfft2(np.fft.rfft2(noise) * kernel, s=(h, w))
    return (f - f.mean()) / (f.std() + 1e-12)


def blobs(rng: np.random.Generator, h: int, w: int, frac: float, scale: float) -> np.ndarray:
    """Boolean mask of smooth blobs covering `frac` of the image."""
    f = smooth_field(rng, h, w, scale)
    return f > np.quantile(f, 1.0 - frac)


def _mix(mask: np.ndarray, inside: np.ndarray, outside: np.ndarray) -> np.ndarray:
    return np.where(mask[None], inside, outside)


def _u8(a: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(a), 0, 255).astype(np.uint8)


# -- per-dataset pixel recipes: (rng, h, w) -> (image (C,H,W) source dtype, classes (H,W) int16) ---
def synth_gsdd(rng, h, w):
    """Debris = brownish, textured, bright in SWIR; clean ice = bright visible, dark SWIR."""
    debris = blobs(rng, h, w, rng.uniform(0.12, 0.4), h / 8)
    tex = rng.normal(0, 0.06, (6, h, w)) + 0.04 * smooth_field(rng, h, w, 1.5)
    ice_level = np.array([0.72, 0.70, 0.68, 0.58, 0.10, 0.08])[:, None, None]
    ice = ice_level + 0.03 * smooth_field(rng, h, w, h / 4)
    deb = np.array([0.24, 0.27, 0.31, 0.35, 0.42, 0.36])[:, None, None] + tex
    optical = _mix(debris, deb, ice)
    slope = 0.35 + 0.2 * smooth_field(rng, h, w, h / 5)
    elev = 0.5 + 0.25 * smooth_field(rng, h, w, h / 2)
    velocity = np.where(debris, 0.05, 0.2) + 0.03 * smooth_field(rng, h, w, h / 6)
    other = 0.1 + 0.08 * smooth_field(rng, h, w, h / 3)
    image = np.concatenate([optical, np.stack([slope, elev, velocity, other])])
    return np.clip(image, 0, 1).astype(np.float32), debris.astype(np.int16)


def synth_glid(rng, h, w):
    """Lakes = dark, smooth, blue-green blobs on bright textured mountain terrain (8-bit RGB)."""
    lake = blobs(rng, h, w, rng.uniform(0.1, 0.35), h / 6)
    terrain = (
        np.array([150.0, 142.0, 132.0])[:, None, None]
        + 25 * smooth_field(rng, h, w, 3)
        + rng.normal(0, 12, (3, h, w))
    )
    water = np.array([35.0, 85.0, 110.0])[:, None, None] + rng.normal(0, 4, (3, h, w))
    return _u8(_mix(lake, water, terrain)), lake.astype(np.int16)


def synth_gld(rng, h, w):
    """Ten GLNet layers in their DN ranges; lakes: low NIR/SWIR, cold, incoherent, flat."""
    lake = blobs(rng, h, w, rng.uniform(0.04, 0.2), h / 6)
    g = smooth_field(rng, h, w, 4)
    land_opt = (
        np.array([1800.0, 1700, 1800, 2000, 1700])[:, None, None]
        + 400 * g
        + rng.normal(0, 150, (5, h, w))
    )
    lake_opt = np.array([1500.0, 1300, 900, 400, 200])[:, None, None] + rng.normal(0, 50, (5, h, w))
    optical = np.clip(_mix(lake, lake_opt, land_opt), 1, 13000)
    thermal = np.where(lake, 16500, 19000 + 1500 * g)
    coherence = np.clip(
        np.where(lake, 140 + rng.normal(0, 8, (h, w)), 200 + rng.normal(0, 25, (h, w))), 128, 253
    )
    slope = np.clip(np.where(lake, 1.0, 25 + 12 * smooth_field(rng, h, w, 5)), 0, 88)
    elevation = 4800 + 400 * smooth_field(rng, h, w, h / 2)
    band9 = np.clip(125 + 25 * smooth_field(rng, h, w, 6), 36, 255)
    image = np.concatenate([optical, np.stack([thermal, coherence, slope, elevation, band9])])
    return np.rint(image).astype(np.float32), lake.astype(np.int16)


# SOD class -> (HH, HV) mean backscatter, z-scored like the ready-to-train data
SICD_BACKSCATTER = np.array(
    [(-1.2, -0.9), (-0.6, -1.1), (0.9, -0.2), (0.2, 0.2), (-0.1, 0.7), (0.6, 1.3)]
)


def synth_sicd(rng, h, w):
    """Voronoi chart polygons of SOD classes (HH/HV levels, speckle), NaN strip, ambiguous cell."""
    k = int(rng.integers(6, 10))
    seeds = np.stack([rng.uniform(0, h, k), rng.uniform(0, w, k)], 1)
    yy, xx = np.mgrid[0:h, 0:w]
    d2 = (yy[..., None] - seeds[:, 0]) ** 2 + (xx[..., None] - seeds[:, 1]) ** 2
    cell = np.argmin(d2, axis=-1)
    cls_of_cell = np.concatenate([rng.permutation(6), rng.integers(0, 6, k)])[:k]
    classes = cls_of_cell[cell].astype(np.int16)
    sar = SICD_BACKSCATTER[classes].transpose(2, 0, 1) + rng.normal(0, 0.25, (2, h, w))
    sar += 0.15 * np.stack([smooth_field(rng, h, w, 6), smooth_field(rng, h, w, 6)])
    incidence = np.broadcast_to(np.linspace(-1.6, 1.6, w), (h, w))
    image = np.concatenate([sar, incidence[None]]).astype(np.float32)
    edge = int(rng.integers(3, 9))
    image[:2, :, :edge] = np.nan
    classes[:, :edge] = CUBE_IGNORE_INDEX
    if rng.random() < 0.5:
        classes[cell == k - 1] = CUBE_IGNORE_INDEX  # an ambiguous chart polygon: data, no label
    return image, classes


def synth_caffe(rng, h, w):
    """Glacier between rock walls, calving front, dark ocean, black N/A shadows and corner."""
    yy, xx = np.mgrid[0:h, 0:w]
    front = h * rng.uniform(0.5, 0.65) + h * 0.05 * smooth_field(rng, 1, w, w / 10)[0]
    coast = front + h * 0.12 + h * 0.03 * smooth_field(rng, 1, w, w / 10)[0]
    left = w * rng.uniform(0.2, 0.3) + w * 0.03 * smooth_field(rng, h, 1, h / 10)
    right = w * rng.uniform(0.7, 0.8) + w * 0.03 * smooth_field(rng, h, 1, h / 10)
    on_land = (xx <= left) | (xx >= right)
    classes = np.full((h, w), 3, np.int16)  # ocean and melange
    classes[on_land & (yy < coast[None])] = 1  # rock
    classes[~on_land & (yy < front[None])] = 2  # glacier
    shadow = blobs(rng, h, w, 0.08, 4) & (classes == 1)
    classes[shadow] = 0
    if rng.random() < 0.5:
        classes[xx + yy < min(h, w) * 0.25] = 0  # no-data corner
    level = np.array([0.0, 105.0, 185.0, 25.0])[classes]
    noise = np.choose(
        classes,
        [
            np.zeros((h, w)),
            35 * smooth_field(rng, h, w, 2) + rng.normal(0, 25, (h, w)),
            10 * smooth_field(rng, h, w, 8) + rng.normal(0, 20, (h, w)),
            rng.normal(0, 8, (h, w)),
        ],
    )
    image = np.where(classes == 0, 0, np.clip(level + noise, 1, 255))
    return _u8(image)[None], classes


# -- recipes: sizes, names, georeferencing ---------------------------------------------------------
@dataclass(frozen=True)
class Recipe:
    synth: Callable
    size: int  # tile side, or the scene height for whole-scene datasets
    tile_size: int  # what tests convert with
    name: Callable[[np.random.Generator, int], str]
    aspect: float | None = None  # width / height of whole scenes (of varying size); None: tiles
    crs: str | None = None
    pixel_m: float = 10.0

    @property
    def scenes(self) -> bool:
        """Whole scenes of varying size (3/1/1 per split by default), not tiles (4/2/2)."""
        return self.aspect is not None


TILES_N = {"train": 4, "val": 2, "test": 2}
SCENES_N = {"train": 3, "val": 1, "test": 1}
CAFFE_GLACIERS = ("Crane", "DBE", "JAC", "Mapple", "SI", "COL", "Jorum")
CAFFE_SENSORS = (("ERS", 20), ("ENVISAT", 20), ("RSAT", 12), ("PALSAR", 17), ("TSX", 7), ("S1", 20))


def _caffe_name(rng, i):
    sensor, res = CAFFE_SENSORS[int(rng.integers(len(CAFFE_SENSORS)))]
    day = np.datetime64("1995-01-01") + int(rng.integers(0, 9000))
    # drawn in this order (the names of earlier releases' sample data stay the same)
    scene, seq = int(rng.integers(1, 6)), int(rng.integers(1, 999))
    return f"{CAFFE_GLACIERS[i % len(CAFFE_GLACIERS)]}_{day}_{sensor}_{res}_{scene}_{seq:03d}"


def _sicd_name(rng, i):
    t = np.datetime64("2018-01-01T00:00:00") + int(rng.integers(0, 2 * 365 * 86400))
    return f"{str(t).replace('-', '').replace(':', '')}_{('dmi', 'cis')[i % 2]}"


RECIPES: dict[str, Recipe] = {
    "gsdd": Recipe(synth_gsdd, 64, 64, lambda rng, i: f"gsdd_{i:05d}", crs="EPSG:32645"),
    "glid": Recipe(synth_glid, 64, 64, lambda rng, i: str(i + 1)),
    "gld": Recipe(synth_gld, 60, 60, lambda rng, i: f"glnet_{i:05d}", crs="EPSG:32645"),
    "sicd": Recipe(synth_sicd, 200, 64, _sicd_name, aspect=1.3, crs="EPSG:3413", pixel_m=80.0),
    "caffe": Recipe(synth_caffe, 150, 64, _caffe_name, aspect=1.53),
}


def encode_labels(classes: np.ndarray, layout: Layout) -> np.ndarray:
    """Class indices -> the layout's raw values (ignore -> its first ignore value)."""
    raw = np.zeros(classes.shape, np.uint8)
    for c in np.unique(classes):
        if c == CUBE_IGNORE_INDEX:
            if not layout.ignore_values:
                raise ValueError(f"layout {layout.name!r} has no ignore value for ignored pixels")
            raw[classes == c] = layout.ignore_values[0]
        else:
            raw[classes == c] = min(k for k, v in layout.label_map.items() if v == c)
    return raw


def _scene_plan(rec: Recipe, reader, counts: dict[str, int], rng) -> list[tuple[str, str]]:
    """(split, scene) in generation order, in the layout's naming, val drawn as it draws."""
    plan: list[tuple[str, str]] = []
    for split in ("train", "val", "test"):
        for _ in range(counts.get(split, 0)):
            scene = rec.name(rng, len(plan))
            while scene in {s for _, s in plan}:
                scene = rec.name(rng, len(plan))
            plan.append((split, scene))
    plan = [(sp, reader.example_name(s, i)) for i, (sp, s) in enumerate(plan)]
    if reader.options.get("val_from_train"):
        on_train = [s for sp, s in plan if sp != "test"]
        val = draw_val(on_train, reader.options["val_from_train"], reader.where)
        plan = [(("val" if s in val else "train") if sp != "test" else sp, s) for sp, s in plan]
    return plan


def make_raw(
    dataset: str | DatasetSpec,
    root: str | Path,
    layout: str = "cryobench",
    n: dict[str, int] | None = None,
    size: int | None = None,
    seed: int = 0,
    recipe: str | None = None,
) -> RawManifest:
    """Write a small `dataset` in `layout` under `root`. `n` = items per split (defaults: 4/2/2
    tiles or 3/1/1 scenes; where the layout draws val from train, train+val items are written to
    train/ and the manifest records the reader's draw). `size` = tile side, or scene height for
    whole-scene datasets. `recipe`: the pixel recipe (default: the dataset's id)."""
    spec = dataset if isinstance(dataset, DatasetSpec) else load_dataset(dataset)
    name = recipe or spec.id
    if name not in RECIPES:
        raise ValueError(
            f"no sample-data recipe for dataset {name!r}; known: {', '.join(sorted(RECIPES))}"
        )
    rec = RECIPES[name]
    reader = open_reader(spec, layout)
    lay = spec.layout(layout)
    root = Path(root)
    counts = {**(SCENES_N if rec.scenes else TILES_N), **(n or {})}
    size = int(size or rec.size)
    rng = np.random.default_rng(seed)

    plan = _scene_plan(rec, reader, counts, rng)
    manifest = RawManifest(spec.id, layout, root, rec.tile_size, seed)
    for i, (split, scene) in enumerate(plan):
        h, w = size, size
        if rec.scenes:
            h = size + int(rng.integers(-size // 20, size // 20 + 1))
            w = round(size * rec.aspect) + int(rng.integers(-size // 15, size // 15 + 1))
        image, classes = rec.synth(rng, h, w)
        crs, transform = rec.crs, None
        if crs:
            x0 = 400000.0 + i * (w + 7) * rec.pixel_m
            transform = (rec.pixel_m, 0.0, x0, 0.0, -rec.pixel_m, 3100000.0)
        raw = encode_labels(classes, lay)
        img_path, lbl_path = reader.write(str(root), split, scene, image, raw, crs, transform)
        if not img_path.endswith((".tif", ".tiff")):
            crs = transform = None  # not georeferenced
        it = RawItem(split, scene, img_path, lbl_path, image, classes, raw, crs, transform)
        manifest.items.append(it)
    manifest.items.sort(key=lambda it: (("train", "val", "test").index(it.split), it.scene))
    return manifest


# -- damage for bad-input tests ----------------------------------------------------------------
def _separate_label_item(m: RawManifest) -> RawItem:
    for it in m.items:
        if it.label_path != it.image_path:
            return it
    raise ValueError(f"{m.dataset}/{m.layout}: no item with a separate label file")


def _rewrite(m: RawManifest, it: RawItem, which: str) -> str:
    """Write a damaged copy of an item through its layout's reader; its `which` file's path."""
    reader = open_reader(load_dataset(m.dataset), m.layout)
    reader.write(str(m.root), it.split, it.scene, it.image, it.raw_label, it.crs, it.transform)
    return getattr(it, f"{which}_path")


def _truncate(m, it):
    os.truncate(it.image_path, os.path.getsize(it.image_path) // 2)
    return it.image_path


def _header(m, it):
    with open(it.image_path, "r+b") as f:
        f.write(b"\x00garbage-header\xff" * 8)
    return it.image_path


def _deleted(which: str):
    """A damage that deletes the image or label file of the first item with a separate label."""

    def damage(m, it):
        path = getattr(_separate_label_item(m), f"{which}_path")
        os.remove(path)
        return path

    return damage


def _size_mismatch(m, it):
    it = _separate_label_item(m)
    return _rewrite(m, replace(it, raw_label=it.raw_label[:-3, :-2]), "label")


def _band_count(m, it):
    img = it.image
    fewer = img[:-1] if img.shape[0] > 1 else np.repeat(img, 3, axis=0)
    return _rewrite(m, replace(it, image=fewer), "image")


def _label_value(m, it):
    lay = load_dataset(m.dataset).layout(m.layout)
    raw = it.raw_label.copy()
    raw[1, 1] = min(set(range(256)) - set(lay.label_map) - set(lay.ignore_values))
    return _rewrite(m, replace(it, raw_label=raw), "label")


def _nan(m, it):
    if it.image.dtype.kind != "f":
        raise ValueError(f"{m.dataset} images are {it.image.dtype}: NaN cannot be stored")
    img = it.image.copy()
    img[0, 1, 1] = np.nan
    return _rewrite(m, replace(it, image=img), "image")


CORRUPTIONS: dict[str, Callable[[RawManifest, RawItem], str]] = {
    "truncate": _truncate,  # image file cut to half its bytes
    "header": _header,  # image file's first bytes overwritten
    "missing_mask": _deleted("label"),  # label file deleted (returns its path)
    "missing_image": _deleted("image"),  # image file deleted, label left alone
    "size_mismatch": _size_mismatch,  # label rewritten 3 rows / 2 columns smaller
    "band_count": _band_count,  # image rewritten with one band less (1-band data: 3 bands)
    "label_value": _label_value,  # label pixel (1, 1) set to a value outside label_map/ignore
    "nan": _nan,  # image pixel (band 0, 1, 1) set to NaN (float data only)
}


def corrupt(manifest: RawManifest, kind: str, index: int = 0) -> str:
    """Damage item `index` (kinds needing a label file: the first with one); the path."""
    if kind not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {kind!r}; known: {', '.join(CORRUPTIONS)}")
    return CORRUPTIONS[kind](manifest, manifest.items[index])


# -- sample datasets (image-level tasks) ---------------------------------------------------------
@dataclass
class SampleManifest:
    dataset: str
    root: Path
    ids: list[str]
    images: dict[str, np.ndarray]  # id -> (time, band, y, x) float32 as written (before any offset)
    # task -> (cls|regr, {id: label}) (unlabelled ids left out)
    tasks: dict[str, tuple[str, dict[str, float]]]


def make_samples(
    dataset: str | DatasetSpec,
    root: str | Path,
    n: int = 12,
    size: int = 16,
    seed: int = 0,
    layout: str = "neuco",
) -> SampleManifest:
    """A small multi-temporal sample dataset in its published layout, with learnable image-level
    tasks: `water_fraction__regr` (the share of dark, low-NIR pixels), `cloudy__cls` (a bright B02
    haze in some seasons) and `noise__regr` (random: nothing should predict it); a few labels left
    empty."""
    spec = dataset if isinstance(dataset, DatasetSpec) else load_dataset(dataset)
    reader = open_reader(spec, layout)
    rng = np.random.default_rng(seed)
    T, C = max(1, len(spec.time)), len(spec.bands)
    nir = [i for i, b in enumerate(spec.bands) if b.alias in ("B8", "B8A")]
    blue = [i for i, b in enumerate(spec.bands) if b.alias == "B2"]
    sar = [i for i, b in enumerate(spec.bands) if b.role == "sar"]
    not_sar = [i for i in range(C) if i not in sar]
    ids, images = [], {}
    tasks = {"water_fraction": ("regr", {}), "cloudy": ("cls", {}), "noise": ("regr", {})}
    for k in range(n):
        sid = f"{rng.integers(0, 2**63):016x}{k:04d}"
        water = blobs(rng, size, size, rng.uniform(0.05, 0.6), size / 5)
        img = np.empty((T, C, size, size), np.float32)
        for t in range(T):
            base = 1500 + 400 * smooth_field(rng, size, size, 3)
            img[t] = np.where(water[None], 400.0, base[None]) + rng.normal(0, 60, (C, size, size))
            img[t, nir] = np.where(water, 150.0, 2600.0) + rng.normal(0, 80, (len(nir), size, size))
            img[t, sar] = np.where(water, -22.0, -11.0) + rng.normal(0, 1.5, (len(sar), size, size))
        cloudy = bool(rng.random() < 0.5)
        if cloudy:
            img[rng.integers(0, T), blue] += 3000.0
        img[:, not_sar] = np.clip(img[:, not_sar], 0, 20000)
        ids.append(sid)
        images[sid] = img
        reader.write(root, "all", sid, img)
        if k % 7 != 3:  # a few locations have no label, as in the release
            tasks["water_fraction"][1][sid] = float(water.mean())
        tasks["cloudy"][1][sid] = float(cloudy)
        tasks["noise"][1][sid] = float(rng.random())
    reader.write_labels(
        root, {t: (kind, {i: values.get(i) for i in ids}) for t, (kind, values) in tasks.items()}
    )
    return SampleManifest(spec.id, Path(root), ids, images, tasks)
