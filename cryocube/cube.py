"""The cube: one Zarr v3 group per dataset, `image(sample, band, y, x)` + `label(sample, y, x)`.

Everything a protocol needs to pick samples (split, scene, tile position, stratum, class fractions)
and to normalise (train-split band statistics) lives in coordinates, so no label has to be read to
plan a run. A cube is complete only when the `cryocube_complete` attribute exists; it is written last.
Every sample carries the crc32 of its image and label bytes (`sample_digest`), checked whenever a task
reads it: a deleted or damaged chunk is an error naming the sample, never fill values.
"""
from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import math
import struct
import warnings
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr
import zarr

from . import store as _store
from .catalog import CUBE_IGNORE_INDEX, Band, DatasetSpec
from .errors import DamagedCubeError, IncompleteCubeError, UserError

SCHEMA_VERSION = 3  # 2: block moments, crc32 block digests; 3: per-sample digests checked on read (same checksum)
COMPLETE_ATTR = "cryocube_complete"
PLAN_ATTR = "cryocube_plan"
INTERNAL_VARS = ("progress", "block_digest", "block_stats", "skip_reason", "sample_digest")
STATS = ("count", "mean", "m2", "min", "max")  # per-block moments (Chan et al.), merged at finalize
DIGEST_BYTES = 8  # crc32 of the block's image bytes, then of its label bytes


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
            "sample_digest": (("sample", "part"), da.zeros((n, 2), dtype="uint32", chunks=(layout.block_size, 2))),
        },
        coords={
            "split": ("sample", _text(coords["split"])),
            "scene": ("sample", _text(coords["scene"])),
            "tile_y": ("sample", coords["tile_y"].astype("int32")),
            "tile_x": ("sample", coords["tile_x"].astype("int32")),
            "source": ("sample", _text(coords["source"])),
            "sample_id": ("sample", _text(coords["sample_id"])),
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
        "sample_digest": {"chunks": (layout.block_size, 2)},
        "skip_reason": {"chunks": (layout.block_size,)},
    }
    if layout.shard_size:
        enc["image"]["shards"] = (layout.shard_size, c, t, t)
        enc["label"]["shards"] = (layout.shard_size, t, t)
    return enc


# -- sample identity -----------------------------------------------------------------------------


def derive_sample_ids(source, split, tile_y, tile_x) -> np.ndarray:
    """One id per tile sample: the source file's stem where the source is one tile, `<stem>__<row>_<col>`
    (the tile's pixel offset) where a scene is cut into several, and `<split>/<id>` where one stem is in
    two split folders. Tiles of one scene share their `source`, so the source alone would merge them."""
    import collections
    import posixpath

    source, split = as_text(source), as_text(split)
    ty, tx = np.asarray(tile_y).astype(int), np.asarray(tile_x).astype(int)
    stem = [posixpath.splitext(s)[0] for s in source]
    tiles = collections.Counter(zip(split, source))
    ids = [st if tiles[(sp, so)] == 1 else f"{st}__{y}_{x}" for st, sp, so, y, x in zip(stem, split, source, ty, tx)]
    splits_of: dict[str, set] = collections.defaultdict(set)
    for i, sp in zip(ids, split):
        splits_of[i].add(sp)
    return _text(f"{sp}/{i}" if len(splits_of[i]) > 1 else i for i, sp in zip(ids, split))


def check_unique_ids(ids, where: str, fix: str = "convert the cube again") -> np.ndarray:
    """The ids, or a UserError naming the first repeated ones (a repeated id would merge samples)."""
    ids = as_text(ids)
    names, first, counts = np.unique(ids, return_index=True, return_counts=True)
    if (counts > 1).any():
        rep = names[counts > 1]
        show = ", ".join(f"{r!r} (samples {np.flatnonzero(ids == r)[:3].tolist()})" for r in rep[:3])
        raise UserError(f"{where}: {rep.size} sample id(s) are used more than once, e.g. {show}; "
                        f"ids must be unique ({fix})")
    return ids


