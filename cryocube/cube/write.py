"""Writing a cube: the template that fixes its metadata, its encoding, and finalisation (marker last)."""
from __future__ import annotations

import datetime as _dt
from typing import Any

import numpy as np
import xarray as xr
import zarr

from .. import store as _store
from ..catalog import CUBE_IGNORE_INDEX, DatasetSpec
from ..errors import UserError
from .digests import cube_checksum
from .schema import (COMPLETE_ATTR, COMPRESSORS, DIGEST_BYTES, SCHEMA_VERSION, STATS, CubeLayout, IncompleteCubeError,
                     _text, as_text)
from .stats import combine_stats, stratum_keys

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
