"""The one split every family scores a cube's board on, and the identity of a set of scored samples.

A tile cube's split is its published `split`; a sample cube's is drawn once from its checksum,
stratified by deformation box / none / unlabelled (the segmentation family, the vqa family and the
answer heads all call `cube_split`/`sample_split`, so their test samples are one set). A board cell
names its samples by `samples_hash`.
"""

from __future__ import annotations

import hashlib
from typing import Iterable

import numpy as np

STRATA = ("deformation", "no deformation", "unlabelled")


def draw_split(strata: np.ndarray, fractions: dict[str, float], seed: int) -> np.ndarray:
    """Per stratum (shuffled by `seed`): round(n * fraction) samples to test and to val (at least
    one each from a stratum of >= 3 samples, none from a smaller one or from unlabelled samples),
    the rest to train.
    """
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


# a sample cube whose catalog gives none (no mask)
DEFAULT_FRACTIONS = {"train": 0.6, "val": 0.2, "test": 0.2}


def sample_split(ds, checksum: str) -> tuple[np.ndarray, np.ndarray, dict]:
    """(split per sample, stratum per sample, the split's record) of an open sample cube, drawn from
    its checksum."""
    from ..cube import as_text

    opts = dict(ds.attrs.get("mask") or {})
    fractions = dict(opts.get("split") or DEFAULT_FRACTIONS)
    n = int(ds.sizes["sample"])
    labelled = (
        (np.asarray(ds["mask_pixels"].values).sum(axis=1) > 0)
        if "mask_pixels" in ds
        else np.ones(n, bool)
    )
    has_box = (
        np.isfinite(np.asarray(ds["box"].values, np.float64)).all(axis=1)
        if "box" in ds
        else np.zeros(n, bool)
    )
    strata = np.where(~labelled, STRATA[2], np.where(has_box, STRATA[0], STRATA[1])).astype(str)
    seed = int(checksum[:8], 16)
    splits = draw_split(strata, fractions, seed)
    digest = hashlib.sha256(("|".join(splits.tolist())).encode()).hexdigest()[:12]
    origin = as_text(ds["mask_origin"].values) if "mask_origin" in ds else np.full(n, "")
    record = {
        "rule": (
            "drawn per cube from its checksum, stratified by deformation box / no box / unlabelled "
            "(unlabelled samples and strata under 3 samples go to train)"
        ),
        "fractions": fractions,
        "seed": seed,
        "digest": digest,
        "counts": {s: int((splits == s).sum()) for s in ("train", "val", "test")},
        "mask_origin": {str(o): int((origin == o).sum()) for o in sorted(set(origin.tolist()))},
    }
    return splits, strata, record


def cube_split(url: str, checksum: str) -> tuple[np.ndarray, list[str], dict]:
    """(split per sample, sample ids, record): the split every family scores a cube's board on."""
    from ..cube import as_text, open_cube, sample_ids

    ds = open_cube(url)
    ids = [str(i) for i in sample_ids(ds, url)]
    if ds.attrs.get("kind") == "samples":
        splits, _, record = sample_split(ds, checksum)
        return splits, ids, record
    splits = np.asarray(as_text(ds["split"].values)).astype(str)
    return (
        splits,
        ids,
        {
            "rule": "the dataset's published split",
            "digest": hashlib.sha256("|".join(splits.tolist()).encode()).hexdigest()[:12],
            "counts": {s: int((splits == s).sum()) for s in ("train", "val", "test")},
        },
    )


def samples_hash(ids: Iterable[str]) -> str:
    """The identity of a set of scored samples (order-free)."""
    return hashlib.sha256("\n".join(sorted(set(map(str, ids)))).encode()).hexdigest()[:12]
