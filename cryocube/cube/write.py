"""Writing a cube, either kind: one template, one store creation (resumable), one block write
(digests and progress flag last), one finalisation (statistics, checksum, completion marker last).
Readers of raw layouts (convert/) decide what goes into a cube; how it is stored is decided here."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import xarray as xr
import zarr

from .. import store as _store
from ..catalog import CUBE_IGNORE_INDEX, DatasetSpec
from ..errors import UserError
from .digests import block_digest, cube_checksum, digest_rows, sample_digests
from .ids import check_unique_ids
from .schema import (
    BAND_COORDS,
    COMPLETE_ATTR,
    COMPRESSORS,
    PLAN_ATTR,
    SCHEMA_VERSION,
    STATS,
    IncompleteCubeError,
    _text,
    as_text,
)
from .stats import combine_stats, stratum_keys


@dataclass(frozen=True)
class WriteOptions:
    """How a cube is written: checked once by `convert.writer.prepare`."""

    block: int = 16  # samples per write task (and per block digest)
    overwrite: bool = False
    progress: bool = True
    on_error: str = "raise"  # skip: bad samples are recorded in the cube's attrs and left out
    tile: int | None = None  # tile cubes: tile size
    shard: int | None = None  # tile cubes: samples per Zarr shard
    compressor: str = "lz4"  # tile cubes: image/label codec (COMPRESSORS)


@dataclass
class ConvertResult:
    """What one conversion did (blocks_written 0: it was already complete)."""

    url: str
    n_samples: int
    blocks_written: int
    blocks_total: int
    read_bytes: int
    seconds: float
    marker: dict
    skipped: int


@dataclass
class SamplePlan:
    """What the client knows of a sample cube before any pixel is written."""

    ids: list[str]
    # one sample's image: (C, H, W), or (T, C, H, W) for multi-temporal cubes
    shape: tuple[int, ...]
    tasks: list[tuple[str, str]]  # (name, cls|regr) along the target's task axis
    target: np.ndarray  # (n, tasks) float32, NaN = no label
    attrs: dict[str, Any]
    fingerprint: dict[str, Any]  # options that define the cube besides ids, shape and targets
    time: tuple[str, ...] = ()  # names of the T axis (4-D shapes)
    published_mean: list[float] | None = None  # default: the catalog bands' mean/std
    published_std: list[float] | None = None
    # extra coordinates
    coords: dict[str, tuple[tuple[str, ...], np.ndarray]] = field(default_factory=dict)
    # small per-sample variables
    data_vars: dict[str, tuple[tuple[str, ...], np.ndarray]] = field(default_factory=dict)

    @property
    def n(self) -> int:
        """One sample per id, in the order the cube stores them."""
        return len(self.ids)

    @property
    def digest_vars(self) -> list[str]:
        """The variables the sample digests cover after image and target, in part order."""
        return sorted(k for k, (dims, _) in self.data_vars.items() if dims[0] == "sample")

    def key(self, block: int) -> str:
        """The resume fingerprint: `create` reopens only a store of the same plan and block."""
        both = {**self.coords, **self.data_vars}
        extra = {k: (v[0], _fingerprint(v[1])) for k, v in sorted(both.items())}
        key = {
            "ids": self.ids,
            "shape": list(self.shape),
            "tasks": self.tasks,
            "target": np.nan_to_num(self.target, nan=-1e30).tolist(),
            "extra": extra,
            "options": self.fingerprint,
            "block": block,
            "schema": SCHEMA_VERSION,
        }
        return hashlib.sha256(json.dumps(key, default=str, sort_keys=True).encode()).hexdigest()


def _fingerprint(a) -> Any:
    """Small variables as values, per-pixel ones (3-D and more) as a digest."""
    a = np.asarray(a)
    if a.ndim >= 3:
        digest = hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
        return [a.dtype.str, list(a.shape), digest]
    return a.tolist()


def template(
    bands, n: int, block: int, image: tuple, attrs: dict, coords, data_vars, parts=2, published=None
) -> xr.Dataset:
    """Every cube's template: image (a (dims, array) pair), bookkeeping, band coordinates and
    statistics; `parts` per sample digest, `published` (mean, std) as a sample plan gives them."""
    import dask.array as da

    c, nb = len(bands), -(-n // block)
    return xr.Dataset(
        data_vars={
            "image": image,
            **data_vars,
            "progress": (("block",), da.zeros((nb,), dtype="uint8", chunks=1)),
            "block_digest": (
                ("block", "digest_byte"),
                da.zeros((nb, 4 * parts), dtype="uint8", chunks=(1, 4 * parts)),
            ),
            "block_stats": (
                ("block", "stat", "band"),
                da.zeros((nb, len(STATS), c), dtype="float64", chunks=(1, len(STATS), c)),
            ),
            "sample_digest": (
                ("sample", "part"),
                da.zeros((n, parts), dtype="uint32", chunks=(block, parts)),
            ),
        },
        coords={
            **coords,
            **{c: ("band", _band_coord(bands, f, published)) for c, f in BAND_COORDS.items()},
            **{f"band_{s}": ("band", np.full(c, np.nan)) for s in ("mean", "std", "min", "max")},
        },
        attrs=attrs,
    )


def _band_coord(bands, field: str, published: tuple | None) -> np.ndarray:
    """One band coordinate: text, or float64 (published statistics as a sample plan gives them)."""
    if published and field in ("mean", "std"):
        return np.array(published[field == "std"], dtype="float64")
    values = [getattr(b, field) for b in bands]
    return _text(values) if isinstance(values[0], str) else np.array(values, dtype="float64")


def tile_template(
    spec: DatasetSpec, n: int, opts: WriteOptions, tiles: dict[str, np.ndarray], attrs: dict
) -> tuple[xr.Dataset, dict]:
    """A tile cube and its encoding: image, dense label, class fractions, where each tile lies
    (`tiles`: `Plan.coords`); one tile per chunk (in `opts.shard` shards), bookkeeping per block."""
    import dask.array as da

    if opts.compressor not in COMPRESSORS:
        raise UserError(
            f"unknown compressor {opts.compressor!r}; choose one of {', '.join(COMPRESSORS)}"
        )
    c, t, k, block = len(spec.bands), opts.tile, spec.num_classes, opts.block
    bs = opts.shard or 1
    image = da.zeros((n, c, t, t), dtype=spec.dtype, chunks=(bs, c, t, t))
    label = da.full((n, t, t), CUBE_IGNORE_INDEX, dtype="int16", chunks=(bs, t, t))
    fractions = da.zeros((n, k), dtype="float32", chunks=(block, k))
    data_vars = {
        "label": (("sample", "y", "x"), label),
        "class_fraction": (("sample", "class"), fractions),
    }
    coords = {
        **{v: ("sample", _text(tiles[v])) for v in ("split", "scene")},
        "tile_y": ("sample", tiles["tile_y"].astype("int32")),
        "tile_x": ("sample", tiles["tile_x"].astype("int32")),
        **{v: ("sample", _text(tiles[v])) for v in ("source", "sample_id", "crs")},
        "transform": (("sample", "affine"), tiles["transform"].astype("float64")),
        **{v: ("sample", _text(np.full(n, ""))) for v in ("stratum", "skip_reason")},
        "class": ("class", _text([cl.name for cl in spec.classes])),
    }
    dims = ("sample", "band", "y", "x")
    ds = template(spec.bands, n, block, (dims, image), attrs, coords, data_vars)
    note = "per-sample crs/transform coordinates"
    ds["image"].attrs.update(long_name="image", grid_mapping_note=note)
    ds["label"].attrs.update(long_name="class index", ignore_index=CUBE_IGNORE_INDEX)
    fast = COMPRESSORS[opts.compressor]()
    enc = {
        "image": {"chunks": (1, c, t, t), "compressors": fast},
        "label": {"chunks": (1, t, t), "compressors": fast},
        "class_fraction": {"chunks": (block, k)},
        "sample_digest": {"chunks": (block, 2)},
        "skip_reason": {"chunks": (block,)},
    }
    if opts.shard:
        enc["image"]["shards"] = (opts.shard, c, t, t)
        enc["label"]["shards"] = (opts.shard, t, t)
    return ds, enc


def sample_template(bands, plan: SamplePlan, block: int, attrs: dict) -> tuple[xr.Dataset, dict]:
    """A sample cube and its encoding: images, targets, the plan's variables."""
    import dask.array as da

    n, k, parts = plan.n, len(plan.tasks), 2 + len(plan.digest_vars)  # parts: image, target, extras
    dims = ("sample", *("time", "band", "y", "x")[-len(plan.shape) :])  # (time,) band, y, x
    ids = check_unique_ids(plan.ids, "the raw samples", "rename the repeated samples")
    coords = {
        "source": ("sample", _text(plan.ids)),
        "sample_id": ("sample", ids),
        "split": ("sample", _text(["all"] * n)),
        "task": ("task", _text([t for t, _ in plan.tasks])),
        "task_type": ("task", _text([t for _, t in plan.tasks])),
        **plan.coords,
    }
    if len(plan.shape) == 4:
        coords["time"] = ("time", _text(plan.time or [str(t) for t in range(plan.shape[0])]))
    image = da.zeros((n, *plan.shape), dtype="float32", chunks=(1, *plan.shape))
    kind = {"kind": "samples", "block_samples": block, "digest_vars": plan.digest_vars}
    attrs = {**attrs, **kind, **plan.attrs}
    data_vars = {"target": (("sample", "task"), plan.target.astype("float32")), **plan.data_vars}
    mean = plan.published_mean or [b.mean for b in bands]
    std = plan.published_std or [b.std for b in bands]
    ds = template(bands, n, block, (dims, image), attrs, coords, data_vars, parts, (mean, std))
    enc = {
        "image": {"chunks": (1, *plan.shape)},
        "target": {"chunks": (block, max(1, k))},
        "sample_digest": {"chunks": (block, parts)},
        # small per-sample variables in blocks; maps (a mask) one sample per chunk, as the image
        **{
            v: {"chunks": (block, *(max(1, d) for d in shp[1:])) if len(shp) < 3 else (1, *shp[1:])}
            for v in plan.digest_vars
            for shp in [np.shape(plan.data_vars[v][1])]
        },
    }
    return ds, enc


