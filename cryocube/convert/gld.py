"""GLD (GLNet glacial lakes): 10-band GeoTIFF tiles of 300x300, masks 0/1.

Cryo-Bench layout: `<root>/{train,val,test}/image/*.tif` + `<root>/{split}/mask/*.tif`, mask
named like its image. All ten bands are read in file order, which is the catalog's order (band 6,
the one Cryo-Bench splits off as "sar", is the Sentinel-1 coherence).
"""
from __future__ import annotations

from .base import register
from .rawio import PairedRasterReader


@register
class GLDCryoBench(PairedRasterReader):
    dataset = "gld"
    layout = "cryobench"
    image_dir = "{folder}/image"
    label_dir = "{folder}/mask"
