"""Prithvi-100M (HLS, 6 bands) as a single-frame timm ViT-B/16.

The reference encoder is a 3-D ViT (Conv3d patch embedding, tubelet 1, 3-D sin-cos positions);
with one frame the Conv3d is a Conv2d with the time axis squeezed, which the key map does, and the
position embedding is the 3-D sin-cos for T=1 (recomputed; the checkpoint's is for 3 frames).
"""
from __future__ import annotations

from .keymap import KeyMap, Rename, register_keymap, reshape_transform
from .registry import register_family
from .vit import TimmViTEncoder

register_keymap(KeyMap(
    name="prithvi",
    include=r"(patch_embed\.proj\..*|cls_token|blocks\..*)",
    transforms=(reshape_transform(
        "patch_embed.proj.weight",
        ref_shape=lambda s: (s[0], s[1], 1, s[2], s[3]),
        our_shape=lambda s: (s[0], s[1], s[-2], s[-1]) if len(s) == 5 else s,
    ),),
    renames=(Rename("", "vit."),),
    computed=(r"vit\.pos_embed",),
    notes="MAE checkpoint (3 frames): the 3-frame position embedding, mask token, norm and decoder are not used; "
          "the T=1 3-D sin-cos embedding is recomputed",
))


@register_family("prithvi")
def build_prithvi(spec, in_chans, input_size, match=None, **arch):
    return TimmViTEncoder(spec, in_chans, input_size, match, **arch)
