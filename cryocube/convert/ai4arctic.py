"""The AI4Arctic ready-to-train netCDF layout (SICD original): whole Sentinel-1 EW scenes with
charts, `train|test/<scene>_prep.nc` (test charts in `<scene>_prep_reference.nc`); which variable is
which band, the dims and the chart come from the catalog. netCDF/HDF5 is not thread-safe, so every
netCDF access in this process holds one lock."""

from __future__ import annotations

import math
import os
import threading
from contextlib import contextmanager, nullcontext

import numpy as np

from ..store import is_remote, join
from .base import ConvertError, Mapper, Option, Reader, SourceItem, Window, register
from .rawio import check_window, checked_read, header_threads, map_threads
from .writer import TileReader

PREP_SUFFIX = "_prep"
REFERENCE_SUFFIX = "_reference"
_NC_LOCK = threading.RLock()


@contextmanager
def open_nc(reader: Reader, url: str):
    """A netCDF4.Dataset of a local path, or of a remote file's bytes; holds the netCDF lock."""
    import netCDF4

    def load():
        if is_remote(url):
            return netCDF4.Dataset("inmemory.nc", memory=reader.open_bytes(url))
        return netCDF4.Dataset(url.removeprefix("file://"))

    # HDF5 raises OSError or RuntimeError for a bad or truncated file
    with _NC_LOCK, checked_read(url, "netCDF file", load) as ds:
        yield ds


def _shape(ds, url: str, name: str, dims: tuple[str, str]) -> tuple[int, int]:
    if name not in ds.variables:
        raise ConvertError(
            f"{url}: no variable {name!r} (variables: {', '.join(sorted(ds.variables))})"
        )
    var = ds.variables[name]
    if var.ndim != 2:
        raise ConvertError(f"{url}: variable {name!r} has dims {var.dimensions}, expected {dims}")
    return tuple(int(v) for v in var.shape)


def _read_image_var(ds, name: str, win: Window) -> np.ndarray:
    r0, r1, c0, c1 = win
    a = ds.variables[name][r0:r1, c0:c1]  # auto-masking: _FillValue/missing_value -> masked
    if np.ma.isMaskedArray(a) and a.mask.any():
        a = a.astype(a.dtype if a.dtype.kind == "f" else np.float32).filled(np.nan)
    return np.asarray(a)  # an unmasked MaskedArray as its data


def _read_chart(ds, chart: str, win: Window) -> np.ndarray:
    r0, r1, c0, c1 = win
    var = ds.variables[chart]
    var.set_auto_maskandscale(False)  # raw codes: 255 is the chart fill, kept as a value
    return np.asarray(var[r0:r1, c0:c1])


