"""The cube: one Zarr v3 group per dataset, `image(sample, band, y, x)` + `label(sample, y, x)`.

Everything a protocol needs to pick samples (split, scene, tile position, stratum, class fractions)
and to normalise (train-split band statistics) lives in coordinates, so no label has to be read to
plan a run. A cube is complete only when the `cryocube_complete` attribute exists; it is written last.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr
import zarr

from . import store as _store
from .catalog import CUBE_IGNORE_INDEX, DatasetSpec
from .errors import UserError

SCHEMA_VERSION = 2  # 2: block statistics as (count, mean, M2) moments, crc32 block digests
COMPLETE_ATTR = "cryocube_complete"
PLAN_ATTR = "cryocube_plan"
INTERNAL_VARS = ("progress", "block_digest", "block_stats", "skip_reason")
STATS = ("count", "mean", "m2", "min", "max")  # per-block moments (Chan et al.), merged at finalize
DIGEST_BYTES = 8  # crc32 of the block's image bytes, then of its label bytes


class IncompleteCubeError(UserError):
    """The cube has no completion marker: a conversion is still running or was interrupted."""


@dataclass(frozen=True)
class CubeLayout:
    """Shape facts of a cube, fixed at creation (so a resumed conversion can check it)."""

    n_samples: int
    n_bands: int
    tile: int
    n_classes: int
    dtype: str
    block_size: int
    shard_size: int | None = None
    compressor: str = "lz4"

    @property
    def n_blocks(self) -> int:
        return math.ceil(self.n_samples / self.block_size)

    def block_range(self, b: int) -> tuple[int, int]:
        return b * self.block_size, min((b + 1) * self.block_size, self.n_samples)


def stratum_keys(class_fraction: np.ndarray, bins: int = 3) -> np.ndarray:
    """Few-shot stratum of each sample, as the reference sampler builds it.

    Per class: bin = ceil(ratio * bins) - 1 (so 0 -> -1, (0, 1/3] -> 0, ...); the key is the bin
    integers concatenated as a string ("2-1" = all background in a binary task).
    """
    cf = np.asarray(class_fraction, dtype=np.float64)
    b = np.ceil(np.round(cf * bins, 9)).astype(int) - 1
    return _text("".join(str(v) for v in row) for row in b)


def as_text(a) -> np.ndarray:
    """Strings read back from zarr/xarray (numpy StringDType or object) as an object array of str."""
    return np.array([str(v) for v in np.asarray(a).ravel()], dtype=object).reshape(np.shape(a))


def _text(values) -> np.ndarray:
    """Strings as object arrays: zarr v3 stores them as variable-length UTF-8 (a specified type)."""
    return np.array([str(v) for v in values], dtype=object)


def template(
    spec: DatasetSpec,
    layout: CubeLayout,
    coords: dict[str, np.ndarray],
    attrs: dict[str, Any],
) -> xr.Dataset:
    """Lazy dataset that fixes the cube's metadata; data variables are filled by region writes."""
    import dask.array as da

    n, c, t, k = layout.n_samples, layout.n_bands, layout.tile, layout.n_classes
    bs = layout.shard_size or 1
    image = da.zeros((n, c, t, t), dtype=layout.dtype, chunks=(bs, c, t, t))
    label = da.full((n, t, t), CUBE_IGNORE_INDEX, dtype="int16", chunks=(bs, t, t))
    cf = da.zeros((n, k), dtype="float32", chunks=(layout.block_size, k))
    nb = layout.n_blocks
    bands = spec.bands
    ds = xr.Dataset(
        data_vars={
            "image": (("sample", "band", "y", "x"), image),
            "label": (("sample", "y", "x"), label),
            "class_fraction": (("sample", "class"), cf),
            "progress": (("block",), da.zeros((nb,), dtype="uint8", chunks=1)),
            "block_digest": (("block", "digest_byte"), da.zeros((nb, DIGEST_BYTES), dtype="uint8", chunks=(1, DIGEST_BYTES))),
            "block_stats": (("block", "stat", "band"), da.zeros((nb, len(STATS), c), dtype="float64", chunks=(1, len(STATS), c))),
        },
        coords={
            "split": ("sample", _text(coords["split"])),
            "scene": ("sample", _text(coords["scene"])),
            "tile_y": ("sample", coords["tile_y"].astype("int32")),
            "tile_x": ("sample", coords["tile_x"].astype("int32")),
            "source": ("sample", _text(coords["source"])),
            "crs": ("sample", _text(coords["crs"])),
            "transform": (("sample", "affine"), coords["transform"].astype("float64")),
            "stratum": ("sample", _text(np.full(n, ""))),
            "skip_reason": ("sample", _text(np.full(n, ""))),
            "band": ("band", _text([b.name for b in bands])),
            "alias": ("band", _text([b.alias for b in bands])),
            "role": ("band", _text([b.role for b in bands])),
            "wavelength_um": ("band", np.array([b.wavelength_um for b in bands], dtype="float64")),
            "sensor": ("band", _text([b.sensor for b in bands])),
            "units": ("band", _text([b.units for b in bands])),
            "published_mean": ("band", np.array([b.mean for b in bands], dtype="float64")),
            "published_std": ("band", np.array([b.std for b in bands], dtype="float64")),
            "band_mean": ("band", np.full(c, np.nan)),
            "band_std": ("band", np.full(c, np.nan)),
            "band_min": ("band", np.full(c, np.nan)),
            "band_max": ("band", np.full(c, np.nan)),
            "class": ("class", _text([cl.name for cl in spec.classes])),
        },
        attrs=attrs,
    )
    ds["image"].attrs.update(long_name="image", grid_mapping_note="per-sample crs/transform coordinates")
    ds["label"].attrs.update(long_name="class index", ignore_index=CUBE_IGNORE_INDEX)
    return ds


