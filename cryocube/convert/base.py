"""The reader contract: one reader per kind of published raw layout, named by a catalog layout's
`reader:` and configured by its options (docs/architecture.md: the two bases, by the cube made)."""

from __future__ import annotations

import posixpath
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from .. import plugins, store
from ..catalog import DatasetSpec, Layout
from ..cube.write import ConvertResult, WriteOptions
from ..errors import ConvertError

SPLITS = ("train", "val", "test")
BUILTIN_READERS = (
    "cryocube.convert.paired",
    "cryocube.convert.ai4arctic",
    "cryocube.convert.ssl4eo",
    "cryocube.convert.insar",
    "cryocube.convert.hephaestus",
)


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
    # affine (a, b, c, d, e, f) of the scene's pixel (0, 0)
    transform: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Option:
    """A layout option read as a reader attribute: checked by `Reader.option`, then converted."""

    key: str
    default: Any = ...
    kind: type | tuple[type, ...] | None = None
    convert: Callable[[Any], Any] | None = None
    choices: tuple = ()

    def __get__(self, reader: Reader | None, owner=None) -> Any:
        if reader is None:
            return self
        v = reader.option(self.key, self.default, self.kind)
        if self.choices and v not in self.choices:
            said = " or ".join(map(repr, self.choices))
            raise ConvertError(f"{reader.where}: option {self.key} must be {said}, got {v!r}")
        return v if self.convert is None else self.convert(v)


def texts(values) -> list[str]:
    """A list option's items as str (YAML may give numbers)."""
    return [str(v) for v in values]


def text_map(d: dict) -> dict[str, str]:
    """A mapping option's keys and values as str."""
    return {str(k): str(v) for k, v in d.items()}


# (fn, jobs, threads per process) -> [fn(job)]
Mapper = Callable[[Callable[[Any], Any], list, int], list]
Window = tuple[int, int, int, int]  # (row0, row1, col0, col1), end-exclusive, inside the image


class Reader(ABC):
    """What every reader shares: its layout's options, file access, the two steps of `convert`."""

    name: ClassVar[str]  # what a catalog layout's `reader:` field names
    # the layout options it reads (shown by `cryocube list readers`)
    options_doc: ClassVar[str] = ""
    # its annotations flag damaged samples (`--keep-corrupted` applies)
    flags_samples: ClassVar[bool] = False

    def __init__(self, spec: DatasetSpec, layout: str, storage_options: dict | None = None):
        self.spec = spec
        self.layout: Layout = spec.layout(layout)
        self.storage_options = dict(storage_options or {})

    @property
    def options(self) -> dict:
        """The layout's options as the catalog gives them, unchecked; readers use `option`."""
        return self.layout.options

    @property
    def where(self) -> str:
        """The prefix of every option error, naming the YAML field to fix."""
        return f"{self.spec.path}: layouts.{self.layout.name}"

    def option(self, key: str, default: Any = ..., kind=None) -> Any:
        """A layout option, checked against `kind` (a type or a tuple of them); a missing required
        one names the catalog file and field."""
        if key not in self.options:
            if default is ...:
                raise ConvertError(f"{self.where}: reader {self.name!r} needs the option {key!r}")
            return default
        v = self.options[key]
        if kind is not None and not isinstance(v, kind):
            raise ConvertError(f"{self.where}: option {key!r} should be {kind}, got {v!r}")
        return v

    # -- contract (both kinds) ----------------------------------------------------------------
    @abstractmethod
    def detect(self, root: str) -> bool:
        """Whether `root` looks like this layout (used by --layout auto)."""

    def precheck(self, raw: str, on_error: str = "raise", **options) -> Any:
        """What can be checked before a cluster starts (None where headers are read on workers)."""
        return None

    @abstractmethod
    def convert(self, raw: str, out: str, client, opts: WriteOptions, prechecked) -> ConvertResult:
        """Write (or resume) this layout's cube at `out`, from what `precheck` returned."""

    # -- shared helpers ---------------------------------------------------------------------
    def fs(self, url: str):
        """fsspec (filesystem, path) of `url`, with the options registered for its bucket."""
        return store.fs_path(url, self.storage_options)

    def listdir(self, url: str, suffixes: tuple[str, ...] | None = None) -> dict[str, str]:
        """{stem: url} of the files directly in `url` (empty if the folder is missing)."""
        fs, path = self.fs(url)
        if not fs.isdir(path):
            return {}
        out = {}
        proto = url.split("://")[0] + "://" if store.is_remote(url) else ""
        for p in sorted(fs.ls(path, detail=False)):
            stem, ext = posixpath.splitext(posixpath.basename(p.rstrip("/")))
            if not stem.startswith(".") and (not suffixes or ext.lower() in suffixes):
                out[stem] = (proto + p) if proto and not p.startswith(proto) else p
        return out

    def glob(self, root: str, pattern: str) -> dict[str, str]:
        """{path under `root`: URL} of the files `pattern` matches there, local or remote alike."""
        fs, base = self.fs(root)
        base = base.rstrip("/")
        proto = root.split("://")[0] + "://" if store.is_remote(root) else ""
        return {
            posixpath.relpath(p, base): p if p.startswith(proto) else proto + p
            for p in sorted(fs.glob(posixpath.join(base, pattern)))
        }

    def isdir(self, url: str) -> bool:
        """Whether `url` is a folder, local or remote alike; layouts' `detect` tests with it."""
        fs, path = self.fs(url)
        return fs.isdir(path)

    def open_bytes(self, url: str) -> bytes:
        """A whole file in memory (annotations, remote netCDF, zipped Zarr); missing is an error."""
        fs, path = self.fs(url)
        try:
            with fs.open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise ConvertError(f"{url}: file not found") from None


READERS: plugins.Registry[type[Reader]] = plugins.Registry(
    "reader", "cryocube.readers", BUILTIN_READERS
)


def register(cls: type[Reader]) -> type[Reader]:
    """Class decorator: a reader catalog layouts can name; a second class per name is refused."""
    return READERS.add(cls.name, cls)


def readers() -> plugins.Registry[type[Reader]]:
    """Every reader, built in or from plug-ins (entry points `cryocube.readers`)."""
    return READERS.load()


def open_reader(spec: DatasetSpec, layout: str, storage_options: dict | None = None) -> Reader:
    """The reader a dataset's layout names, configured by that layout."""
    lay = spec.layout(layout)
    known = readers()
    if lay.reader not in known:
        raise ConvertError(
            f"{spec.path}: layouts.{layout} names reader {lay.reader!r}; known:"
            f" {', '.join(sorted(known))}"
        )
    return known[lay.reader](spec, layout, storage_options)


def pair_by_stem(images: dict, labels: dict, where: str) -> list[tuple[str, str, str]]:
    """Pair image and label files by name (never by sort order); unpaired files are an error."""
    msg = [
        f"{what} without {other}: " + ", ".join(files[s] for s in lonely[:10])
        for what, files, other, them in (
            ("images", images, "a mask", labels),
            ("masks", labels, "an image", images),
        )
        if (lonely := sorted(set(files) - set(them)))
    ]
    if msg:
        raise ConvertError(f"{where}: " + "; ".join(msg))
    return [(s, images[s], labels[s]) for s in sorted(images)]
