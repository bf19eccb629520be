"""Reading a cube: open it (refusing what is no cube or incomplete), plan from its coordinates, read
samples checked against their digests."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import xarray as xr
import zarr

from .. import store as _store
from ..catalog import Band
from ..errors import UserError
from .digests import _crc, digest_rows, digest_vars, sample_digests
from .schema import (
    BAND_COORDS,
    COMPLETE_ATTR,
    INTERNAL_VARS,
    SAMPLE_VARS,
    DamagedCubeError,
    IncompleteCubeError,
    as_text,
)


def open_cube(url: str, storage_options: dict | None = None, allow_incomplete=False) -> xr.Dataset:
    """The cube as an xarray Dataset (lazy). Refuses an incomplete cube unless asked."""
    if not _store.exists(url, storage_options):
        raise UserError(not_a_cube(url, storage_options))
    st = _store.make_store(url, storage_options, read_only=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ds = xr.open_zarr(st, decode_coords="all", consolidated=None, chunks={})
        # a Zarr group of another kind (an embedding store, someone's data)
        except (KeyError, ValueError, TypeError):
            raise UserError(not_a_cube(url, storage_options)) from None
    for w in caught:  # xarray's own warnings about a cube, not about what turned out to be no cube
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if "schema_version" not in ds.attrs:
        raise UserError(not_a_cube(url, storage_options))
    if COMPLETE_ATTR not in ds.attrs and not allow_incomplete:
        raise IncompleteCubeError(
            f"{url}: cube is incomplete (no '{COMPLETE_ATTR}' marker); rerun `cryocube convert`"
            " with the same arguments to resume it"
        )
    return _labels_here(ds.drop_vars([v for v in INTERNAL_VARS if v in ds.variables]), url)


PIXEL_DIMS = {"y", "x"}


def _labels_here(ds: xr.Dataset, url: str) -> xr.Dataset:
    """Every variable but the pixels read now, in this process. They are small (per sample, band
    or class) and planning, records and reports read them; lazily, a notebook's default Client ran
    each `.values` on the cluster, queued behind its fits, or never where a worker was paused."""
    import dask

    lazy = [
        k
        for k, v in ds.variables.items()
        if dask.is_dask_collection(v) and not PIXEL_DIMS & set(v.dims)
    ]
    try:  # local threads: a remote cube's chunks arrive in parallel, never through a Client
        values = dict(
            zip(lazy, dask.compute(*(ds.variables[k].data for k in lazy), scheduler="threads"))
        )
    except Exception:  # noqa: BLE001 - a chunk failing in its codec, or its store read: which?
        values = {}
        checked = {"target", *(ds.attrs.get("digest_vars") or ())}
        for k in lazy:
            try:
                values[k] = ds.variables[k].data.compute(scheduler="synchronous")
            except Exception as e:  # noqa: BLE001
                if k in checked:  # left lazy: its checked reads name the damaged sample
                    continue
                raise DamagedCubeError(
                    f"{url}: variable {k!r} cannot be read ({type(e).__name__}: {e}); the cube is"
                    f" damaged: run `cryocube inspect --verify {url}`"
                ) from None
    for k, v in values.items():
        ds.variables[k].data = v
    return ds


def not_a_cube(url: str, storage_options: dict | None = None) -> str:
    """Why `url` is no cube, in one sentence."""
    if _store.exists(url, storage_options):
        attrs = dict(_store.open_group(url, "r", storage_options).attrs)
        if "cryocube_embedding_complete" in attrs or "embedding_sha256" in attrs:
            return (
                f"{url}: no cube here: it is an embedding store (`cryocube embed`); `cryocube probe"
                f" {url}` scores it"
            )
        return (
            f"{url}: no cube here: a Zarr group that cryocube did not write as a cube (no"
            " schema_version attribute)"
        )
    if _store.file_exists(_store.join(url, "results.jsonl"), storage_options):
        return (
            f"{url}: no cube here: it is a results folder (results.jsonl); `cryocube report {url}"
            " --out DIR` summarises it"
        )
    fs, path = _store.fs_path(url, storage_options)
    if fs.exists(path):
        return f"{url}: no cube here (a folder without zarr.json)"
    return f"{url}: no cube here (no such file or folder)"


@dataclass
class CubeInfo:
    """What planning needs of a complete cube, read from its coordinates and attrs (no pixels)."""

    url: str
    dataset: str
    checksum: str
    schema_version: int
    tile: int
    bands: tuple[Band, ...]
    class_names: list[str]
    splits: np.ndarray
    strata: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    published_mean: np.ndarray
    published_std: np.ndarray
    labelled: np.ndarray  # per sample: has at least one labelled (non-ignore) pixel
    # "tiles" (dense labels) | "samples" (image-level task targets, e.g. SSL4EO-downstream)
    kind: str = "tiles"
    time: tuple[str, ...] = ()  # time steps of multi-temporal sample cubes
    tasks: tuple[tuple[str, str], ...] = ()  # sample cubes: (task, cls|regr)

    def samples(self, split: str) -> np.ndarray:
        """Indices of one split's samples, ascending (empty where the cube has none)."""
        return np.flatnonzero(self.splits == split)

    @property
    def n_samples(self) -> int:
        """Every sample of the cube, all splits together: the rows an embedding store holds."""
        return int(self.splits.size)