def _blosc(cname: str, clevel: int):
    from zarr.codecs import BloscCodec

    return (BloscCodec(cname=cname, clevel=clevel, shuffle="shuffle"),)


# Image/label codecs, by the name `cryocube convert --compressor` takes. lz4 (default) compresses at
# ~1 GB/s per core, so conversion stays close to read speed; zstd is ~2x slower for ~10% smaller
# objects (worth it on object storage you pay for); none is for local scratch cubes read by GPUs.
COMPRESSORS: dict[str, Any] = {
    "lz4": lambda: _blosc("lz4", 5),
    "zstd": lambda: _blosc("zstd", 3),
    "none": lambda: None,
}


def encoding(layout: CubeLayout) -> dict[str, dict]:
    c, t = layout.n_bands, layout.tile
    if layout.compressor not in COMPRESSORS:
        raise UserError(f"unknown compressor {layout.compressor!r}; choose one of {', '.join(COMPRESSORS)}")
    fast = COMPRESSORS[layout.compressor]()
    enc = {
        "image": {"chunks": (1, c, t, t), "compressors": fast},
        "label": {"chunks": (1, t, t), "compressors": fast},
        "class_fraction": {"chunks": (layout.block_size, layout.n_classes)},
        "progress": {"chunks": (1,)},
        "block_digest": {"chunks": (1, DIGEST_BYTES)},
        "block_stats": {"chunks": (1, len(STATS), c)},
        "skip_reason": {"chunks": (layout.block_size,)},
    }
    if layout.shard_size:
        enc["image"]["shards"] = (layout.shard_size, c, t, t)
        enc["label"]["shards"] = (layout.shard_size, t, t)
    return enc


# -- opening ---------------------------------------------------------------------------------


def open_cube(url: str, storage_options: dict | None = None, allow_incomplete: bool = False) -> xr.Dataset:
    """The cube as an xarray Dataset (lazy). Refuses an incomplete cube unless asked."""
    if not _store.exists(url, storage_options):
        raise UserError(f"{url}: no cube here (no zarr.json)")
    st = _store.make_store(url, storage_options, read_only=True)
    ds = xr.open_zarr(st, decode_coords="all", consolidated=None, chunks={})
    if COMPLETE_ATTR not in ds.attrs and not allow_incomplete:
        raise IncompleteCubeError(
            f"{url}: cube is incomplete (no '{COMPLETE_ATTR}' marker); rerun `cryocube convert` with the same "
            "arguments to resume it"
        )
    return ds.drop_vars([v for v in INTERNAL_VARS if v in ds.variables])


def cube_checksum(block_digests: np.ndarray) -> str:
    """Content checksum of a cube: sha256 over the per-block digests, in block order."""
    return hashlib.sha256(np.ascontiguousarray(block_digests, dtype=np.uint8).tobytes()).hexdigest()


