"""SICD (AI4Arctic sea-ice stage of development): whole Sentinel-1 EW scenes. Two layouts.

- cryobench: `<root>/{train,val,test}/images/*.tif` (3 bands float32: HH, HV, incidence angle,
  NaN possible) + `<root>/{split}/masks/<same name>.tif` (SOD 0..5, 255 = ignore).
- original (AI4Arctic ready-to-train netCDF, 80 m): `<root>/train/<scene>_prep.nc` with the charts
  inside, `<root>/test/<scene>_prep.nc` with the charts in `<scene>_prep_reference.nc` (or in the
  same file). Image variables on (sar_lines, sar_samples); chart `SOD` uint8, fill 255. The release
  has train/test only; val is drawn from train like the AutoICE starter kit (10 scenes,
  `np.random.seed(0)`; `draw_val_scenes`), over the sorted scene names.

netCDF/HDF5 is not thread-safe, so every netCDF access in this process goes through one lock.
"""
from __future__ import annotations

import posixpath
import threading
from contextlib import contextmanager

import numpy as np

from .base import ConvertError, Mapper, Reader, SourceItem, Window, register
from .rawio import (PairedRasterReader, check_window, header_threads, is_remote, join, map_threads, order_items, url_fs,
                    val_from_train)

# catalog band name -> ready-to-train variable (the catalog's band order is the cube's)
NC_VARIABLES = {"HH": "nersc_sar_primary", "HV": "nersc_sar_secondary", "incidence_angle": "sar_incidenceangle"}
NC_DIMS = ("sar_lines", "sar_samples")
CHART = "SOD"
PREP_SUFFIX = "_prep"
REFERENCE_SUFFIX = "_reference"
_NC_LOCK = threading.RLock()