def cube_info(url: str, storage_options: dict | None = None) -> CubeInfo:
    """A complete cube's metadata (`open_cube` read it here, never through a Client)."""
    _store.register_options(url, storage_options)
    ds = open_cube(url)
    cols = {field: ds[coord].values for coord, field in BAND_COORDS.items()}
    bands = tuple(
        Band(**{f: str(v[i]) if isinstance(v[i], str) else float(v[i]) for f, v in cols.items()})
        for i in range(ds.sizes["band"])
    )
    samples, marker = ds.attrs.get("kind") == "samples", ds.attrs[COMPLETE_ATTR]
    splits = as_text(ds["split"].values)
    if samples:  # a sample is labelled by any task's target, a tile by any labelled pixel
        labelled = np.isfinite(np.asarray(ds["target"].values)).any(axis=1)
    else:
        labelled = np.asarray(ds["class_fraction"].values).sum(axis=1) > 0
    tasks = zip(as_text(ds["task"].values), as_text(ds["task_type"].values)) if samples else ()
    return CubeInfo(
        url=url,
        dataset=str(ds.attrs["dataset"]),
        checksum=str(marker["checksum"]),
        schema_version=int(marker.get("schema_version", ds.attrs.get("schema_version", 0))),
        tile=int(ds.sizes["y"]),
        bands=bands,
        class_names=[] if samples else [str(c) for c in ds["class"].values],
        splits=splits,
        strata=splits if samples else as_text(ds["stratum"].values),
        mean=ds["band_mean"].values.astype(float),
        std=ds["band_std"].values.astype(float),
        published_mean=ds["published_mean"].values.astype(float),
        published_std=ds["published_std"].values.astype(float),
        labelled=labelled,
        kind="samples" if samples else "tiles",
        time=tuple(as_text(ds["time"].values)) if "time" in ds.coords else (),
        tasks=tuple(tasks),
    )


_GROUPS: dict[str, zarr.Group] = {}  # per process: read-only groups of cubes tasks read from
_WARNED: set[str] = set()


def _group(url: str) -> zarr.Group:
    g = _GROUPS.get(url)
    if g is None:
        g = _GROUPS[url] = _store.open_group(url, "r")
        if "sample_digest" not in g and url not in _WARNED:
            _WARNED.add(url)
            warnings.warn(
                f"{url}: cube schema v{g.attrs.get('schema_version')} has no per-sample digests, so"
                " damaged chunks cannot be detected when it is read; convert it again with"
                " --overwrite",
                stacklevel=3,
            )
    return g


def _select(arr, idx: np.ndarray):
    if idx.size and np.all(np.diff(idx) == 1):
        return np.asarray(arr[int(idx[0]) : int(idx[-1]) + 1])
    return np.asarray(arr.get_orthogonal_selection((idx,)))


def _where(g: zarr.Group, url: str, i: int) -> str:
    try:
        src = str(g["source"][i])
    except Exception:  # noqa: BLE001 - the name is a courtesy; the error stands without it
        src = "?"
    return f"{url}: sample {i} (source {src})"


def _mismatch(g: zarr.Group, url: str, i: int, what: str, bad: int, read: int):
    return DamagedCubeError(
        f"{_where(g, url, i)}: its {what} does not match the digest written at conversion (a chunk"
        f" was deleted, truncated or altered; {bad} of {read} samples read are damaged); run"
        f" `cryocube inspect --verify {url}`, then convert again"
    )


def read_samples(url: str, idx, labels=True, verify=True) -> tuple[np.ndarray, np.ndarray | None]:
    """Images and labels (targets for sample cubes) of `idx`, checked against their digests."""
    g = _group(url)
    var = "target" if g.attrs.get("kind") == "samples" else "label"
    idx = np.asarray(idx, dtype=np.int64)
    try:
        img = _select(g["image"], idx)
        lab = _select(g[var], idx) if labels or verify else None
    # a truncated chunk fails in its codec (blosc/zstd), or the store read fails
    except Exception as e:
        for i in idx:  # find the sample at fault
            try:
                g["image"][int(i)]
                g[var][int(i)]
            except Exception:  # noqa: BLE001
                raise DamagedCubeError(
                    f"{_where(g, url, int(i))}: its stored chunk cannot be read"
                    f" ({type(e).__name__}: {e}); the cube is damaged: run `cryocube inspect"
                    f" --verify {url}`"
                ) from None
        raise
    if verify and "sample_digest" in g:
        # image and label/target (a sample cube's extras follow)
        want = _select(g["sample_digest"], idx)[:, :2]
        got = sample_digests(img, lab)
        bad = np.flatnonzero((got != want).any(axis=1))
        if bad.size:
            what = "image" if got[bad[0], 0] != want[bad[0], 0] else "label"
            raise _mismatch(g, url, int(idx[bad[0]]), what, bad.size, idx.size)
    return img, (lab if labels else None)


