"""Small raw datasets in each published layout, for tests and `cryocube quickstart`.

The files are real (GeoTIFF with a CRS through rasterio, PNG through PIL, AI4Arctic netCDF through
netCDF4) and the pixels carry structure a model can learn: glacial lakes are dark smooth blobs,
debris is bright textured ground, sea-ice stages have distinct HH/HV backscatter with speckle,
CaFFe zones are dark ocean / bright glacier / textured rock / black N/A.

`make_raw(dataset, root, layout)` writes one dataset and returns a `RawManifest`: per item the
split, scene, file paths, the image as written and the label as class indices (after the layout's
label_map), so a test can compare a converted cube with what was generated. `corrupt(manifest,
kind)` damages one file for bad-input tests. Everything is numpy-only (no scipy) and seeded.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np

from .catalog import CUBE_IGNORE_INDEX, Layout, load_dataset

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
        return [it for it in self.items if it.split == name]

    def item(self, scene: str) -> RawItem:
        for it in self.items:
            if it.scene == scene:
                return it
        raise KeyError(scene)

    @property
    def counts(self) -> dict[str, int]:
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
    ice = np.array([0.72, 0.70, 0.68, 0.58, 0.10, 0.08])[:, None, None] + 0.03 * smooth_field(rng, h, w, h / 4)
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
    terrain = np.array([150.0, 142.0, 132.0])[:, None, None] + 25 * smooth_field(rng, h, w, 3) + rng.normal(0, 12, (3, h, w))
    water = np.array([35.0, 85.0, 110.0])[:, None, None] + rng.normal(0, 4, (3, h, w))
    return _u8(_mix(lake, water, terrain)), lake.astype(np.int16)


def synth_gld(rng, h, w):
    """Ten GLNet layers in their DN ranges; lakes: low NIR/SWIR, cold, incoherent, flat."""
    lake = blobs(rng, h, w, rng.uniform(0.04, 0.2), h / 6)
    g = smooth_field(rng, h, w, 4)
    land_opt = np.array([1800.0, 1700, 1800, 2000, 1700])[:, None, None] + 400 * g + rng.normal(0, 150, (5, h, w))
    lake_opt = np.array([1500.0, 1300, 900, 400, 200])[:, None, None] + rng.normal(0, 50, (5, h, w))
    optical = np.clip(_mix(lake, lake_opt, land_opt), 1, 13000)
    thermal = np.where(lake, 16500, 19000 + 1500 * g)
    coherence = np.clip(np.where(lake, 140 + rng.normal(0, 8, (h, w)), 200 + rng.normal(0, 25, (h, w))), 128, 253)
    slope = np.clip(np.where(lake, 1.0, 25 + 12 * smooth_field(rng, h, w, 5)), 0, 88)
    elevation = 4800 + 400 * smooth_field(rng, h, w, h / 2)
    band9 = np.clip(125 + 25 * smooth_field(rng, h, w, 6), 36, 255)
    image = np.concatenate([optical, np.stack([thermal, coherence, slope, elevation, band9])])
    return np.rint(image).astype(np.float32), lake.astype(np.int16)


# SOD class -> (HH, HV) mean backscatter, z-scored like the ready-to-train data
SICD_BACKSCATTER = np.array([(-1.2, -0.9), (-0.6, -1.1), (0.9, -0.2), (0.2, 0.2), (-0.1, 0.7), (0.6, 1.3)])


def synth_sicd(rng, h, w):
    """Ice-chart polygons (Voronoi cells) of SOD classes with distinct HH/HV levels and speckle;
    a NaN no-data strip at the swath edge and sometimes an ambiguous polygon (both ignored)."""
    k = int(rng.integers(6, 10))
    seeds = np.stack([rng.uniform(0, h, k), rng.uniform(0, w, k)], 1)
    yy, xx = np.mgrid[0:h, 0:w]
    cell = np.argmin((yy[..., None] - seeds[:, 0]) ** 2 + (xx[..., None] - seeds[:, 1]) ** 2, axis=-1)
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
    """Glacier tongue (bright speckle) between rock walls (textured) ending at a calving front in
    dark ocean; black N/A shadow patches in the rock and sometimes a black no-data corner."""
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
    noise = np.choose(classes, [np.zeros((h, w)), 35 * smooth_field(rng, h, w, 2) + rng.normal(0, 25, (h, w)),
                                10 * smooth_field(rng, h, w, 8) + rng.normal(0, 20, (h, w)), rng.normal(0, 8, (h, w))])
    image = np.where(classes == 0, 0, np.clip(level + noise, 1, 255))
    return _u8(image)[None], classes


# -- recipes: sizes, names, georeferencing ---------------------------------------------------------


@dataclass(frozen=True)
class Recipe:
    synth: Callable
    size: int  # tile side, or the scene height for whole-scene datasets
    tile_size: int  # what tests convert with
    n: dict[str, int]
    name: Callable[[np.random.Generator, int], str]
    scenes: bool = False  # whole scenes of varying size (aspect below), not fixed tiles
    aspect: float = 1.0
    crs: str | None = None
    pixel_m: float = 10.0


TILES_N = {"train": 4, "val": 2, "test": 2}
SCENES_N = {"train": 3, "val": 1, "test": 1}
CAFFE_GLACIERS = ("Crane", "DBE", "JAC", "Mapple", "SI", "COL", "Jorum")
CAFFE_SENSORS = (("ERS", 20), ("ENVISAT", 20), ("RSAT", 12), ("PALSAR", 17), ("TSX", 7), ("S1", 20))


def _caffe_name(rng, i):
    sensor, res = CAFFE_SENSORS[int(rng.integers(len(CAFFE_SENSORS)))]
    day = np.datetime64("1995-01-01") + int(rng.integers(0, 9000))
    return f"{CAFFE_GLACIERS[i % len(CAFFE_GLACIERS)]}_{day}_{sensor}_{res}_{int(rng.integers(1, 6))}_{int(rng.integers(1, 999)):03d}"


def _sicd_name(rng, i):
    t = np.datetime64("2018-01-01T00:00:00") + int(rng.integers(0, 2 * 365 * 86400))
    return f"{str(t).replace('-', '').replace(':', '')}_{('dmi', 'cis')[i % 2]}"


RECIPES: dict[str, Recipe] = {
    "gsdd": Recipe(synth_gsdd, 64, 64, TILES_N, lambda rng, i: f"gsdd_{i:05d}", crs="EPSG:32645"),
    "glid": Recipe(synth_glid, 64, 64, TILES_N, lambda rng, i: str(i + 1)),
    "gld": Recipe(synth_gld, 60, 60, TILES_N, lambda rng, i: f"glnet_{i:05d}", crs="EPSG:32645"),
    "sicd": Recipe(synth_sicd, 200, 64, SCENES_N, _sicd_name, scenes=True, aspect=1.3, crs="EPSG:3413", pixel_m=80.0),
    "caffe": Recipe(synth_caffe, 150, 64, SCENES_N, _caffe_name, scenes=True, aspect=1.53),
}


# -- file writers ----------------------------------------------------------------------------------


def write_geotiff(path: str | Path, arr: np.ndarray, crs: str | None = None, transform: tuple | None = None) -> None:
    import rasterio
    from rasterio.transform import Affine

    arr = arr[None] if arr.ndim == 2 else arr
    profile = dict(driver="GTiff", count=arr.shape[0], height=arr.shape[1], width=arr.shape[2], dtype=arr.dtype.name)
    if crs is not None:
        profile.update(crs=crs, transform=Affine(*transform))
    with rasterio.open(path, "w", **profile) as ds:
        ds.write(arr)


def write_png(path: str | Path, arr: np.ndarray, crs=None, transform=None) -> None:
    from PIL import Image

    arr = arr[None] if arr.ndim == 2 else arr
    if arr.shape[0] not in (1, 2, 3, 4):
        raise ValueError(f"{path}: a PNG holds 1-4 bands, not {arr.shape[0]}")
    data = arr[0] if arr.shape[0] == 1 else np.moveaxis(arr, 0, -1)  # L, LA, RGB, RGBA
    Image.fromarray(np.ascontiguousarray(data.astype(np.uint8))).save(path)


FILE_WRITERS: dict[str, Callable] = {".tif": write_geotiff, ".png": write_png}

AI4ARCTIC_VARIABLES = ("nersc_sar_primary", "nersc_sar_secondary", "sar_incidenceangle")


def write_ai4arctic(path: str | Path, scene: str, image: np.ndarray | None, charts: dict[str, np.ndarray] | None) -> None:
    """A ready-to-train AI4Arctic netCDF: SAR on (sar_lines, sar_samples), charts uint8 with
    chart_fill_value 255, an AMSR2 variable on the 2 km grid, and the global attributes."""
    import netCDF4

    shape = (image if image is not None else next(iter(charts.values()))).shape[-2:]
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.createDimension("sar_lines", shape[0])
        ds.createDimension("sar_samples", shape[1])
        ds.scene_id = f"S1B_EW_GRDM_1SDH_{scene.split('_')[0]}_synthetic"
        ds.original_id = ds.scene_id
        ds.ice_service = scene.rsplit("_", 1)[-1]
        ds.flip = 0
        ds.pixel_spacing = 80
        if image is not None:
            for name, band in zip(AI4ARCTIC_VARIABLES, image):
                v = ds.createVariable(name, "f4", ("sar_lines", "sar_samples"), fill_value=np.float32(np.nan), zlib=True,
                                      chunksizes=(min(64, shape[0]), min(64, shape[1])))
                v[:] = band
            ds.createDimension("2km_grid_lines", math.ceil(shape[0] / 25))
            ds.createDimension("2km_grid_samples", math.ceil(shape[1] / 25))
            amsr = ds.createVariable("btemp_6_9h", "f4", ("2km_grid_lines", "2km_grid_samples"))
            amsr[:] = np.zeros((math.ceil(shape[0] / 25), math.ceil(shape[1] / 25)), np.float32)
        for name, chart in (charts or {}).items():
            v = ds.createVariable(name, "u1", ("sar_lines", "sar_samples"), zlib=True)
            v.chart_fill_value = 255
            v.set_auto_maskandscale(False)
            v[:] = chart


def ai4arctic_charts(sod: np.ndarray) -> dict[str, np.ndarray]:
    """SOD plus SIC and FLOE derived from it (open water 0, ice 100 % / medium floes)."""
    fill = sod == 255
    sic = np.where(fill, 255, np.where(sod == 0, 0, 10)).astype(np.uint8)
    floe = np.where(fill, 255, np.where(sod == 0, 0, 3)).astype(np.uint8)
    return {"SOD": sod.astype(np.uint8), "SIC": sic, "FLOE": floe}


# -- layouts: where files go and how they are written ------------------------------------------


def _val_rule(dataset: str, layout: str) -> Callable[[list[str], dict], set[str]]:
    """The reader's own rule for drawing val from train (imported lazily: readers import rasterio)."""
    if dataset == "caffe":
        from .convert.caffe import shuffle_split_val

        return lambda names, o: shuffle_split_val(names, float(o.get("val_fraction", 0.1)), int(o.get("val_seed", 1)))
    from .convert.sicd import draw_val_scenes

    return lambda names, o: draw_val_scenes(names, int(o.get("val_scenes", 10)), int(o.get("val_seed", 0)))


