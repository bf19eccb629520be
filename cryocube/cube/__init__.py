"""The cube: every write and read of a cube goes through this package; what a protocol needs to pick
samples and normalise lives in coordinates, so no label is read to plan a run."""

from .check import verify
from .describe import summary
from .digests import digest_vars
from .ids import check_unique_ids, derive_sample_ids, sample_ids
from .read import (
    CubeInfo,
    SampleCube,
    TileCube,
    cube_info,
    open_cube,
    open_view,
    read_checked,
    read_dense,
    read_samples,
)
from .schema import (
    COMPLETE_ATTR,
    COMPRESSORS,
    PLAN_ATTR,
    SAMPLE_VARS,
    SCHEMA_VERSION,
    DamagedCubeError,
    IncompleteCubeError,
    _text,
    as_text,
    declared,
)
from .stats import combine_stats, partial_stats, stratum_keys
from .write import SamplePlan

__all__ = [
    "_text",  # attrs as text, for the readers that build sample cubes
    "COMPLETE_ATTR",
    "COMPRESSORS",
    "PLAN_ATTR",
    "SAMPLE_VARS",
    "SCHEMA_VERSION",
    "CubeInfo",
    "DamagedCubeError",
    "IncompleteCubeError",
    "SampleCube",
    "SamplePlan",
    "TileCube",
    "as_text",
    "check_unique_ids",
    "combine_stats",
    "cube_info",
    "declared",
    "derive_sample_ids",
    "digest_vars",
    "open_cube",
    "open_view",
    "partial_stats",
    "read_checked",
    "read_dense",
    "read_samples",
    "sample_ids",
    "stratum_keys",
    "summary",
    "verify",
]