def create(
    out: str, make: Callable[[], tuple[xr.Dataset, dict]], fingerprint: str, overwrite: bool
) -> zarr.Group:
    """A new store from `make()`, or the same plan's reopened to resume (else refused)."""
    if _store.exists(out):
        if overwrite:
            _store.remove(out)
        else:
            g = _store.open_group(out, "r+")
            old = g.attrs.get(PLAN_ATTR)
            if old == fingerprint:
                return g
            if old is not None or COMPLETE_ATTR in g.attrs:
                raise UserError(
                    f"{out}: a cube from different inputs or options is already there; pass"
                    " --overwrite to replace it"
                )
            _store.remove(out)  # killed while writing metadata: nothing written yet
    (ds, enc), store = make(), _store.make_store(out)
    ds.to_zarr(store, mode="w", compute=False, zarr_format=3, encoding=enc, consolidated=True)
    g = _store.open_group(out, "r+")
    g.attrs[PLAN_ATTR] = fingerprint  # only now is the store a resumable cube
    zarr.consolidate_metadata(g.store)
    return g


def put_block(
    g: zarr.Group, block: int, s0: int, region: dict, parts: tuple, stats: np.ndarray
) -> None:
    """One block's variables, digests and moments; its progress flag last, so it counts."""
    digests = sample_digests(*parts)
    digest = block_digest(digests, *(digest_rows(p[:1])[0].nbytes for p in parts))
    n = len(parts[0])
    # every chunk is written whole, so zarr need not compare each one with the fill value first
    with zarr.config.set({"array.write_empty_chunks": True}):
        for name, values in region.items():
            g[name][s0 : s0 + n] = values
        g["sample_digest"][s0 : s0 + n] = digests
        g["block_digest"][block] = digest
        g["block_stats"][block] = stats
        g["progress"][block] = 1  # last: the block counts as written only now


