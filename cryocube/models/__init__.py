"""Encoders of the Cryo-Bench models, band matching, weights.

In short:

    spec = model_spec("dofa")
    match = match_bands(spec, load_dataset("gld").bands)  # which cube band feeds which slot
    enc = build_encoder("dofa", bands=load_dataset("gld").bands, weights="DOFA_ViT_base_e100.pth")
    decoder = build_decoder("upernet", enc, num_classes=2)  # cryocube.decoders
    logits = decoder(enc(x), out_size=x.shape[-2:])
"""

from .bands import RULES, BandMatch, BandMatchError, match_bands
from .base import Encoder
from .build import build_encoder
from .registry import architectures
from .spec import ModelSpec, WeightsSpec, list_models, model_spec

__all__ = [
    "ModelSpec",
    "WeightsSpec",
    "list_models",
    "model_spec",
    "match_bands",
    "BandMatch",
    "BandMatchError",
    "RULES",
    "build_encoder",
    "Encoder",
    "architectures",
]
