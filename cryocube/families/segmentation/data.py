"""What segmentation tasks do to cube samples: normalise and band-match them into encoder slots, pad,
cut windows and crops, and draw few-shot subsets (cube reading itself is `cube.read_samples`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...catalog import CUBE_IGNORE_INDEX


@dataclass(frozen=True)
class InputMap:
    """How cube bands become encoder input: per-slot band index (-1 = zero) and per-band mean/std."""

    index: tuple[int, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def apply(self, image: np.ndarray) -> torch.Tensor:
        """(B, C_cube, H, W) raw -> (B, slots, H, W) float32, normalised; unmatched slots are 0 (the mean)."""
        x = torch.from_numpy(np.ascontiguousarray(image)).float()
        mean = torch.tensor(self.mean, dtype=torch.float32)[None, :, None, None]
        std = torch.tensor(self.std, dtype=torch.float32)[None, :, None, None]
        x = (x - mean) / std
        out = torch.zeros((x.shape[0], len(self.index), x.shape[2], x.shape[3]), dtype=torch.float32)
        for slot, b in enumerate(self.index):
            if b >= 0:
                out[:, slot] = x[:, b]
        return out


def pad_to(x: torch.Tensor, label: np.ndarray, size: int) -> tuple[torch.Tensor, np.ndarray]:
    """Pad normalised tiles smaller than the encoder input (bottom/right; 0 = the mean, label ignore)."""
    h, w = label.shape[-2:]
    if h >= size and w >= size:
        return x, label
    H, W = max(h, size), max(w, size)
    px = torch.zeros(x.shape[:-2] + (H, W), dtype=x.dtype)
    pl = np.full(label.shape[:-2] + (H, W), CUBE_IGNORE_INDEX, dtype=label.dtype)
    px[..., :h, :w] = x
    pl[..., :h, :w] = label
    return px, pl


def sliding_offsets(length: int, window: int) -> list[int]:
    """Window offsets along one axis: ceil(L / S) windows spread evenly, the last flush with the edge."""
    if length <= window:
        return [0]
    n = int(np.ceil(length / window))
    return [int(round(v)) for v in np.linspace(0, length - window, n)]


def window_offsets(tile: int, size: int) -> np.ndarray:
    """(W, 2) top-left corners of the sliding windows over a (padded) tile."""
    side = max(tile, size)
    offs = sliding_offsets(side, size)
    return np.array([(y, x) for y in offs for x in offs], dtype=np.int32)


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
    order = list(dict.fromkeys(strata.tolist()))
    chosen = []
    for s in order:
        members = np.flatnonzero(strata == s)
        take = int(max(1, members.size * fraction))
        chosen.append(np.sort(rng.choice(members, size=take, replace=False)))
    return np.sort(np.concatenate(chosen)) if chosen else np.arange(0)
