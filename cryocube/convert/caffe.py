"""CaFFe (calving-front zones): whole 8-bit grey SAR scenes of varying size, as PNG. Two layouts.

- cryobench: `<root>/images/{train,val,test}/*.png` + `<root>/labels/{split}/*.png`, zones 0..3.
- original (PANGAEA data_raw): `<root>/sar_images/{train,test}/<stem>.png` +
  `<root>/zones/{train,test}/<stem>_zones.png` with zones 0/64/127/254 (`fronts/` is not read).
  The official release has no val split; the reference preprocessing draws 10 % of train with
  sklearn `train_test_split(test_size=0.1, random_state=1)`. `shuffle_split_val` replays that
  draw (ShuffleSplit: permutation of a RandomState, first ceil(0.1 n) are val) over the train
  stems sorted by name; the reference listed its files in an order we cannot see, so the same
  rule over sorted names is the reproducible choice.
"""
from __future__ import annotations

import math

import numpy as np

from .base import SourceItem, register
from .rawio import PairedRasterReader, val_from_train


def shuffle_split_val(names: list[str], fraction: float = 0.1, seed: int = 1) -> set[str]:
    """The names sklearn's train_test_split(test_size=fraction, random_state=seed) would hold out."""
    names = sorted(names)
    n = len(names)
    if n < 2:
        return set()
    n_val = min(math.ceil(fraction * n), n - 1)
    perm = np.random.RandomState(seed).permutation(n)
    return {names[i] for i in perm[:n_val]}


@register
class CaFFeCryoBench(PairedRasterReader):
    dataset = "caffe"
    layout = "cryobench"
    image_dir = "images/{folder}"
    label_dir = "labels/{folder}"
    suffixes = (".png",)


@register
class CaFFeOriginal(PairedRasterReader):
    dataset = "caffe"
    layout = "original"
    image_dir = "sar_images/{folder}"
    label_dir = "zones/{folder}"
    label_stem_suffix = "_zones"
    split_folders = {"train": "train", "test": "test"}
    suffixes = (".png",)

    def assign_splits(self, items: list[SourceItem]) -> list[SourceItem]:
        opts = self.options
        train = [it.scene for it in items if it.split == "train"]
        val = shuffle_split_val(train, float(opts.get("val_fraction", 0.1)), int(opts.get("val_seed", 1)))
        return val_from_train(items, val)
