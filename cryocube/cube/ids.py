"""Sample identity: one id per sample, stored in the cube, derived the same way for cubes written
before ids."""

from __future__ import annotations

import collections
import posixpath
import warnings

import numpy as np
import xarray as xr

from ..errors import UserError
from .schema import _text, as_text


def derive_sample_ids(source, split, tile_y, tile_x) -> np.ndarray:
    """One id per tile: the file stem, `<stem>__<row>_<col>` where a scene is cut into several,
    `<split>/<id>` where a stem is in two split folders (a scene's tiles share their source)."""
    source, split = as_text(source), as_text(split)
    ty, tx = np.asarray(tile_y).astype(int), np.asarray(tile_x).astype(int)
    stem = [posixpath.splitext(s)[0] for s in source]
    tiles = collections.Counter(zip(split, source))
    ids = [
        st if tiles[(sp, so)] == 1 else f"{st}__{y}_{x}"
        for st, sp, so, y, x in zip(stem, split, source, ty, tx)
    ]
    splits_of: dict[str, set] = collections.defaultdict(set)
    for i, sp in zip(ids, split):
        splits_of[i].add(sp)
    return _text(f"{sp}/{i}" if len(splits_of[i]) > 1 else i for i, sp in zip(ids, split))


def check_unique_ids(ids, where: str, fix: str = "convert the cube again") -> np.ndarray:
    """The ids, or a UserError naming the first repeated ones (they would merge samples)."""
    ids = as_text(ids)
    names, first, counts = np.unique(ids, return_index=True, return_counts=True)
    if (counts > 1).any():
        rep = names[counts > 1]
        show = ", ".join(
            f"{r!r} (samples {np.flatnonzero(ids == r)[:3].tolist()})" for r in rep[:3]
        )
        raise UserError(
            f"{where}: {rep.size} sample id(s) are used more than once, e.g. {show}; "
            f"ids must be unique ({fix})"
        )
    return ids


def sample_ids(ds: xr.Dataset, url: str) -> np.ndarray:
    """The cube's per-sample ids, the one sample identity of embeddings, CSVs and probes; a cube
    written before they were stored has them derived (equal to what a new conversion stores)."""
    if "sample_id" in ds.variables:
        return check_unique_ids(ds["sample_id"].values, url)
    if ds.attrs.get("kind") == "samples":  # sample cubes: `source` is the location id
        return check_unique_ids(ds["source"].values, url)
    if url not in _IDS_WARNED:
        _IDS_WARNED.add(url)
        warnings.warn(
            f"{url}: this cube has no stored sample ids (written before they existed); they are"
            " derived from source and tile position (<stem>__<row>_<col>), as a new `cryocube"
            " convert` stores them",
            stacklevel=2,
        )
    cols = (ds[v].values for v in ("source", "split", "tile_y", "tile_x"))
    return check_unique_ids(derive_sample_ids(*cols), url)


_IDS_WARNED: set[str] = set()