def draw_val_scenes(names: list[str], max_scenes: int = 10, seed: int = 0) -> set[str]:
    """The train scenes that become val: RandomState(seed).choice over the sorted names, without
    replacement, of min(max_scenes, max(1, n // 5)) scenes (10 on the real 512-scene train set;
    the n // 5 cap keeps most of a tiny test set for training)."""
    names = sorted(names)
    n = len(names)
    k = min(max_scenes, max(1, n // 5)) if n >= 2 else 0
    if k == 0:
        return set()
    return {str(s) for s in np.random.RandomState(seed).choice(np.array(names), size=k, replace=False)}


@register
class SICDCryoBench(PairedRasterReader):
    dataset = "sicd"
    layout = "cryobench"
    image_dir = "{folder}/images"
    label_dir = "{folder}/masks"


@contextmanager
def open_nc(reader: Reader, url: str):
    """A netCDF4.Dataset of a local path, or of a remote file's bytes; holds the netCDF lock."""
    import netCDF4

    with _NC_LOCK:
        try:
            if is_remote(url):
                ds = netCDF4.Dataset("inmemory.nc", memory=reader.open_bytes(url))
            else:
                ds = netCDF4.Dataset(url.removeprefix("file://"))
        except ConvertError:
            raise
        except FileNotFoundError:
            raise ConvertError(f"{url}: file not found") from None
        except Exception as e:  # OSError/RuntimeError from HDF5 for a bad or truncated file
            raise ConvertError(f"{url}: cannot open as netCDF ({type(e).__name__}: {e}); the file is corrupt or truncated") from None
        try:
            yield ds
        finally:
            ds.close()


def _shape(ds, url: str, name: str) -> tuple[int, int]:
    if name not in ds.variables:
        raise ConvertError(f"{url}: no variable {name!r} (variables: {', '.join(sorted(ds.variables))})")
    var = ds.variables[name]
    if var.ndim != 2:
        raise ConvertError(f"{url}: variable {name!r} has dims {var.dimensions}, expected {NC_DIMS}")
    return tuple(int(v) for v in var.shape)


def _read_image_var(ds, name: str, win: Window) -> np.ndarray:
    r0, r1, c0, c1 = win
    a = ds.variables[name][r0:r1, c0:c1]  # auto-masking: _FillValue/missing_value -> masked
    if np.ma.isMaskedArray(a):
        a = a.astype(a.dtype if a.dtype.kind == "f" else np.float32).filled(np.nan) if a.mask.any() else a.data
    return np.asarray(a)


def _read_chart(ds, win: Window) -> np.ndarray:
    r0, r1, c0, c1 = win
    var = ds.variables[CHART]
    var.set_auto_maskandscale(False)  # raw codes: 255 is the chart fill, kept as a value
    return np.asarray(var[r0:r1, c0:c1])


@register
class SICDOriginal(Reader):
    dataset = "sicd"
    layout = "original"
    splits_on_disk = ("train", "test")

    @classmethod
    def detect(cls, root: str, storage_options: dict | None = None) -> bool:
        fs, path = url_fs(root, storage_options)
        return any(fs.glob(posixpath.join(path.rstrip("/"), s, "*.nc")) for s in cls.splits_on_disk)

    @property
    def variables(self) -> list[str]:
        missing = [b for b in self.spec.band_names if b not in NC_VARIABLES]
        if missing:
            raise ConvertError(f"{self.spec.path}: bands {missing} have no AI4Arctic variable (known: {NC_VARIABLES})")
        return [NC_VARIABLES[b] for b in self.spec.band_names]

    def scan(self, root: str, map_headers: Mapper | None = None) -> list[SourceItem]:
        jobs = []
        for split in self.splits_on_disk:
            folder = join(root, split)
            scenes, refs = {}, {}
            for stem, url in self.listdir(folder, (".nc",)).items():
                if stem.endswith(REFERENCE_SUFFIX):
                    refs[stem.removesuffix(REFERENCE_SUFFIX).removesuffix(PREP_SUFFIX)] = url
                else:
                    scenes[stem.removesuffix(PREP_SUFFIX)] = url
            lonely = sorted(set(refs) - set(scenes))
            if lonely:
                raise ConvertError(f"{folder}: charts without a scene file: " + ", ".join(refs[s] for s in lonely[:10]))
            jobs += [(split, s, scenes[s], refs.get(s)) for s in sorted(scenes)]
        items = (map_headers or map_threads)(self._scene_item, jobs, header_threads(root))
        if not items:
            raise ConvertError(f"{root}: no AI4Arctic scenes (expected train/*_prep.nc and test/*_prep.nc)")
        opts = self.spec.layout(self.layout).options
        train = [it.scene for it in items if it.split == "train"]
        val = draw_val_scenes(train, int(opts.get("val_scenes", 10)), int(opts.get("val_seed", 0)))
        return order_items(val_from_train(items, val))

    def _scene_item(self, job: tuple[str, str, str, str | None]) -> SourceItem:
        return self._item(*job)

    def _item(self, split: str, scene: str, url: str, ref: str | None) -> SourceItem:
        with open_nc(self, url) as ds:
            shapes = {v: _shape(ds, url, v) for v in self.variables}
            has_chart = CHART in ds.variables
            if has_chart and ref is None:
                shapes[CHART] = _shape(ds, url, CHART)
        if len(set(shapes.values())) > 1:
            raise ConvertError(f"{url}: variables differ in size: {shapes}")
        h, w = shapes[self.variables[0]]
        label = url
        if ref is not None:
            with open_nc(self, ref) as ds:
                hl, wl = _shape(ds, ref, CHART)
            if (hl, wl) != (h, w):
                raise ConvertError(f"{url} is {h}x{w} but its chart {ref} is {hl}x{wl}")
            label = ref
        elif not has_chart:
            raise ConvertError(f"{url}: no {CHART} chart in the file and no {scene}{PREP_SUFFIX}{REFERENCE_SUFFIX}.nc next to it")
        return SourceItem(split, scene, url, label, h, w, len(self.variables))

    def read(self, item: SourceItem, window: Window | None = None) -> tuple[np.ndarray, np.ndarray]:
        win = check_window(item.image, window, item.height, item.width)
        with open_nc(self, item.image) as ds:
            image = self._guard(item.image, lambda: np.stack([_read_image_var(ds, v, win) for v in self.variables]))
            if item.label == item.image:
                label = self._guard(item.label, lambda: _read_chart(ds, win))
        if item.label != item.image:
            with open_nc(self, item.label) as ds:
                label = self._guard(item.label, lambda: _read_chart(ds, win))
        return image, label

    @staticmethod
    def _guard(url: str, fn):
        try:
            return fn()
        except ConvertError:
            raise
        except Exception as e:  # HDF5 errors on truncated data chunks
            raise ConvertError(f"{url}: cannot read the pixels ({type(e).__name__}: {e}); the file is corrupt or truncated") from None
