"""Encoders of the Cryo-Bench models, band matching, weights (docs/models.md shows their use)."""

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
