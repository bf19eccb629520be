"""Raster file I/O shared by the readers: header-only opens and windowed reads by suffix
(`FORMATS`, remote files lazily through fsspec), and the sample-data writers."""

from __future__ import annotations

import posixpath
import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import WindowError
from ..store import is_remote
from .base import ConvertError, Reader, Window

HEADER_THREADS = 16  # header reads are I/O bound (one small GET each on object stores)


@dataclass(frozen=True)
class Header:
    """What a file's header says, read without touching the pixels."""

    bands: int
    height: int
    width: int
    crs: str | None = None
    transform: tuple[float, ...] | None = None


def check_window(url: str, window: Window | None, height: int, width: int) -> Window:
    """The full image when `window` is None; otherwise the window, checked to lie inside."""
    if window is None:
        return (0, height, 0, width)
    r0, r1, c0, c1 = (int(v) for v in window)
    if not (0 <= r0 < r1 <= height and 0 <= c0 < c1 <= width):
        raise WindowError(f"{url}: window {window} is outside the image ({height}x{width})")
    return (r0, r1, c0, c1)


def _crs_string(crs) -> str | None:
    if crs is None:
        return None
    epsg = crs.to_epsg()
    return f"EPSG:{epsg}" if epsg else crs.to_wkt()


# -- file formats ---------------------------------------------------------------------------


class RasterioFormat:
    """GeoTIFF (and anything GDAL opens): true windowed reads, CRS and transform from the file."""

    @staticmethod
    @contextmanager
    def _open(reader: Reader, url: str):
        import rasterio
        from rasterio.errors import NotGeoreferencedWarning

        fs, path = reader.fs(url) if is_remote(url) else (None, url.removeprefix("file://"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotGeoreferencedWarning)
            with rasterio.open(path, opener=fs) as ds:
                yield ds

    def header(self, reader: Reader, url: str) -> Header:
        """Count, size, CRS and transform (None, not the identity, if ungeoreferenced)."""
        import rasterio

        with self._open(reader, url) as ds:
            crs = _crs_string(ds.crs)
            transform = tuple(float(v) for v in tuple(ds.transform)[:6])
            if crs is None and ds.transform == rasterio.Affine.identity():
                transform = None
            return Header(ds.count, ds.height, ds.width, crs, transform)

    def read(self, reader: Reader, url: str, window, bands) -> np.ndarray:
        """A true windowed read: only the window's bytes are fetched, remote files too."""
        from rasterio.windows import Window as RWindow

        with self._open(reader, url) as ds:
            r0, r1, c0, c1 = check_window(url, window, ds.height, ds.width)
            idx = list(range(1, (bands or ds.count) + 1))
            return ds.read(idx, window=RWindow(c0, r0, c1 - c0, r1 - r0))


class PILFormat:
    """PNG/JPEG/BMP: decoded whole, then cut (no random access; fine at these sizes)."""

    @staticmethod
    @contextmanager
    def _open(reader: Reader, url: str):
        from PIL import Image

        if is_remote(url):
            fs, path = reader.fs(url)
            with fs.open(path, "rb", block_size=1 << 16) as f, Image.open(f) as im:
                yield im
        else:
            with Image.open(url.removeprefix("file://")) as im:
                yield im

    def header(self, reader: Reader, url: str) -> Header:
        """Band count and size without decoding pixels; these formats carry no CRS."""
        with self._open(reader, url) as im:
            w, h = im.size
            return Header(len(im.getbands()), h, w)

    def read(self, reader: Reader, url: str, window, bands) -> np.ndarray:
        """The whole image decoded, then the window cut; a truncated file fails here."""
        with self._open(reader, url) as im:
            w, h = im.size
            r0, r1, c0, c1 = check_window(url, window, h, w)
            im.load()  # raises OSError on a truncated file
            arr = np.asarray(im)
        if arr.dtype == bool:
            arr = arr.astype(np.uint8)
        arr = arr[r0:r1, c0:c1]
        arr = arr[None] if arr.ndim == 2 else np.moveaxis(arr, -1, 0)
        return np.ascontiguousarray(arr[: bands or arr.shape[0]])


FORMATS: dict[str, Any] = {
    **dict.fromkeys((".tif", ".tiff"), RasterioFormat()),
    **dict.fromkeys((".png", ".jpg", ".jpeg", ".bmp"), PILFormat()),
}


def file_format(url: str):
    """The format by suffix; unknown suffixes go to rasterio, since GDAL opens most rasters."""
    return FORMATS.get(posixpath.splitext(url)[1].lower(), FORMATS[".tif"])


def checked_read(url: str, what: str, fn):
    """fn(); a missing or bad file (GDAL, PIL, HDF5, zarr raise many types) as a ConvertError."""
    try:
        return fn()
    except (ConvertError, WindowError):
        raise
    except FileNotFoundError:
        raise ConvertError(f"{url}: file not found") from None
    except Exception as e:
        raise ConvertError(
            f"{url}: cannot read the {what} ({type(e).__name__}: {e}); the file is corrupt or"
            " truncated"
        ) from None


def raster_header(reader: Reader, url: str) -> Header:
    """The header of a raster file."""
    return checked_read(url, "header", lambda: file_format(url).header(reader, url))


def read_raster(reader: Reader, url: str, window: Window | None = None, bands=None) -> np.ndarray:
    """(C, h, w) pixels of the first `bands` bands (all if None) in the window, source dtype."""
    return checked_read(url, "pixels", lambda: file_format(url).read(reader, url, window, bands))


def header_threads(root: str) -> int:
    """Threads per process for header reads: remote reads wait on the network; local ones cost
    CPU (GDAL's open), where threads contend (0.30 s with 1 thread vs 0.51 s with 16, 320 files)."""
    return HEADER_THREADS if is_remote(root) else 1


def map_threads(fn: Callable, items: list, threads: int = HEADER_THREADS) -> list:
    """`[fn(x) for x in items]` on a thread pool (remote header reads wait on the network)."""
    if len(items) <= 1 or threads <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(min(threads, len(items))) as pool:
        return list(pool.map(fn, items))


# -- writers (sample data) ------------------------------------------------------------------------


def write_geotiff(path: str | Path, arr: np.ndarray, crs=None, transform=None) -> None:
    """Sample data: a 2-D array is one band; georeferenced when a CRS (and transform) is given."""
    import rasterio
    from rasterio.transform import Affine

    arr = arr[None] if arr.ndim == 2 else arr
    c, h, w = arr.shape
    geo = {} if crs is None else {"crs": crs, "transform": Affine(*transform)}
    with rasterio.open(
        path, "w", driver="GTiff", count=c, height=h, width=w, dtype=arr.dtype.name, **geo
    ) as ds:
        ds.write(arr)


def write_png(path: str | Path, arr: np.ndarray, crs=None, transform=None) -> None:
    """Sample data: 1-4 bands as uint8; `crs` and `transform` only fit `WRITERS`'s signature."""
    from PIL import Image

    arr = arr[None] if arr.ndim == 2 else arr
    if arr.shape[0] not in (1, 2, 3, 4):
        raise ValueError(f"{path}: a PNG holds 1-4 bands, not {arr.shape[0]}")
    data = arr[0] if arr.shape[0] == 1 else np.moveaxis(arr, 0, -1)  # L, LA, RGB, RGBA
    Image.fromarray(np.ascontiguousarray(data.astype(np.uint8))).save(path)


WRITERS: dict[str, Callable] = {".tif": write_geotiff, ".tiff": write_geotiff, ".png": write_png}