def read_checked(url: str, name: str, idx=None) -> np.ndarray:
    """A per-sample variable (at `idx`), checked where a digest covers it, never fill values."""
    g = _group(url)
    sel = np.arange(g[name].shape[0]) if idx is None else np.asarray(idx, dtype=np.int64)
    try:
        values = np.asarray(g[name][:]) if idx is None else _select(g[name], sel)
    except Exception as e:  # noqa: BLE001 - a chunk that fails in its codec, or a failing store read
        raise DamagedCubeError(
            f"{url}: variable {name!r} cannot be read ({type(e).__name__}: {e}); the cube is"
            f" damaged: run `cryocube inspect --verify {url}`"
        ) from None
    parts = ("target", *digest_vars(g))
    if name in parts and "sample_digest" in g:
        want = _select(g["sample_digest"], sel)[:, 1 + parts.index(name)]
        bad = np.flatnonzero(np.array([_crc(r) for r in digest_rows(values)], np.uint32) != want)
        if bad.size:
            raise _mismatch(g, url, int(sel[bad[0]]), name, bad.size, len(values))
    return values


def read_dense(url: str, idx) -> tuple[np.ndarray, np.ndarray]:
    """Images and a dense int16 label of any cube (a sample cube's `mask`), checked."""
    g = _group(url)
    if g.attrs.get("kind") != "samples":
        return read_samples(url, idx)
    if "mask" not in g:
        raise UserError(
            f"{url}: this sample cube has no per-pixel target (`mask`), so it cannot be segmented"
        )
    img, _ = read_samples(url, idx, labels=False)
    return img, read_checked(url, "mask", idx).astype(np.int16)


# -- typed views: what a task reads of each kind of cube ----------------------------------------


@dataclass(frozen=True)
class CubeView:
    """A complete cube opened lazily; the kind's view says what a task may ask of it."""

    url: str
    ds: xr.Dataset

    @property
    def n(self) -> int:
        """The sample count from the lazy dataset's sizes, so asking reads no chunk."""
        return int(self.ds.sizes["sample"])


class TileCube(CubeView):
    """A tile cube (dense labels): its coordinates by name, no pixels."""

    kind = "tiles"

    @property
    def split(self) -> np.ndarray:
        """Each sample's split name as str (zarr's string dtypes decoded), in sample order."""
        return as_text(self.ds["split"].values)

    @property
    def class_names(self) -> list[str]:
        """The label classes, in the order of the integer codes the `label` variable stores."""
        return [str(c) for c in self.ds["class"].values]


class SampleCube(CubeView):
    """A sample cube: every variable `schema.SAMPLE_VARS` declares, or its default."""

    kind = "samples"

    @property
    def size(self) -> tuple[int, int]:
        """(height, width) of the cube's images (every sample padded to it)."""
        return int(self.ds.sizes["y"]), int(self.ds.sizes["x"])

    @property
    def rendered(self) -> bool:
        """True where the bands are renderings (no physical values): questions say so."""
        return bool(self.ds.attrs.get("rendered", False))

    @property
    def unavailable(self) -> dict[str, str]:
        """Per task, why the converter found no reference for it."""
        return dict(self.ds.attrs.get("unavailable") or {})

    def has(self, name: str) -> bool:
        """Whether the cube stores `name` itself (else `values` gives the default)."""
        return name in self.ds

    def values(self, name: str) -> np.ndarray:
        """A declared coordinate or its default (text as str, height/width as the cube's size)."""
        var = SAMPLE_VARS[name]
        if name in self.ds:
            v = np.asarray(self.ds[name].values)
            return as_text(v) if v.dtype.kind in "OUT" or "String" in str(v.dtype) else v
        if name in ("height", "width"):
            return np.full(self.n, self.size[0 if name == "height" else 1], dtype=np.int64)
        if var.default is None:
            return np.array([], dtype=object)  # e.g. no text tasks: none
        length = self.n if var.dims[0] == "sample" else int(self.ds.sizes.get(var.dims[0], 0))
        dtype = object if isinstance(var.default, str) else np.float64
        return np.full(length, var.default, dtype=dtype)

    @property
    def tasks(self) -> list[str]:
        """The image-level task names, in the target's column order."""
        return [str(t) for t in as_text(self.ds["task"].values)] if "task" in self.ds else []

    def checked(self, name: str) -> np.ndarray | None:
        """`target` or a declared data variable, checked; None where the cube has none."""
        if name != "target" and SAMPLE_VARS[name].coord:
            raise KeyError(f"{name!r} is a coordinate; read it with values()")
        return read_checked(self.url, name) if name in self.ds else None


def open_view(url: str, storage_options: dict | None = None) -> TileCube | SampleCube:
    """The complete cube at `url` as a `SampleCube` or `TileCube`."""
    _store.register_options(url, storage_options)
    ds = open_cube(url)
    return SampleCube(url, ds) if ds.attrs.get("kind") == "samples" else TileCube(url, ds)
