"""Scale-MAE ViT-L/16 on timm's ViT; the GSD-scaled 2-D sin-cos position embedding with the
protocol's input_res=1.0 is the plain MAE sin-cos, computed once at build time."""
from __future__ import annotations

from .keymap import KeyMap, Rename, register_keymap
from .registry import register_family
from .vit import TimmViTEncoder

register_keymap(KeyMap(
    name="scalemae",
    container=("model",),
    include=r"(patch_embed\.proj\..*|cls_token|blocks\..*)",
    renames=(Rename("", "vit."),),
    computed=(r"vit\.pos_embed",),
    notes="Scale-MAE pre-training checkpoint: mask token, norm, decoder and FPN heads are not part of the encoder; "
          "positions are computed from the GSD (input_res 1.0), not stored",
))


@register_family("scalemae")
def build_scalemae(spec, in_chans, input_size, match=None, input_res: float = 1.0, **arch):
    if input_res != 1.0:
        raise ValueError("scalemae: only input_res=1.0 (the protocol's value) is implemented")
    return TimmViTEncoder(spec, in_chans, input_size, match, **arch)
