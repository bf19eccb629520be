"""GSDD (supraglacial debris): 10-band float32 GeoTIFF tiles, masks 0/1.

Cryo-Bench layout: `<root>/{train,val,test}/image/*.tif` + `<root>/{split}/mask/*.tif` (singular
folder names). The Zenodo release's own layout is not documented, so only this one is read.
"""
from __future__ import annotations

from .base import register
from .rawio import PairedRasterReader


@register
class GSDDCryoBench(PairedRasterReader):
    dataset = "gsdd"
    layout = "cryobench"
    image_dir = "{folder}/image"
    label_dir = "{folder}/mask"