def finalize(url: str) -> dict:
    """Strata, statistics, checksum and the completion marker last; idempotent."""
    g = _store.open_group(url, "r+")
    progress = np.asarray(g["progress"][:])
    missing = np.flatnonzero(progress == 0)
    if missing.size:
        raise IncompleteCubeError(
            f"{url}: {missing.size} of {progress.size} sample blocks not written yet (first:"
            f" {missing[:5].tolist()})"
        )
    stats = combine_stats(np.asarray(g["block_stats"][:]))
    if g.attrs.get("kind") == "samples":  # no split: every pixel of every sample counts
        attrs = {"statistics_split": "all"}
    else:
        g["stratum"][:] = stratum_keys(np.asarray(g["class_fraction"][:]))
        reasons = as_text(g["skip_reason"][:])
        skipped = np.flatnonzero(reasons != "")
        if skipped.size:
            split = np.asarray(g["split"][:]).astype(object)
            split[skipped] = "skipped"
            g["split"][:] = split
        source = as_text(g["source"][:])
        attrs = {
            "skipped_samples": [
                {"sample": int(i), "source": str(source[i]), "reason": str(reasons[i])}
                for i in skipped
            ],
            "statistics_split": "train",
            "statistics_valid_pixels": stats["count"].tolist(),
        }
    for k in ("mean", "std", "min", "max"):
        g[f"band_{k}"][:] = stats[k]
    g.attrs.update(attrs)
    marker = {
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "n_samples": int(g["image"].shape[0]),
        "checksum": cube_checksum(np.asarray(g["block_digest"][:])),
        "schema_version": SCHEMA_VERSION,
    }
    g.attrs[COMPLETE_ATTR] = marker  # last
    zarr.consolidate_metadata(g.store)
    return marker
