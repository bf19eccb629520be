"""Sample cubes with a per-pixel target (interferograms' deformation `mask`) seen as tile cubes by this family.

A sample cube has no train/val/test split ("all") and no class fractions; this module draws the split once per
cube (seeded by its checksum, fractions from the cube's `mask` attrs, which the dataset catalog set), stratified
by deformation box / none / unlabelled so the test split holds boxes to score, and says so in the record.
"""
from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from ...cube import CubeInfo, as_text, open_cube
from ...errors import UserError

STRATA = ("deformation", "no deformation", "unlabelled")


def draw_split(strata: np.ndarray, fractions: dict[str, float], seed: int) -> np.ndarray:
    """Per stratum (shuffled by `seed`): round(n * fraction) samples to test and to val (at least one each from a
    stratum of >= 3 samples, none from a smaller one or from unlabelled samples), the rest to train."""
    out = np.full(strata.size, "train", dtype=object)
    rng = np.random.default_rng(seed)
    for s in STRATA:
        members = rng.permutation(np.flatnonzero(strata == s))
        if s == "unlabelled" or members.size < 3:
            continue
        n_test = max(1, round(members.size * fractions["test"]))
        n_val = max(1, round(members.size * fractions["val"]))
        n_val = min(n_val, members.size - n_test - 1)
        out[members[:n_test]] = "test"
        out[members[n_test : n_test + n_val]] = "val"
    return out.astype(str)


def as_tiles(cube: CubeInfo) -> tuple[CubeInfo, dict]:
    """(the cube as this family reads it: drawn split, mask classes, labelled = any non-ignore pixel; the split's
    record). Refuses, in one sentence, a sample cube without a mask or with non-square samples."""
    ds = open_cube(cube.url)
    if "mask" not in ds or "mask_pixels" not in ds or not isinstance(ds.attrs.get("mask"), dict):
        raise UserError(f"{cube.url}: a {cube.kind} cube without a per-pixel target (image-level tasks only) cannot be "
                        "segmented; score it with `cryocube embed` + `cryocube probe`, or --protocol probe "
                        "(interferogram cubes converted by this cryocube have one: convert again with --overwrite)")
    if ds.sizes["y"] != ds.sizes["x"]:
        raise UserError(f"{cube.url}: samples are {ds.sizes['y']}x{ds.sizes['x']} px; the segmentation family cuts square "
                        "tiles, so it needs square samples")
    opts = dict(ds.attrs["mask"])
    labelled = np.asarray(ds["mask_pixels"].values).sum(axis=1) > 0  # any pixel not ignore
    n = labelled.size
    has_box = np.isfinite(np.asarray(ds["box"].values, np.float64)).all(axis=1) if "box" in ds else np.zeros(n, bool)
    strata = np.where(~labelled, STRATA[2], np.where(has_box, STRATA[0], STRATA[1])).astype(str)
    seed = int(cube.checksum[:8], 16)
    splits = draw_split(strata, opts["split"], seed)
    digest = hashlib.sha256(("|".join(splits.tolist())).encode()).hexdigest()[:12]
    origin = as_text(ds["mask_origin"].values) if "mask_origin" in ds else np.full(n, "")
    record = {"rule": "drawn by the segmentation family per cube, stratified by deformation box / no box / unlabelled "
                      "(unlabelled samples and strata under 3 samples go to train)",
              "fractions": dict(opts["split"]), "seed": seed, "digest": digest,
              "counts": {s: int((splits == s).sum()) for s in ("train", "val", "test")},
              "mask_origin": {str(o): int((origin == o).sum()) for o in sorted(set(origin.tolist()))}}
    tiles = dataclasses.replace(cube, tile=int(ds.sizes["y"]), splits=splits, strata=strata,
                                class_names=[str(c) for c in opts["classes"]], labelled=labelled)
    return tiles, record
