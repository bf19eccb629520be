"""Encoders of the Cryo-Bench models, band matching, weights, and the decoders they feed.

    spec = model_spec("dofa")
    match = match_bands(spec, load_dataset("gld").bands)       # which cube band feeds which slot
    enc = build_encoder("dofa", bands=load_dataset("gld").bands, weights="DOFA_ViT_base_e100.pth")
    dec = build_decoder("upernet", enc, num_classes=2)
    logits = dec(enc(x), out_size=x.shape[-2:])
"""
from ..decoders import Segmenter, build_decoder
from .bands import MODES, BandMatch, BandMatchError, match_bands
from .base import Encoder
from .cli import bands_table
from .registry import build_encoder, families
from .spec import ModelSpec, WeightsSpec, list_models, model_spec

__all__ = [
    "ModelSpec", "WeightsSpec", "list_models", "model_spec", "match_bands", "BandMatch", "BandMatchError", "MODES",
    "build_encoder", "build_decoder", "Segmenter", "Encoder", "families", "bands_table",
]
