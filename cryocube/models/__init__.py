"""Encoders of the Cryo-Bench models, band matching, weights.

In short:

    spec = model_spec("dofa")
    match = match_bands(spec, load_dataset("gld").bands)  # which cube band feeds which slot
    enc = build_encoder("dofa", bands=load_dataset("gld").bands, weights="DOFA_ViT_base_e100.pth")
    decoder = build_decoder("upernet", enc, num_classes=2)  # cryocube.decoders
    logits = decoder(enc(x), out_size=x.shape[-2:])
"""

from ..plugins import lazy_exports

# names are imported on first use: the CLI builds its parser from `models.cli` without torch
_EXPORTS = {
    "bands": ("RULES", "BandMatch", "BandMatchError", "match_bands"),
    "base": ("Encoder",),
    "build": ("build_encoder",),
    "registry": ("architectures",),
    "spec": ("ModelSpec", "WeightsSpec", "list_models", "model_spec"),
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