@register
class AI4ArcticReader(TileReader):
    name = "ai4arctic_netcdf"
    options_doc = "variables (band name -> netCDF variable), dims, chart, val_from_train"
    splits_on_disk = ("train", "test")

    def detect(self, root: str) -> bool:
        """Any `.nc` under `train/` or `test/`: the release has only these two split folders."""
        return any(self.glob(root, f"{s}/*.nc") for s in self.splits_on_disk)

    @property
    def variables(self) -> list[str]:
        """The netCDF variable of each catalog band, in cube band order; none missing."""
        table = self.option("variables", kind=dict)
        missing = [b for b in self.spec.band_names if b not in table]
        if missing:
            raise ConvertError(
                f"{self.where}: bands {missing} have no netCDF variable in its variables table"
                f" {table}"
            )
        return [str(table[b]) for b in self.spec.band_names]

    # the netCDF variable holding the label chart (SOD for SICD)
    chart = Option("chart", kind=str)
    # the (lines, samples) dimension names
    dims = Option("dims", ["sar_lines", "sar_samples"], list, tuple)

    def scan(self, root: str, map_headers: Mapper | None = None) -> list[SourceItem]:
        """Each `<scene>_prep.nc` with its `_prep_reference.nc` chart if any; val drawn."""
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
                raise ConvertError(
                    f"{folder}: charts without a scene file: "
                    + ", ".join(refs[s] for s in lonely[:10])
                )
            jobs += [(split, s, scenes[s], refs.get(s)) for s in sorted(scenes)]
        items = (map_headers or map_threads)(self._item, jobs, header_threads(root))
        if not items:
            raise ConvertError(
                f"{root}: no AI4Arctic scenes (expected train/*_prep.nc and test/*_prep.nc)"
            )
        return self.drawn(items)

    def _item(self, job: tuple[str, str, str, str | None]) -> SourceItem:
        split, scene, url, ref = job
        with open_nc(self, url) as ds:
            shapes = {v: _shape(ds, url, v, self.dims) for v in self.variables}
            has_chart = self.chart in ds.variables
            if has_chart and ref is None:
                shapes[self.chart] = _shape(ds, url, self.chart, self.dims)
        if len(set(shapes.values())) > 1:
            raise ConvertError(f"{url}: variables differ in size: {shapes}")
        h, w = shapes[self.variables[0]]
        label = url
        if ref is not None:
            with open_nc(self, ref) as ds:
                hl, wl = _shape(ds, ref, self.chart, self.dims)
            if (hl, wl) != (h, w):
                raise ConvertError(f"{url} is {h}x{w} but its chart {ref} is {hl}x{wl}")
            label = ref
        elif not has_chart:
            raise ConvertError(
                f"{url}: no {self.chart} chart in the file and no"
                f" {scene}{PREP_SUFFIX}{REFERENCE_SUFFIX}.nc next to it"
            )
        return SourceItem(split, scene, url, label, h, w, len(self.variables))

    def read(self, item: SourceItem, window: Window | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Masked pixels as NaN, the chart's raw codes (255 fill included), under the lock."""
        win = check_window(item.image, window, item.height, item.width)
        with open_nc(self, item.image) as ds:
            image = checked_read(
                item.image,
                "pixels",
                lambda: np.stack([_read_image_var(ds, v, win) for v in self.variables]),
            )
            with nullcontext(ds) if item.label == item.image else open_nc(self, item.label) as dl:
                label = checked_read(item.label, "pixels", lambda: _read_chart(dl, self.chart, win))
        return image, label

    # -- sample data ---------------------------------------------------------------------------
    def write(self, root, split, scene, image, raw_label, crs=None, transform=None):
        """Sample data: the release's netCDF files, so a generated tree pairs like a download
        (test charts lie beside their scene)."""
        folder = join(str(root), self.disk_split(split))
        img = join(folder, f"{scene}{PREP_SUFFIX}.nc")
        lbl = join(folder, f"{scene}{PREP_SUFFIX}{REFERENCE_SUFFIX}.nc") if split == "test" else img
        os.makedirs(os.path.dirname(img), exist_ok=True)
        charts, images = chart_set(self.chart, raw_label), dict(zip(self.variables, image))
        write_netcdf(img, scene, images, charts if lbl == img else None, self.dims)
        if lbl != img:
            write_netcdf(lbl, scene, None, charts, self.dims)
        return img, lbl


def chart_set(chart: str, codes: np.ndarray) -> dict[str, np.ndarray]:
    """The chart with SIC and FLOE derived from it, as the release has them."""
    fill = codes == 255
    sic = np.where(fill, 255, np.where(codes == 0, 0, 10)).astype(np.uint8)
    floe = np.where(fill, 255, np.where(codes == 0, 0, 3)).astype(np.uint8)
    return {chart: codes.astype(np.uint8), "SIC": sic, "FLOE": floe}


def write_netcdf(
    path: str, scene, images: dict | None, charts: dict | None, dims=("sar_lines", "sar_samples")
):
    """A ready-to-train AI4Arctic netCDF: images, uint8 charts (fill 255), AMSR2, attrs."""
    import netCDF4

    shape = next(iter((images or charts).values())).shape[-2:]
    with _NC_LOCK, netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.createDimension(dims[0], shape[0])
        ds.createDimension(dims[1], shape[1])
        ds.scene_id = f"S1B_EW_GRDM_1SDH_{scene.split('_')[0]}_synthetic"
        ds.original_id = ds.scene_id
        ds.ice_service = scene.rsplit("_", 1)[-1]
        ds.flip = 0
        ds.pixel_spacing = 80
        chunks = (min(64, shape[0]), min(64, shape[1]))
        for name, band in (images or {}).items():
            v = ds.createVariable(name, "f4", dims, fill_value=np.nan, zlib=True, chunksizes=chunks)
            v[:] = band
        if images:
            ds.createDimension("2km_grid_lines", math.ceil(shape[0] / 25))
            ds.createDimension("2km_grid_samples", math.ceil(shape[1] / 25))
            amsr = ds.createVariable("btemp_6_9h", "f4", ("2km_grid_lines", "2km_grid_samples"))
            amsr[:] = np.zeros((math.ceil(shape[0] / 25), math.ceil(shape[1] / 25)), np.float32)
        for name, chart in (charts or {}).items():
            v = ds.createVariable(name, "u1", dims, zlib=True)
            v.chart_fill_value = 255
            v.set_auto_maskandscale(False)
            v[:] = chart
