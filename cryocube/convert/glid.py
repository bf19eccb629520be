"""GLID (glacial lakes, 8-bit RGB): two layouts.

- cryobench: `<root>/{train,val,test}/images/*` + `{split}/masks/*`, any raster (PNG in
  practice), masks 0/1. Like Cryo-Bench, the first 3 bands are kept (an RGBA file is fine).
- original (Zenodo 14838695): `<root>/<split>/images/*.png` + `<root>/<split>/labels/*.png`,
  lake = 255. The training folder is called `train` or `GLID` in the wild; both mean train.
"""
from __future__ import annotations

from .base import register
from .rawio import RASTER_SUFFIXES, PairedRasterReader


@register
class GLIDCryoBench(PairedRasterReader):
    dataset = "glid"
    layout = "cryobench"
    image_dir = "{folder}/images"
    label_dir = "{folder}/masks"
    suffixes = RASTER_SUFFIXES
    band_policy = "first"


@register
class GLIDOriginal(PairedRasterReader):
    dataset = "glid"
    layout = "original"
    image_dir = "{folder}/images"
    label_dir = "{folder}/labels"
    # folder names seen in releases and third-party loaders -> our split names
    split_folders = {
        "train": "train", "GLID": "train", "training": "train",
        "val": "val", "valid": "val", "validation": "val",
        "test": "test", "testing": "test",
    }
    suffixes = RASTER_SUFFIXES
    band_policy = "first"