def block_digest(image: np.ndarray, label: np.ndarray) -> np.ndarray:
    """crc32 of the block's image and label bytes (big-endian), hashed without copying the pixels.

    crc32 runs at several GB/s where sha256 would cost a third of a plain read; it identifies
    content and catches corruption, and the cube checksum above is a sha256 over these.
    """
    crcs = [zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B")) for a in (image, label)]
    return np.frombuffer(struct.pack(">II", *crcs), dtype=np.uint8)


# -- statistics and finalisation --------------------------------------------------------------


def merge_moments(count: np.ndarray, mean: np.ndarray, m2: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge per-part (count, mean, M2) along axis 0 exactly (Chan et al.), in float64."""
    count, mean, m2 = (np.asarray(a, dtype=np.float64) for a in (count, mean, m2))
    n = count.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mu = np.where(n > 0, (count * np.where(count > 0, mean, 0.0)).sum(axis=0) / n, 0.0)
    dev = np.where(count > 0, mean - mu, 0.0)
    return n, mu, np.where(count > 0, m2, 0.0).sum(axis=0) + (count * dev * dev).sum(axis=0)


def _moments(px: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(count, mean, M2) per band of px (bands, pixels), with float32 pairwise sums where px is float32.

    Centring first (the corrected two-pass algorithm) keeps low-contrast bands exact, where a
    sum of squares would cancel; the mean is accumulated in float64.
    """
    n = px.shape[1]
    mean = px.sum(axis=1, dtype=np.float64) / n
    work = px.dtype if px.dtype.kind == "f" else np.float64
    d = px - mean.astype(work)[:, None]  # float32 stays float32; integer bands become float64
    off = d.sum(axis=1).astype(np.float64) / n  # the residue of centring on a rounded mean
    np.square(d, out=d)
    return n, mean, d.sum(axis=1).astype(np.float64) - n * off * off


def partial_stats(images: np.ndarray, labels: np.ndarray, use: np.ndarray) -> np.ndarray:
    """(len(STATS), bands) moments, min and max over valid (label != ignore) pixels of the samples in `use`.

    The map side of the train-split statistics: each block task computes its part while the pixels are
    in memory, so finalisation never reads the cube again. Per sample the work is a few vectorised
    passes over the pixels (no float64 copy); samples are merged exactly in float64.
    """
    c = images.shape[1]
    counts, means, m2s, mins, maxs = [], [], [], [], []
    for i in np.flatnonzero(use):
        v = labels[i] >= 0
        nv = int(np.count_nonzero(v))
        if nv == 0:
            continue
        px = images[i].reshape(c, -1) if nv == v.size else images[i][:, v]
        n, mean, m2 = _moments(px)
        counts.append(np.full(c, n))
        means.append(mean)
        m2s.append(m2)
        mins.append(px.min(axis=1))
        maxs.append(px.max(axis=1))
    out = np.zeros((len(STATS), c))
    out[3], out[4] = np.inf, -np.inf
    if counts:
        out[0], out[1], out[2] = merge_moments(np.array(counts), np.array(means), np.array(m2s))
        out[3], out[4] = np.min(mins, axis=0), np.max(maxs, axis=0)
    return out


def combine_stats(parts: np.ndarray) -> dict[str, np.ndarray]:
    """Reduce per-block partials (blocks, len(STATS), bands) to mean/std/min/max (population std)."""
    parts = np.asarray(parts, dtype=np.float64)
    count, mean, m2 = merge_moments(parts[:, 0], parts[:, 1], parts[:, 2])
    mn, mx = parts[:, 3].min(axis=0), parts[:, 4].max(axis=0)
    has = count > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        var = np.maximum(m2 / count, 0.0)
    return {"mean": np.where(has, mean, np.nan), "std": np.where(has, np.sqrt(var), np.nan),
            "min": np.where(has, mn, np.nan), "max": np.where(has, mx, np.nan), "count": count}


def finalize(url: str, storage_options: dict | None = None, extra_attrs: dict | None = None) -> dict:
    """Write strata, train statistics, checksum and (last) the completion marker.

    Idempotent: safe to call again on a complete cube or after a crash inside finalisation.
    """
    g = _store.open_group(url, "r+", storage_options)
    progress = np.asarray(g["progress"][:])
    missing = np.flatnonzero(progress == 0)
    if missing.size:
        raise IncompleteCubeError(f"{url}: {missing.size} of {progress.size} sample blocks not written yet (first: {missing[:5].tolist()})")
    cf = np.asarray(g["class_fraction"][:])
    g["stratum"][:] = stratum_keys(cf)
    reasons = as_text(g["skip_reason"][:])
    skipped = np.flatnonzero(reasons != "")
    if skipped.size:
        split = np.asarray(g["split"][:]).astype(object)
        split[skipped] = "skipped"
        g["split"][:] = split
    stats = combine_stats(np.asarray(g["block_stats"][:]))
    for k in ("mean", "std", "min", "max"):
        g[f"band_{k}"][:] = stats[k]
    checksum = cube_checksum(np.asarray(g["block_digest"][:]))
    source = as_text(g["source"][:])
    attrs = dict(extra_attrs or {})
    attrs["skipped_samples"] = [
        {"sample": int(i), "source": str(source[i]), "reason": str(reasons[i])} for i in skipped
    ]
    attrs["statistics_split"] = "train"
    attrs["statistics_valid_pixels"] = stats["count"].tolist()
    g.attrs.update(attrs)
    marker = {
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "n_samples": int(cf.shape[0]),
        "checksum": checksum,
        "schema_version": SCHEMA_VERSION,
    }
    g.attrs[COMPLETE_ATTR] = marker
    zarr.consolidate_metadata(g.store)
    return marker


# -- inspect ------------------------------------------------------------------------------------


def summary(url: str, storage_options: dict | None = None) -> str:
    """Human summary: samples per split, class balance, band stats beside the published ones, chunking, size."""
    ds = open_cube(url, storage_options, allow_incomplete=True)
    lines = []
    a = ds.attrs
    state = "complete" if COMPLETE_ATTR in a else "INCOMPLETE (resume with `cryocube convert`)"
    lines.append(f"cube {url}  [{state}]")
    lines.append(f"dataset {a.get('dataset')}: {a.get('title', '')}  layout={a.get('layout')}  schema v{a.get('schema_version')}")
    if COMPLETE_ATTR in a:
        lines.append(f"checksum {a[COMPLETE_ATTR]['checksum'][:16]}…  written {a[COMPLETE_ATTR]['time']}")
    split = as_text(ds["split"].values)
    names, counts = np.unique(split, return_counts=True)
    lines.append("samples: " + ", ".join(f"{n}={c}" for n, c in zip(names, counts)) + f" (total {split.size})")
    scenes = as_text(ds["scene"].values)
    lines.append(f"scenes: {len(np.unique(scenes))}  tile: {ds.sizes['y']}x{ds.sizes['x']}  bands: {ds.sizes['band']}  dtype: {ds['image'].dtype}")
    cf = ds["class_fraction"].values
    lines.append("class balance (mean area fraction per split):")
    for n in names:
        m = cf[split == n].mean(axis=0) if (split == n).any() else np.zeros(cf.shape[1])
        lines.append(f"  {n:<8} " + "  ".join(f"{c}={v:.3f}" for c, v in zip(ds["class"].values, m)))
    lines.append(f"{'band':<17}{'alias':<17}{'role':<11}{'mean':>12}{'pub.mean':>12}{'std':>12}{'pub.std':>12}{'min':>10}{'max':>10}")
    for i in range(ds.sizes["band"]):
        lines.append(
            f"{str(ds['band'].values[i]):<17}{str(ds['alias'].values[i]):<17}{str(ds['role'].values[i]):<11}"
            f"{ds['band_mean'].values[i]:>12.4g}{ds['published_mean'].values[i]:>12.4g}"
            f"{ds['band_std'].values[i]:>12.4g}{ds['published_std'].values[i]:>12.4g}"
            f"{ds['band_min'].values[i]:>10.4g}{ds['band_max'].values[i]:>10.4g}"
        )
    enc = ds["image"].encoding
    lines.append(f"image chunks {enc.get('chunks')} shards {enc.get('shards')}  size on disk {_store.size_on_disk(url, storage_options) / 1e6:.1f} MB")
    skipped = a.get("skipped_samples") or []
    if skipped:
        lines.append(f"skipped {len(skipped)} samples for bad input, e.g. {skipped[0]['source']}: {skipped[0]['reason']}")
    return "\n".join(lines)


def register(sub) -> None:
    p = sub.add_parser("inspect", help="summarise a cube, or print a model/dataset band-matching table")
    p.add_argument("url", nargs="?", help="cube path or URL")
    p.add_argument("--bands", nargs=2, metavar=("MODEL", "DATASET"), help="band-matching table of MODEL on DATASET (catalog id or cube URL)")
    p.add_argument("--cross-sensor", action="store_true", help="with --bands: the cross-sensor rule (SAR/grey into RGB)")
    p.add_argument("--storage-options", type=json.loads, default=None, help="JSON fsspec options for remote URLs")
    p.set_defaults(func=_inspect_cmd)


def _inspect_cmd(args) -> int:
    if args.bands:
        from .models import bands_table

        model, dataset = args.bands
        print(bands_table(model, dataset, "cross_sensor" if args.cross_sensor else "protocol"))
        return 0
    if not args.url:
        raise UserError("inspect needs a cube URL or --bands MODEL DATASET")
    print(summary(args.url, args.storage_options))
    return 0
