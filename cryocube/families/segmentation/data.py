"""What segmentation tasks do to cube samples: pad, cut crops, draw few-shot subsets."""

from __future__ import annotations

import numpy as np
import torch

from ...catalog import CUBE_IGNORE_INDEX


def pad_to(x: torch.Tensor, label: np.ndarray, size: int) -> tuple[torch.Tensor, np.ndarray]:
    """Pad tiles smaller than the encoder input (bottom/right; 0 = the mean, label ignore)."""
    h, w = label.shape[-2:]
    if h >= size and w >= size:
        return x, label
    H, W = max(h, size), max(w, size)
    px = torch.zeros(x.shape[:-2] + (H, W), dtype=x.dtype)
    pl = np.full(label.shape[:-2] + (H, W), CUBE_IGNORE_INDEX, dtype=label.dtype)
    px[..., :h, :w] = x
    pl[..., :h, :w] = label
    return px, pl


def crop_offsets(n_samples: int, k: int, tile: int, size: int, seed: int) -> np.ndarray:
    """(n*k, 2) random crop corners, fixed by the cache seed (the bank)."""
    side = max(tile, size)
    rng = np.random.default_rng(seed)
    return rng.integers(0, side - size + 1, size=(n_samples * k, 2)).astype(np.int32)


def stratified_subset(strata: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Few-shot subset as the reference samples it: from each stratum (in order of first appearance)
    max(1, int(n * fraction)) samples without replacement. Indices are positions in `strata`."""
    strata = np.array([str(v) for v in np.asarray(strata).ravel()], dtype=object)
    if fraction >= 1.0:
        return np.arange(strata.size)
    rng = np.random.default_rng(seed)
    chosen = []
    for s in dict.fromkeys(strata.tolist()):  # in order of first appearance
        members = np.flatnonzero(strata == s)
        take = int(max(1, members.size * fraction))
        chosen.append(np.sort(rng.choice(members, size=take, replace=False)))
    return np.sort(np.concatenate(chosen)) if chosen else np.arange(0)