@dataclass(frozen=True)
class FolderLayout:
    """Image and label rasters in parallel folders (`{folder}` = the split's folder on disk)."""

    image_dir: str
    label_dir: str
    ext: str
    folders: dict[str, str] = field(default_factory=lambda: {"train": "train", "val": "val", "test": "test"})
    label_suffix: str = ""
    val_from_train: bool = False  # val lives in the train folder, drawn by the reader's rule

    def paths(self, root: Path, split: str, scene: str) -> tuple[str, str]:
        folder = self.folders[split]
        img = root / self.image_dir.format(folder=folder) / f"{scene}{self.ext}"
        lbl = root / self.label_dir.format(folder=folder) / f"{scene}{self.label_suffix}{self.ext}"
        return str(img), str(lbl)

    def write_image(self, item: RawItem, image: np.ndarray) -> None:
        os.makedirs(os.path.dirname(item.image_path), exist_ok=True)
        FILE_WRITERS[self.ext](item.image_path, image, item.crs, item.transform)

    def write_label(self, item: RawItem, raw: np.ndarray) -> None:
        os.makedirs(os.path.dirname(item.label_path), exist_ok=True)
        FILE_WRITERS[self.ext](item.label_path, raw.astype(np.uint8), item.crs, item.transform)


@dataclass(frozen=True)
class AI4ArcticLayout:
    """`train/<scene>_prep.nc` with charts inside; `test/<scene>_prep.nc` + `_prep_reference.nc`."""

    folders: dict[str, str] = field(default_factory=lambda: {"train": "train", "val": "train", "test": "test"})
    val_from_train: bool = True
    ext: str = ".nc"

    def paths(self, root: Path, split: str, scene: str) -> tuple[str, str]:
        folder = root / self.folders[split]
        img = folder / f"{scene}_prep.nc"
        return str(img), str(folder / f"{scene}_prep_reference.nc") if split == "test" else str(img)

    def write_image(self, item: RawItem, image: np.ndarray) -> None:
        os.makedirs(os.path.dirname(item.image_path), exist_ok=True)
        inside = ai4arctic_charts(item.raw_label) if item.label_path == item.image_path else None
        write_ai4arctic(item.image_path, item.scene, image, inside)

    def write_label(self, item: RawItem, raw: np.ndarray) -> None:
        if item.label_path == item.image_path:
            write_ai4arctic(item.image_path, item.scene, item.image, ai4arctic_charts(raw))
        else:
            write_ai4arctic(item.label_path, item.scene, None, ai4arctic_charts(raw))


