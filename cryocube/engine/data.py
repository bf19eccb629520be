"""Reading cube samples inside tasks: zarr directly (no xarray in the hot path), then normalise and
band-match into the encoder's input slots.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .. import store as _store
from ..catalog import CUBE_IGNORE_INDEX


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


def read_samples(url: str, idx: np.ndarray, storage_options: dict | None = None, labels: bool = True):
    """image (n, C, T, T) and label (n, T, T) of the given sample indices, in that order."""
    g = _store.open_group(url, "r", storage_options)
    idx = np.asarray(idx, dtype=np.int64)
    if idx.size and np.all(np.diff(idx) == 1):
        sl = slice(int(idx[0]), int(idx[-1]) + 1)
        img = g["image"][sl]
        lab = g["label"][sl] if labels else None
    else:
        img = g["image"].get_orthogonal_selection((idx,))
        lab = g["label"].get_orthogonal_selection((idx,)) if labels else None
    return np.asarray(img), (np.asarray(lab) if labels else None)


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
