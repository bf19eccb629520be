"""Plain ViTs on timm's VisionTransformer: the shared builder and the from-scratch ViT baseline.

timm supplies the patch embedding, blocks and `forward_intermediates`; what differs between the
ViT-based models (position embedding kind, pre-norm, final norm on the last output, eps, biases)
is a few constructor arguments, set from the catalog's `arch`.
"""
from __future__ import annotations

from functools import partial

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor, nn

from .base import Encoder, sincos_2d, sincos_2d_mocov3, sincos_3d
from .registry import register_family

POS_EMBEDS = ("learn", "sincos", "mocov3", "sincos3d", "zeros")


class TimmViTEncoder(Encoder):
    """A timm VisionTransformer returning the maps of `output_layers` (B, C, g, g).

    pos_embed: "learn" (trained, loaded), "sincos" (MAE 2-D), "mocov3" (MoCo-v3 2-D), "sincos3d"
    (Prithvi, T=1), "zeros" (the reference's scratch ViT, which never fills its frozen zeros).
    Fixed kinds are frozen parameters (as in the reference code) so checkpoints may carry them.
    `norm_last`: apply the final LayerNorm to the last returned map (DOFA/ViT-scratch behaviour);
    `final_norm`: keep the final LayerNorm at all (False when the reference encoder has none).
    """

    def __init__(
        self,
        spec,
        in_chans: int,
        input_size: int,
        match=None,
        patch_size: int = 16,
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        norm_eps: float = 1e-6,
        pos_embed: str = "learn",
        pre_norm: bool = False,
        final_norm: bool = False,
        norm_last: bool = False,
        drop_path_rate: float = 0.0,
        **unused,
    ):
        super().__init__(spec, in_chans, input_size, match)
        if pos_embed not in POS_EMBEDS:
            raise ValueError(f"{spec.path}: pos_embed must be one of {POS_EMBEDS}, got {pos_embed!r}")
        if unused:
            raise TypeError(f"{spec.id}: unknown architecture arguments {sorted(unused)}")
        self.grid = input_size // patch_size
        self.patch_size = patch_size
        self.norm_last = norm_last
        self.vit = VisionTransformer(
            img_size=input_size,
            patch_size=patch_size,
            in_chans=in_chans,
            num_classes=0,
            global_pool="token",
            embed_dim=embed_dim,
            depth=depth,
            num_heads=num_heads,
            mlp_ratio=mlp_ratio,
            qkv_bias=qkv_bias,
            class_token=True,
            pre_norm=pre_norm,
            drop_path_rate=drop_path_rate,
            final_norm=final_norm,
            norm_layer=partial(nn.LayerNorm, eps=norm_eps),
            act_layer=nn.GELU,
        )
        fixed = {
            "sincos": lambda: sincos_2d(embed_dim, self.grid, cls_token=True),
            "mocov3": lambda: torch.cat([torch.zeros(1, 1, embed_dim), sincos_2d_mocov3(embed_dim, self.grid)], dim=1),
            "sincos3d": lambda: sincos_3d(embed_dim, (1, self.grid, self.grid), cls_token=True),
            "zeros": lambda: torch.zeros(1, self.grid**2 + 1, embed_dim),
        }
        if pos_embed in fixed:
            with torch.no_grad():
                self.vit.pos_embed.copy_(fixed[pos_embed]())
            self.vit.pos_embed.requires_grad_(False)
        self.output_channels = [embed_dim] * len(spec.output_layers)
        self.output_reductions = [float(patch_size)] * len(spec.output_layers)

    def features(self, x: Tensor) -> list[Tensor]:
        outs = self.vit.forward_intermediates(
            x, indices=self.output_layers, norm=False, output_fmt="NCHW", intermediates_only=True, stop_early=True
        )
        outs = list(outs)
        if self.norm_last:
            outs[-1] = self.vit.norm(outs[-1].permute(0, 2, 3, 1)).permute(0, 3, 1, 2).contiguous()
        return outs


@register_family("vit")
def build_vit(spec, in_chans, input_size, match=None, **arch):
    return TimmViTEncoder(spec, in_chans, input_size, match, **arch)

