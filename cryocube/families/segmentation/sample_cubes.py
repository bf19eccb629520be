"""Sample cubes with a per-pixel target (interferograms' `mask`) seen as tile cubes."""

from __future__ import annotations

import dataclasses

import numpy as np

from ...cube import CubeInfo, open_cube
from ...errors import UserError
from ..split import sample_split


def as_tiles(cube: CubeInfo) -> tuple[CubeInfo, dict]:
    """(the cube with the drawn split, mask classes, labelled samples; the split's record)."""
    ds = open_cube(cube.url)
    if "mask" not in ds or "mask_pixels" not in ds or not isinstance(ds.attrs.get("mask"), dict):
        raise UserError(
            f"{cube.url}: a {cube.kind} cube without a per-pixel target (image-level tasks only)"
            " cannot be segmented; score it with `cryocube embed` + `cryocube probe`, or"
            " --protocol probe (interferogram cubes converted by this cryocube have one: convert"
            " again with --overwrite)"
        )
    if ds.sizes["y"] != ds.sizes["x"]:
        raise UserError(
            f"{cube.url}: samples are {ds.sizes['y']}x{ds.sizes['x']} px; the segmentation family"
            " cuts square tiles, so it needs square samples"
        )
    opts = dict(ds.attrs["mask"])
    labelled = np.asarray(ds["mask_pixels"].values).sum(axis=1) > 0  # any pixel not ignore
    splits, strata, record = sample_split(ds, cube.checksum)
    tiles = dataclasses.replace(
        cube,
        tile=int(ds.sizes["y"]),
        splits=splits,
        strata=strata,
        class_names=[str(c) for c in opts["classes"]],
        labelled=labelled,
    )
    return tiles, record
