"""RemoteCLIP visual tower (OpenCLIP ViT-B/32) on timm's pre-norm CLIP ViT.

timm's VisionTransformer with pre_norm=True is the OpenCLIP visual transformer (bias-free patch
conv, class token, learned positions, ln_pre); the reference drops ln_post and the projection.
"""
from __future__ import annotations

from .keymap import KeyMap, Rename, register_keymap, reshape_transform
from .registry import register_family
from .vit import TimmViTEncoder

register_keymap(KeyMap(
    name="remoteclip",
    prefix=("visual.",),
    require_prefix=True,
    include=r"(conv1\.weight|class_embedding|positional_embedding|ln_pre\..*|transformer\.resblocks\..*)",
    transforms=(
        reshape_transform("class_embedding", ref_shape=lambda s: (s[-1],), our_shape=lambda s: (1, 1, s[-1])),
        reshape_transform("positional_embedding", ref_shape=lambda s: s[-2:], our_shape=lambda s: (1, *s[-2:])),
    ),
    renames=(
        Rename("conv1.weight", "vit.patch_embed.proj.weight"),
        Rename("class_embedding", "vit.cls_token"),
        Rename("positional_embedding", "vit.pos_embed"),
        Rename("ln_pre.", "vit.norm_pre."),
        Rename("transformer.resblocks.{i}.ln_1.", "vit.blocks.{i}.norm1."),
        Rename("transformer.resblocks.{i}.ln_2.", "vit.blocks.{i}.norm2."),
        Rename("transformer.resblocks.{i}.attn.in_proj_weight", "vit.blocks.{i}.attn.qkv.weight"),
        Rename("transformer.resblocks.{i}.attn.in_proj_bias", "vit.blocks.{i}.attn.qkv.bias"),
        Rename("transformer.resblocks.{i}.attn.out_proj.", "vit.blocks.{i}.attn.proj."),
        Rename("transformer.resblocks.{i}.mlp.c_fc.", "vit.blocks.{i}.mlp.fc1."),
        Rename("transformer.resblocks.{i}.mlp.c_proj.", "vit.blocks.{i}.mlp.fc2."),
    ),
    notes="OpenCLIP state dict: the text tower, ln_post and the visual projection are not part of the encoder",
))


@register_family("remoteclip")
def build_remoteclip(spec, in_chans, input_size, match=None, **arch):
    return TimmViTEncoder(spec, in_chans, input_size, match, **arch)
