"""What a cube is: its schema version and markers (complete only once `cryocube_complete` is
written, last), its codecs, its declared sample-cube variables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# re-exported: cryocube.cube names them
from ..errors import DamagedCubeError, IncompleteCubeError  # noqa: F401

# 2: block moments, crc32 block digests; 3: per-sample digests checked on read (same checksum)
SCHEMA_VERSION = 3
COMPLETE_ATTR = "cryocube_complete"
PLAN_ATTR = "cryocube_plan"
INTERNAL_VARS = ("progress", "block_digest", "block_stats", "skip_reason", "sample_digest")
STATS = ("count", "mean", "m2", "min", "max")  # per-block moments (Chan et al.), merged at finalize
# the band coordinates every cube carries -> the catalog Band field each holds
BAND_COORDS = {
    "band": "name",
    **{f: f for f in ("alias", "role", "wavelength_um", "sensor", "units")},
    "published_mean": "mean",
    "published_std": "std",
}


def as_text(a) -> np.ndarray:
    """Strings read back from zarr/xarray as an object array of str."""
    return np.array([str(v) for v in np.asarray(a).ravel()], dtype=object).reshape(np.shape(a))


def _text(values) -> np.ndarray:
    """Strings as object arrays: zarr v3 stores them as variable-length UTF-8 (a specified type)."""
    return np.array([str(v) for v in values], dtype=object)


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


# -- what a sample cube may hold beyond image, target and the band coordinates ---------------------


@dataclass(frozen=True)
class Var:
    """One declared sample-cube variable: its dims, and its default where a cube lacks it."""

    dims: tuple[str, ...]
    default: Any = None  # None: no default (the typed view gives None where the cube lacks it)
    coord: bool = True  # False: a data variable covered by the sample digests (read checked)


# The interferogram sample cube (docs/insar-cube.md): readers build these by name (`declared`), the
# typed view (`read.SampleCube`) reads them back with these defaults (SSL4EO cubes have none).
SAMPLE_VARS: dict[str, Var] = {
    "frame": Var(("sample",), ""),  # the frame (track) folder of a pair; "" when pairs lie flat
    "primary_date": Var(("sample",), "?"),  # ISO dates of the pair
    "secondary_date": Var(("sample",), "?"),
    "radar_wavelength_m": Var(("sample",), np.nan),
    # valid extent of each sample (smaller ones are padded bottom/right); default: the cube's
    "height": Var(("sample",)),
    "width": Var(("sample",)),
    "crs": Var(("sample",), ""),
    "transform": Var(("sample", "affine")),
    "box_origin": Var(("sample",), ""),  # annotation | derived | none
    "mask_origin": Var(("sample",), ""),  # MASK_ORIGINS of convert/insar.py
    # labelled pixels per mask class: what planning reads, not the mask
    "mask_pixels": Var(("sample", "mask_class")),
    "mask_class": Var(("mask_class",)),
    "task_classes": Var(("task",), ""),  # "a|b|c": class names of a cls target ("": none)
    "text_task": Var(("text_task",)),
    "corner": Var(("corner",)),
    "box": Var(("sample", "corner"), coord=False),  # the deformation box in pixels (NaN: none)
    "answer": Var(("sample", "text_task"), coord=False),  # reference free-text answers ("" = none)
    # per-pixel deformation target (int8; MASK_IGNORE = no label)
    "mask": Var(("sample", "y", "x"), coord=False),
}


def declared(values: dict[str, Any]) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """(coords, data_vars) from {name: values} by `SAMPLE_VARS`; a wrong one fails here."""
    coords, data_vars = {}, {}
    for name, v in values.items():
        if name not in SAMPLE_VARS:
            raise KeyError(
                f"sample-cube variable {name!r} is not declared in cube.schema.SAMPLE_VARS"
            )
        var = SAMPLE_VARS[name]
        if np.ndim(v) != len(var.dims):
            raise ValueError(
                f"sample-cube variable {name!r}: {np.ndim(v)}-D values for dims {var.dims}"
            )
        (coords if var.coord else data_vars)[name] = (var.dims, v)
    return coords, data_vars
