"""The reader contract: one reader per published raw layout, registered by (dataset, layout).

A reader only knows its layout: `scan` lists the source images (headers only, cheap, on the
client) and `read` returns raw pixels and raw label values for one image (on a worker). Tiling,
label remapping, validation, statistics and writing are the shared writer's job.
"""
from __future__ import annotations

import io
import posixpath
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import fsspec
import numpy as np

from ..catalog import DatasetSpec
from ..errors import UserError

SPLITS = ("train", "val", "test")


class ConvertError(UserError, ValueError):
    """Bad raw input. The message names the file (and band/sample) at fault."""


@dataclass(frozen=True)
class SourceItem:
    """One raw image (a tile or a whole scene) and its label, as found by `Reader.scan`."""

    split: str
    scene: str  # stable id: file stem (or scene id from the file)
    image: str  # URL/path of the image file
    label: str  # URL/path of the label file (may equal `image` for netCDF)
    height: int
    width: int
    bands: int
    crs: str | None = None  # WKT/"EPSG:n" of the scene, when georeferenced
    transform: tuple[float, ...] | None = None  # affine (a, b, c, d, e, f) of the scene's pixel (0, 0)


Mapper = Callable[[Callable[[Any], Any], list, int], list]  # (fn, jobs, threads per process) -> [fn(job)]
Window = tuple[int, int, int, int]  # (row0, row1, col0, col1), end-exclusive, inside the image


class Reader:
    dataset: ClassVar[str]
    layout: ClassVar[str]

    def __init__(self, spec: DatasetSpec, storage_options: dict[str, Any] | None = None):
        self.spec = spec
        self.storage_options = dict(storage_options or {})

    # -- contract -------------------------------------------------------------------------
    @classmethod
    def detect(cls, root: str, storage_options: dict | None = None) -> bool:
        """Whether `root` looks like this layout (used by --layout auto)."""
        raise NotImplementedError

    def scan(self, root: str, map_headers: "Mapper | None" = None) -> list[SourceItem]:
        """All items under `root`, sorted by (split order, name). Raises ConvertError on
        unpaired files or header-level problems (shape mismatch, band count).

        Listing happens here; per-file header reads go through `map_headers(fn, jobs, threads)`
        (default: this process; `convert` passes one that spreads them over the Dask workers)."""
        raise NotImplementedError

    def read(self, item: SourceItem, window: Window | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(image (C, h, w) in the source dtype, raw label (h, w)) for the window (whole image if None)."""
        raise NotImplementedError

    # -- shared helpers ---------------------------------------------------------------------
    def fs(self, url: str):
        fs, path = fsspec.core.url_to_fs(url, **self.storage_options)
        return fs, path

    def listdir(self, url: str, suffixes: tuple[str, ...] | None = None) -> dict[str, str]:
        """{stem: url} of the files directly in `url` (empty if the folder is missing)."""
        fs, path = self.fs(url)
        if not fs.isdir(path):
            return {}
        out = {}
        proto = url.split("://")[0] + "://" if "://" in url else ""
        for p in sorted(fs.ls(path, detail=False)):
            name = posixpath.basename(p.rstrip("/"))
            if name.startswith("."):
                continue
            stem, ext = posixpath.splitext(name)
            if suffixes and ext.lower() not in suffixes:
                continue
            out[stem] = (proto + p) if proto and not p.startswith(proto) else p
        return out

    def open_bytes(self, url: str) -> bytes:
        fs, path = self.fs(url)
        try:
            with fs.open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise ConvertError(f"{url}: file not found") from None

    def open_file(self, url: str):
        """A file object or local path suitable for rasterio/PIL/netCDF readers."""
        if "://" not in url or url.startswith("file://"):
            return url.removeprefix("file://")
        return io.BytesIO(self.open_bytes(url))


READERS: dict[tuple[str, str], type[Reader]] = {}


def register(cls: type[Reader]) -> type[Reader]:
    READERS[(cls.dataset, cls.layout)] = cls
    return cls


def pair_by_stem(images: dict[str, str], labels: dict[str, str], where: str) -> list[tuple[str, str, str]]:
    """Pair image and label files by name (never by sort order); unpaired files are an error."""
    lonely_img = sorted(set(images) - set(labels))
    lonely_lbl = sorted(set(labels) - set(images))
    if lonely_img or lonely_lbl:
        msg = []
        if lonely_img:
            msg.append("images without a mask: " + ", ".join(images[s] for s in lonely_img[:10]))
        if lonely_lbl:
            msg.append("masks without an image: " + ", ".join(labels[s] for s in lonely_lbl[:10]))
        raise ConvertError(f"{where}: " + "; ".join(msg))
    return [(s, images[s], labels[s]) for s in sorted(images)]
