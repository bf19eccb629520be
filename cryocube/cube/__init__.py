"""The cube: every write and read of a cube goes through this package.

Everything a protocol needs to pick samples (split, scene, tile position, stratum, class fractions)
and to normalise (train-split band statistics) lives in coordinates, so no label is read to plan a
run. Modules: `schema` (markers, layout, codecs, errors), `ids`, `digests`, `stats` (moments,
strata), `write`, `read` (open, plan facts, checked reads), `check` (verify), `describe`.
"""

from .check import VerifyReport, verify
from .describe import summary
from .digests import (
    block_digest,
    crc32_concat,
    cube_checksum,
    digest_rows,
    digest_vars,
    sample_digests,
)
from .ids import check_unique_ids, derive_sample_ids, sample_ids
from .read import (
    _GROUPS,
    CubeInfo,
    CubeView,
    SampleCube,
    TileCube,
    cube_info,
    not_a_cube,
    open_cube,
    open_view,
    read_checked,
    read_dense,
    read_samples,
)
from .schema import (
    COMPLETE_ATTR,
    COMPRESSORS,
    DIGEST_BYTES,
    INTERNAL_VARS,
    PLAN_ATTR,
    SAMPLE_VARS,
    SCHEMA_VERSION,
    STATS,
    CubeLayout,
    DamagedCubeError,
    IncompleteCubeError,
    _text,
    as_text,
    declared,
)
from .stats import combine_stats, merge_moments, partial_stats, stratum_keys
from .write import (
    ConvertResult,
    SamplePlan,
    WriteOptions,
    create,
    encoding,
    finalize,
    put_block,
    sample_template,
    template,
    tile_template,
)

__all__ = [
    "_GROUPS",  # the store groups a cube holds (tests check a store round-trip against them)
    "_text",  # attrs as text, for the readers that build sample cubes
    "COMPLETE_ATTR",
    "COMPRESSORS",
    "ConvertResult",
    "DIGEST_BYTES",
    "INTERNAL_VARS",
    "PLAN_ATTR",
    "SCHEMA_VERSION",
    "STATS",
    "CubeInfo",
    "CubeLayout",
    "DamagedCubeError",
    "IncompleteCubeError",
    "VerifyReport",
    "as_text",
    "block_digest",
    "check_unique_ids",
    "combine_stats",
    "crc32_concat",
    "cube_checksum",
    "cube_info",
    "derive_sample_ids",
    "digest_rows",
    "digest_vars",
    "encoding",
    "finalize",
    "merge_moments",
    "not_a_cube",
    "open_cube",
    "partial_stats",
    "read_checked",
    "read_dense",
    "read_samples",
    "sample_digests",
    "sample_ids",
    "stratum_keys",
    "summary",
    "template",
    "verify",
    "WriteOptions",
    "CubeView",
    "SampleCube",
    "TileCube",
    "open_view",
    "SAMPLE_VARS",
    "declared",
    "SamplePlan",
    "create",
    "put_block",
    "sample_template",
    "tile_template",
]