def sample_ids(ds: xr.Dataset, url: str) -> np.ndarray:
    """The cube's per-sample ids, the one source of sample identity for embeddings, CSVs and probe tasks.

    Cubes store them (`sample_id`); a cube written before that has them derived from `source` and the
    tile position (said once per cube: they equal what a new conversion stores)."""
    if "sample_id" in ds.variables:
        return check_unique_ids(ds["sample_id"].values, url)
    if ds.attrs.get("kind") == "samples":  # sample cubes: `source` is the location id
        return check_unique_ids(ds["source"].values, url)
    if url not in _IDS_WARNED:
        import warnings

        _IDS_WARNED.add(url)
        warnings.warn(f"{url}: this cube has no stored sample ids (written before they existed); they are derived from "
                      "source and tile position (<stem>__<row>_<col>), as a new `cryocube convert` stores them", stacklevel=2)
    return check_unique_ids(derive_sample_ids(ds["source"].values, ds["split"].values, ds["tile_y"].values,
                                              ds["tile_x"].values), url)


_IDS_WARNED: set[str] = set()


# -- opening ---------------------------------------------------------------------------------


def open_cube(url: str, storage_options: dict | None = None, allow_incomplete: bool = False) -> xr.Dataset:
    """The cube as an xarray Dataset (lazy). Refuses an incomplete cube unless asked."""
    if not _store.exists(url, storage_options):
        raise UserError(not_a_cube(url, storage_options))
    st = _store.make_store(url, storage_options, read_only=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ds = xr.open_zarr(st, decode_coords="all", consolidated=None, chunks={})
        except (KeyError, ValueError, TypeError):  # a Zarr group of another kind (an embedding store, someone's data)
            raise UserError(not_a_cube(url, storage_options)) from None
    for w in caught:  # xarray's own warnings about a cube, not about what turned out to be no cube
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if "schema_version" not in ds.attrs:
        raise UserError(not_a_cube(url, storage_options))
    if COMPLETE_ATTR not in ds.attrs and not allow_incomplete:
        raise IncompleteCubeError(
            f"{url}: cube is incomplete (no '{COMPLETE_ATTR}' marker); rerun `cryocube convert` with the same "
            "arguments to resume it"
        )
    return ds.drop_vars([v for v in INTERNAL_VARS if v in ds.variables])


def not_a_cube(url: str, storage_options: dict | None = None) -> str:
    """Why `url` is no cube, in one sentence: nothing there, a results folder, an embedding store, other data."""
    if _store.exists(url, storage_options):
        attrs = dict(_store.open_group(url, "r", storage_options).attrs)
        if "cryocube_embedding_complete" in attrs or "embedding_sha256" in attrs:
            return f"{url}: no cube here: it is an embedding store (`cryocube embed`); `cryocube probe {url}` scores it"
        return f"{url}: no cube here: a Zarr group that cryocube did not write as a cube (no schema_version attribute)"
    if _store.file_exists(_store.join(url, "results.jsonl"), storage_options):
        return f"{url}: no cube here: it is a results folder (results.jsonl); `cryocube report {url} --out DIR` summarises it"
    fs, path = _store.fs_path(url, storage_options)
    if fs.exists(path):
        return f"{url}: no cube here (a folder without zarr.json)"
    return f"{url}: no cube here (no such file or folder)"


def cube_checksum(block_digests: np.ndarray) -> str:
    """Content checksum of a cube: sha256 over the per-block digests, in block order."""
    return hashlib.sha256(np.ascontiguousarray(block_digests, dtype=np.uint8).tobytes()).hexdigest()


def _crc(a: np.ndarray) -> int:
    return zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"))


def sample_digests(images: np.ndarray, labels: np.ndarray, *extras: np.ndarray) -> np.ndarray:
    """(n, 2 + len(extras)) uint32: crc32 of each sample's image bytes, of its label bytes and of its row of
    each extra per-sample variable (`digest_rows`), hashed without copies.

    crc32 runs at ~2 GB/s here, where sha256 would cost a third of a plain read; it identifies
    content and catches corruption, and is cheap enough to check on every read.
    """
    parts = (images, labels, *(digest_rows(x) for x in extras))
    return np.array([tuple(_crc(p[i]) for p in parts) for i in range(len(images))], dtype=np.uint32).reshape(-1, len(parts))


def digest_rows(values: np.ndarray) -> np.ndarray:
    """A per-sample variable as equal-sized byte rows: numbers as stored; text as the crc32 of each string
    (UTF-8), so a variable-length answer still has a fixed-size row for the block digest."""
    a = np.asarray(values)
    if a.dtype.kind in "OUT":
        a = np.array([zlib.crc32(str(v).encode()) for v in a.ravel()], dtype=np.uint32).reshape(a.shape)
    return np.ascontiguousarray(a).reshape(len(a), -1)


def digest_vars(g) -> tuple[str, ...]:
    """The per-sample variables a cube's `sample_digest` covers after image and label/target, in part order
    (sample cubes written before extras were digested have none)."""
    return tuple(g.attrs.get("digest_vars") or ())


def _gf2_times(mat: list[int], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


@functools.lru_cache(maxsize=64)
def _crc_shift(nbytes: int) -> tuple[int, ...]:
    """The GF(2) operator that advances a crc32 over `nbytes` zero bytes (zlib's crc32_combine, precomputed
    once per sample size, so combining a block's sample digests costs a few dozen operations each)."""
    op = [0xEDB88320] + [1 << (n - 1) for n in range(1, 32)]  # one zero bit
    for _ in range(3):  # eight zero bits: one byte
        op = [_gf2_times(op, op[n]) for n in range(32)]
    result: list[int] | None = None
    while nbytes:
        if nbytes & 1:
            result = op if result is None else [_gf2_times(op, result[n]) for n in range(32)]
        nbytes >>= 1
        if nbytes:
            op = [_gf2_times(op, op[n]) for n in range(32)]
    return tuple(result if result is not None else [1 << n for n in range(32)])


def crc32_concat(crcs, nbytes: int) -> int:
    """crc32 of the concatenation of equal-sized parts, from the parts' own crc32s."""
    op, out = _crc_shift(nbytes), 0
    for c in crcs:
        out = _gf2_times(op, out) ^ int(c)
    return out


def block_digest(digests: np.ndarray, *part_nbytes: int) -> np.ndarray:
    """4 bytes per digest part (image, label, then a sample cube's extra variables): the crc32 of the block's
    bytes of that part (big-endian), combined from the samples' digests (so identical to hashing the block
    whole; 8 bytes for image + label). The cube checksum is a sha256 over these."""
    d = np.asarray(digests, dtype=np.uint32).reshape(-1, len(part_nbytes))
    crcs = [crc32_concat(d[:, k], n) for k, n in enumerate(part_nbytes)]
    return np.frombuffer(struct.pack(f">{len(crcs)}I", *crcs), dtype=np.uint8)


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


def _tile_summary(ds, split, names) -> list[str]:
    lines = []
    scenes = as_text(ds["scene"].values)
    lines.append(f"scenes: {len(np.unique(scenes))}  tile: {ds.sizes['y']}x{ds.sizes['x']}  bands: {ds.sizes['band']}  dtype: {ds['image'].dtype}")
    cf = ds["class_fraction"].values
    lines.append("class balance (mean area fraction per split):")
    for n in names:
        m = cf[split == n].mean(axis=0) if (split == n).any() else np.zeros(cf.shape[1])
        lines.append(f"  {n:<8} " + "  ".join(f"{c}={v:.3f}" for c, v in zip(ds["class"].values, m)))
    return lines


def _sample_summary(ds) -> list[str]:
    """Sample cubes: image shape, labelled samples per task, text answers, what the cube cannot serve."""
    lines = [f"image {dict(ds['image'].sizes)}  dtype: {ds['image'].dtype}"]
    target = np.asarray(ds["target"].values)
    for j, (t, k) in enumerate(zip(as_text(ds["task"].values), as_text(ds["task_type"].values))):
        lines.append(f"  task {t} ({k}): {int(np.isfinite(target[:, j]).sum())} labelled")
    if "answer" in ds:
        ans = as_text(ds["answer"].values)
        for j, t in enumerate(as_text(ds["text_task"].values)):
            lines.append(f"  text {t}: {int((ans[:, j] != '').sum())} answers")
    if "box" in ds:
        lines.append(f"  box: {int(np.isfinite(np.asarray(ds['box'].values)).all(axis=1).sum())} samples with a box")
    if "mask_origin" in ds:  # the per-pixel deformation target (segmentation): where each sample's came from
        origin = as_text(ds["mask_origin"].values)
        lines.append("  mask (per pixel): " + ", ".join(f"{o} {int((origin == o).sum())}" for o in sorted(set(origin.tolist()))))
    for t, why in (ds.attrs.get("unavailable") or {}).items():
        lines.append(f"  unavailable {t}: {why}")
    return lines


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
    if a.get("kind") == "samples":
        lines += _sample_summary(ds)
    else:
        lines += _tile_summary(ds, split, names)
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


# -- reading (tasks) ------------------------------------------------------------------------------


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
    kind: str = "tiles"  # "tiles" (dense labels) | "samples" (image-level task targets, e.g. SSL4EO-downstream)
    time: tuple[str, ...] = ()  # time steps of multi-temporal sample cubes
    tasks: tuple[tuple[str, str], ...] = ()  # sample cubes: (task, cls|regr)

    def samples(self, split: str) -> np.ndarray:
        return np.flatnonzero(self.splits == split)

    @property
    def n_samples(self) -> int:
        return int(self.splits.size)


def cube_info(url: str, storage_options: dict | None = None) -> CubeInfo:
    """Metadata of a complete cube (refuses incomplete ones before any work starts)."""
    _store.register_options(url, storage_options)
    ds = open_cube(url)
    b = ds["band"]
    bands = tuple(
        Band(name=str(n), alias=str(a), role=str(r), wavelength_um=float(w), sensor=str(s), units=str(u),
             mean=float(pm), std=float(ps))
        for n, a, r, w, s, u, pm, ps in zip(b.values, ds["alias"].values, ds["role"].values, ds["wavelength_um"].values,
                                           ds["sensor"].values, ds["units"].values, ds["published_mean"].values,
                                           ds["published_std"].values)
    )
    common = dict(
        url=url, dataset=str(ds.attrs["dataset"]), checksum=str(ds.attrs[COMPLETE_ATTR]["checksum"]),
        schema_version=int(ds.attrs[COMPLETE_ATTR].get("schema_version", ds.attrs.get("schema_version", 0))),
        tile=int(ds.sizes["y"]), bands=bands, splits=as_text(ds["split"].values),
        mean=ds["band_mean"].values.astype(float), std=ds["band_std"].values.astype(float),
        published_mean=ds["published_mean"].values.astype(float), published_std=ds["published_std"].values.astype(float),
    )
    if ds.attrs.get("kind") == "samples":
        target = np.asarray(ds["target"].values)
        return CubeInfo(**common, class_names=[], strata=common["splits"], labelled=np.isfinite(target).any(axis=1),
                        kind="samples", time=tuple(as_text(ds["time"].values)) if "time" in ds.coords else (),
                        tasks=tuple(zip(as_text(ds["task"].values), as_text(ds["task_type"].values))))
    return CubeInfo(**common, class_names=[str(c) for c in ds["class"].values], strata=as_text(ds["stratum"].values),
                    labelled=np.asarray(ds["class_fraction"].values).sum(axis=1) > 0)


_GROUPS: dict[str, zarr.Group] = {}  # per process: read-only groups of cubes tasks read from
_WARNED: set[str] = set()


def _group(url: str) -> zarr.Group:
    g = _GROUPS.get(url)
    if g is None:
        g = _GROUPS[url] = _store.open_group(url, "r")
        if "sample_digest" not in g and url not in _WARNED:
            import warnings

            _WARNED.add(url)
            warnings.warn(f"{url}: cube schema v{g.attrs.get('schema_version')} has no per-sample digests, so damaged chunks "
                          "cannot be detected when it is read; convert it again with --overwrite", stacklevel=3)
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


def read_samples(url: str, idx, labels: bool = True, verify: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """image (n, C, T, T) and label (n, T, T) of the given sample indices, in that order, checked against
    their digests: a missing or damaged chunk raises DamagedCubeError naming the sample. Sample cubes
    give image (n, time, C, H, W) and their task targets (n, tasks) in place of the label."""
    g = _group(url)
    var = "target" if g.attrs.get("kind") == "samples" else "label"
    idx = np.asarray(idx, dtype=np.int64)
    try:
        img = _select(g["image"], idx)
        lab = _select(g[var], idx) if labels or verify else None
    except Exception as e:  # a truncated chunk fails in its codec (blosc/zstd), or the store read fails
        for i in idx:  # find the sample at fault
            try:
                g["image"][int(i)]
                g[var][int(i)]
            except Exception:  # noqa: BLE001
                raise DamagedCubeError(f"{_where(g, url, int(i))}: its stored chunk cannot be read ({type(e).__name__}: "
                                       f"{e}); the cube is damaged: run `cryocube inspect --verify {url}`") from None
        raise
    if verify and "sample_digest" in g:
        want = _select(g["sample_digest"], idx)[:, :2]  # image and label/target (a sample cube's extras follow)
        got = sample_digests(img, lab)
        bad = np.flatnonzero((got != want).any(axis=1))
        if bad.size:
            i = int(idx[bad[0]])
            what = "image" if got[bad[0], 0] != want[bad[0], 0] else "label"
            raise DamagedCubeError(f"{_where(g, url, i)}: its {what} does not match the digest written at conversion "
                                   f"(a chunk was deleted, truncated or altered; {bad.size} of {idx.size} samples read are "
                                   f"damaged); run `cryocube inspect --verify {url}`, then convert again")
    return img, (lab if labels else None)


def read_checked(url: str, name: str, idx=None) -> np.ndarray:
    """A per-sample variable of a sample cube (`target`, or an extra its digests cover: `box`, `answer`, `mask`),
    whole or at the sample indices `idx`, checked against the digests written at conversion: a deleted or
    damaged chunk raises DamagedCubeError naming the sample and the variable, never fill values. Variables
    no digest covers are read as stored."""
    g = _group(url)
    sel = np.arange(g[name].shape[0]) if idx is None else np.asarray(idx, dtype=np.int64)
    try:
        values = np.asarray(g[name][:]) if idx is None else _select(g[name], sel)
    except Exception as e:  # noqa: BLE001 - a chunk that fails in its codec, or a failing store read
        raise DamagedCubeError(f"{url}: variable {name!r} cannot be read ({type(e).__name__}: {e}); the cube is damaged: "
                               f"run `cryocube inspect --verify {url}`") from None
    parts = ("target", *digest_vars(g))
    if name in parts and "sample_digest" in g:
        want = _select(g["sample_digest"], sel)[:, 1 + parts.index(name)]
        bad = np.flatnonzero(np.array([_crc(r) for r in digest_rows(values)], dtype=np.uint32) != want)
        if bad.size:
            raise DamagedCubeError(f"{_where(g, url, int(sel[bad[0]]))}: its {name} does not match the digest written at "
                                   f"conversion (a chunk was deleted, truncated or altered; {bad.size} of {len(values)} "
                                   f"samples read are damaged); run `cryocube inspect --verify {url}`, then convert again")
    return values


def read_dense(url: str, idx) -> tuple[np.ndarray, np.ndarray]:
    """image (n, C, H, W) and a dense int16 label (n, H, W) of any cube: a tile cube's `label`, or a sample cube's
    per-pixel `mask` (interferograms' deformation target), each checked against the digests."""
    g = _group(url)
    if g.attrs.get("kind") != "samples":
        return read_samples(url, idx)
    if "mask" not in g:
        raise UserError(f"{url}: this sample cube has no per-pixel target (`mask`), so it cannot be segmented")
    img, _ = read_samples(url, idx, labels=False)
    return img, read_checked(url, "mask", idx).astype(np.int16)


@dataclass
class VerifyReport:
    url: str
    n_samples: int
    damaged: list[dict]  # {"sample", "source", "what"}
    checksum_ok: bool
    digests: bool  # False: a cube without per-sample digests (blocks only)

    @property
    def ok(self) -> bool:
        return not self.damaged and self.checksum_ok


def verify(url: str, storage_options: dict | None = None, progress: bool = True) -> VerifyReport:
    """Read every sample and check it against its digest, every block against its block digest and the
    block digests against the cube checksum (`cryocube inspect --verify`)."""
    from .progress import progress_bar

    _store.register_options(url, storage_options)
    if not _store.exists(url, storage_options):
        raise UserError(not_a_cube(url, storage_options))
    g = _store.open_group(url, "r")
    if "schema_version" not in g.attrs:
        raise UserError(not_a_cube(url, storage_options))
    if COMPLETE_ATTR not in g.attrs:
        raise IncompleteCubeError(f"{url}: cube is incomplete (no '{COMPLETE_ATTR}' marker); nothing to verify yet")
    n = g["image"].shape[0]
    # what the per-sample digests cover, in part order: the image, the label (target), a sample cube's extras
    parts = ("image", "target" if g.attrs.get("kind") == "samples" else "label", *digest_vars(g))
    bs = int(g.attrs.get("block_samples") or 16)
    has = "sample_digest" in g
    stored_blocks = np.asarray(g["block_digest"][:])
    sources = as_text(g["source"][:])
    damaged: list[dict] = []
    computed = []
    with progress_bar(f"verify {url}", n, progress) as bar:
        for b in range(stored_blocks.shape[0]):
            s0, s1 = b * bs, min((b + 1) * bs, n)
            try:
                arrs = [np.asarray(g[v][s0:s1]) for v in parts]
            except Exception:  # noqa: BLE001 - find the samples (and variables) whose chunk cannot be decoded
                arrs = None
            if arrs is None:
                for i in range(s0, s1):
                    for v in parts:
                        try:
                            g[v][i]
                        except Exception as e:  # noqa: BLE001
                            damaged.append({"sample": i, "source": str(sources[i]), "what": f"{v} unreadable ({type(e).__name__})"})
                computed.append(np.zeros(stored_blocks.shape[1], np.uint8))
                bar.advance(s1 - s0)
                continue
            got = sample_digests(*arrs)
            if has:
                want = np.asarray(g["sample_digest"][s0:s1])
                for k in np.flatnonzero((got != want).any(axis=1)):
                    what = ", ".join(v for v, a, w in zip(parts, got[k], want[k]) if a != w)
                    damaged.append({"sample": s0 + int(k), "source": str(sources[s0 + k]), "what": f"{what} digest mismatch"})
            blk = block_digest(got, *(digest_rows(a)[0].nbytes for a in arrs))
            if not np.array_equal(blk, stored_blocks[b]) and not has:
                damaged.append({"sample": s0, "source": str(sources[s0]), "what": f"block {b} ({s0}..{s1 - 1}) digest mismatch"})
            computed.append(blk)
            bar.advance(s1 - s0)
    checksum_ok = cube_checksum(np.array(computed)) == g.attrs[COMPLETE_ATTR]["checksum"]
    return VerifyReport(url, n, damaged, checksum_ok, has)