LAYOUTS: dict[tuple[str, str], object] = {
    ("gsdd", "cryobench"): FolderLayout("{folder}/image", "{folder}/mask", ".tif"),
    ("gld", "cryobench"): FolderLayout("{folder}/image", "{folder}/mask", ".tif"),
    ("glid", "cryobench"): FolderLayout("{folder}/images", "{folder}/masks", ".png"),
    # the Zenodo release names its training folder GLID (the reader also accepts train)
    ("glid", "original"): FolderLayout("{folder}/images", "{folder}/labels", ".png",
                                       folders={"train": "GLID", "val": "val", "test": "test"}),
    ("sicd", "cryobench"): FolderLayout("{folder}/images", "{folder}/masks", ".tif"),
    ("sicd", "original"): AI4ArcticLayout(),
    ("caffe", "cryobench"): FolderLayout("images/{folder}", "labels/{folder}", ".png"),
    ("caffe", "original"): FolderLayout("sar_images/{folder}", "zones/{folder}", ".png", label_suffix="_zones",
                                        folders={"train": "train", "val": "train", "test": "test"}, val_from_train=True),
}


def encode_labels(classes: np.ndarray, layout: Layout) -> np.ndarray:
    """Class indices -> the raw values the layout stores (inverse of label_map; ignore -> the
    layout's first ignore value)."""
    raw = np.zeros(classes.shape, np.uint8)
    for c in np.unique(classes):
        if c == CUBE_IGNORE_INDEX:
            if not layout.ignore_values:
                raise ValueError(f"layout {layout.name!r} has no ignore value for ignored pixels")
            raw[classes == c] = layout.ignore_values[0]
        else:
            raw[classes == c] = min(k for k, v in layout.label_map.items() if v == c)
    return raw


