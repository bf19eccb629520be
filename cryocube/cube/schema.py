"""What a cube is: its schema version and markers, its layout facts, its codecs, its two errors.

One Zarr v3 group per dataset. A tile cube holds `image(sample, band, y, x)` + `label(sample, y, x)`; a sample
cube (`kind: samples`) holds whole images and image-level `target(sample, task)`. A cube is complete only when
the `cryocube_complete` attribute exists; it is written last.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import UserError

SCHEMA_VERSION = 3  # 2: block moments, crc32 block digests; 3: per-sample digests checked on read (same checksum)
COMPLETE_ATTR = "cryocube_complete"
PLAN_ATTR = "cryocube_plan"
INTERNAL_VARS = ("progress", "block_digest", "block_stats", "skip_reason", "sample_digest")
STATS = ("count", "mean", "m2", "min", "max")  # per-block moments (Chan et al.), merged at finalize
DIGEST_BYTES = 8  # crc32 of the block's image bytes, then of its label bytes


class DamagedCubeError(UserError):
    """A cube's stored pixels do not match their digests: a chunk was deleted, truncated or altered."""


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