# -- generators ---------------------------------------------------------------------------------------


def _generate(dataset: str, root: str | Path, layout: str, n: dict[str, int] | None, size: int | None, seed: int) -> RawManifest:
    if (dataset, layout) not in LAYOUTS:
        known = sorted(f"{d}/{l}" for d, l in LAYOUTS)
        raise ValueError(f"no generator for {dataset}/{layout}; known: {', '.join(known)}")
    recipe, where = RECIPES[dataset], LAYOUTS[(dataset, layout)]
    spec = load_dataset(dataset)
    lay = spec.layout(layout)
    root = Path(root)
    counts = {**recipe.n, **(n or {})}
    size = int(size or recipe.size)
    rng = np.random.default_rng(seed)

    plan: list[tuple[str, str]] = []  # (split, scene) in generation order, names unique
    for split in ("train", "val", "test"):
        for _ in range(counts.get(split, 0)):
            name = recipe.name(rng, len(plan))
            while name in {s for _, s in plan}:
                name = recipe.name(rng, len(plan))
            plan.append((split, name))
    if where.val_from_train:  # val is whatever the reader's rule draws from the train folder
        on_train = [s for sp, s in plan if sp != "test"]
        val = _val_rule(dataset, layout)(on_train, lay.options)
        plan = [(("val" if s in val else "train") if sp != "test" else sp, s) for sp, s in plan]

    manifest = RawManifest(dataset, layout, root, recipe.tile_size, seed)
    for i, (split, scene) in enumerate(plan):
        h, w = size, size
        if recipe.scenes:
            h = size + int(rng.integers(-size // 20, size // 20 + 1))
            w = round(size * recipe.aspect) + int(rng.integers(-size // 15, size // 15 + 1))
        image, classes = recipe.synth(rng, h, w)
        crs = transform = None
        if recipe.crs and where.ext == ".tif":
            crs = recipe.crs
            transform = (recipe.pixel_m, 0.0, 400000.0 + i * (w + 7) * recipe.pixel_m, 0.0, -recipe.pixel_m, 3100000.0)
        img_path, lbl_path = where.paths(root, split, scene)
        item = RawItem(split, scene, img_path, lbl_path, image, classes, encode_labels(classes, lay), crs, transform)
        where.write_image(item, image)
        if lbl_path != img_path:
            where.write_label(item, item.raw_label)
        manifest.items.append(item)
    manifest.items.sort(key=lambda it: (("train", "val", "test").index(it.split), it.scene))
    return manifest


def make_gsdd(root, layout="cryobench", n=None, size=None, seed=0) -> RawManifest:
    """GSDD tiles: 10-band float32 GeoTIFF (EPSG:32645, 10 m), masks 0/1."""
    return _generate("gsdd", root, layout, n, size, seed)


def make_glid(root, layout="cryobench", n=None, size=None, seed=0) -> RawManifest:
    """GLID tiles: RGB PNG; masks 0/1 (cryobench) or 0/255 under GLID/val/test (original)."""
    return _generate("glid", root, layout, n, size, seed)


def make_gld(root, layout="cryobench", n=None, size=None, seed=0) -> RawManifest:
    """GLD tiles: 10-band float32 GeoTIFF in the GLNet DN ranges, masks 0/1."""
    return _generate("gld", root, layout, n, size, seed)


def make_sicd(root, layout="cryobench", n=None, size=None, seed=0) -> RawManifest:
    """SICD scenes: 3-band float32 GeoTIFF (cryobench) or ready-to-train netCDF (original);
    SOD 0..5 with 255 on a NaN swath edge. `size` is the scene height (width ~1.3x)."""
    return _generate("sicd", root, layout, n, size, seed)


def make_caffe(root, layout="cryobench", n=None, size=None, seed=0) -> RawManifest:
    """CaFFe scenes: 8-bit grey PNG; zones 0..3 (cryobench) or 0/64/127/254 `_zones` (original).
    `size` is the scene height (width ~1.5x)."""
    return _generate("caffe", root, layout, n, size, seed)


GENERATORS: dict[str, Callable[..., RawManifest]] = {
    "gsdd": make_gsdd, "glid": make_glid, "gld": make_gld, "sicd": make_sicd, "caffe": make_caffe,
}


def make_raw(dataset: str, root: str | Path, layout: str = "cryobench", n: dict[str, int] | None = None,
             size: int | None = None, seed: int = 0) -> RawManifest:
    """Write a small `dataset` in `layout` under `root`. `n` = items per split (defaults: 4/2/2
    tiles or 3/1/1 scenes; where val is drawn from train by the reader, train+val scenes are
    written to train/ and the manifest records the reader's draw). `size` = tile side, or scene
    height for SICD/CaFFe."""
    if dataset not in GENERATORS:
        raise ValueError(f"no generator for dataset {dataset!r}; known: {', '.join(sorted(GENERATORS))}")
    return GENERATORS[dataset](root, layout, n, size, seed)


# -- damage for bad-input tests ----------------------------------------------------------------------


def _separate_label_item(m: RawManifest) -> RawItem:
    for it in m.items:
        if it.label_path != it.image_path:
            return it
    raise ValueError(f"{m.dataset}/{m.layout}: no item with a separate label file")


def _truncate(m, it):
    size = os.path.getsize(it.image_path)
    with open(it.image_path, "r+b") as f:
        f.truncate(size // 2)
    return it.image_path


def _header(m, it):
    with open(it.image_path, "r+b") as f:
        f.write(b"\x00garbage-header\xff" * 8)
    return it.image_path


def _missing_mask(m, it):
    it = _separate_label_item(m)
    os.remove(it.label_path)
    return it.label_path


def _missing_image(m, it):
    it = _separate_label_item(m)
    os.remove(it.image_path)
    return it.image_path


def _size_mismatch(m, it):
    it = _separate_label_item(m)
    LAYOUTS[(m.dataset, m.layout)].write_label(it, it.raw_label[:-3, :-2])
    return it.label_path


def _band_count(m, it):
    img = it.image
    wrong = img[:-1] if img.shape[0] > 1 else np.repeat(img, 3, axis=0)
    LAYOUTS[(m.dataset, m.layout)].write_image(it, wrong)
    return it.image_path


def _label_value(m, it):
    lay = load_dataset(m.dataset).layout(m.layout)
    bad = min(set(range(256)) - set(lay.label_map) - set(lay.ignore_values))
    raw = it.raw_label.copy()
    raw[1, 1] = bad
    LAYOUTS[(m.dataset, m.layout)].write_label(it, raw)
    return it.label_path


def _nan(m, it):
    if it.image.dtype.kind != "f":
        raise ValueError(f"{m.dataset} images are {it.image.dtype}: NaN cannot be stored")
    img = it.image.copy()
    img[0, 1, 1] = np.nan
    LAYOUTS[(m.dataset, m.layout)].write_image(replace(it, image=img), img)
    return it.image_path


CORRUPTIONS: dict[str, Callable[[RawManifest, RawItem], str]] = {
    "truncate": _truncate,  # image file cut to half its bytes
    "header": _header,  # image file's first bytes overwritten
    "missing_mask": _missing_mask,  # label file deleted (returns its path)
    "missing_image": _missing_image,  # image file deleted, label left alone
    "size_mismatch": _size_mismatch,  # label rewritten 3 rows / 2 columns smaller
    "band_count": _band_count,  # image rewritten with one band less (1-band data: 3 bands)
    "label_value": _label_value,  # label pixel (1, 1) set to a value outside label_map/ignore
    "nan": _nan,  # image pixel (band 0, 1, 1) set to NaN (float data only)
}


def corrupt(manifest: RawManifest, kind: str, index: int = 0) -> str:
    """Damage item `index` (or the first item with a separate label file, for kinds that need
    one) and return the path of the damaged (or deleted) file."""
    if kind not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {kind!r}; known: {', '.join(CORRUPTIONS)}")
    return CORRUPTIONS[kind](manifest, manifest.items[index])
