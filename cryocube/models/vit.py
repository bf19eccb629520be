"""ViTs on timm: `vit` (VisionTransformer) for every plain ViT of the benchmark, its `arch:` saying
how they differ (docs/models.md), and `ssl4eo_data2vec` (BEiT)."""

from __future__ import annotations

from dataclasses import asdict
from functools import partial

import torch
from timm.models.beit import Beit
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor, nn

from .base import Encoder, Trunk, sincos_2d, sincos_2d_mocov3, sincos_3d, timm_intermediates
from .registry import register_architecture

POS_EMBEDS = ("learn", "sincos", "mocov3", "sincos3d", "zeros")


def timm_args(enc: Encoder) -> dict:
    """The constructor arguments timm's VisionTransformer and Beit share, for `enc`."""
    trunk = asdict(enc.trunk)
    eps = trunk.pop("norm_eps")
    return dict(
        trunk,
        img_size=enc.input_size,
        in_chans=enc.in_chans,
        num_classes=0,
        global_pool="token",
        norm_layer=partial(nn.LayerNorm, eps=eps),
    )


@register_architecture("vit")
class TimmViTEncoder(Encoder):
    """A timm VisionTransformer returning the maps of `output_layers` (B, C, g, g)."""

    trunk = Trunk()

    def build(
        self,
        qkv_bias: bool = True,
        pos_embed: str = "learn",
        pre_norm: bool = False,
        final_norm: bool = False,
        norm_last: bool = False,
        input_res: float = 1.0,
    ):
        """The model's `arch:` (docs/models.md says what each argument does)."""
        path = self.spec.path
        if pos_embed not in POS_EMBEDS:
            raise ValueError(f"{path}: pos_embed must be one of {POS_EMBEDS}, got {pos_embed!r}")
        if input_res != 1.0:
            raise ValueError(
                f"{path}: only input_res 1.0 (Scale-MAE at the protocol's value) is implemented"
            )
        grid, embed_dim = self.grid, self.trunk.embed_dim
        self.norm_last = norm_last
        self.vit = VisionTransformer(
            **timm_args(self),
            qkv_bias=qkv_bias,
            class_token=True,
            pre_norm=pre_norm,
            final_norm=final_norm,
            act_layer=nn.GELU,
        )
        fixed = {
            "sincos": lambda: sincos_2d(embed_dim, grid, cls_token=True),
            "mocov3": lambda: torch.cat(
                [torch.zeros(1, 1, embed_dim), sincos_2d_mocov3(embed_dim, grid)], dim=1
            ),
            "sincos3d": lambda: sincos_3d(embed_dim, (1, grid, grid), cls_token=True),
            "zeros": lambda: torch.zeros(1, grid**2 + 1, embed_dim),
        }
        if pos_embed in fixed:
            with torch.no_grad():
                self.vit.pos_embed.copy_(fixed[pos_embed]())
            self.vit.pos_embed.requires_grad_(False)

    def features(self, x: Tensor) -> list[Tensor]:
        """timm's intermediates before the final norm, unless `norm_last` norms the last one."""
        outs = timm_intermediates(self.vit, x, self.output_layers)
        if self.norm_last:
            outs[-1] = self.vit.norm(outs[-1].permute(0, 2, 3, 1)).permute(0, 3, 1, 2).contiguous()
        return outs


@register_architecture("ssl4eo_data2vec")
class Data2VecEncoder(Encoder):
    """SSL4EO-S12 Data2Vec ViT-S/16: timm's BEiT, shared relative position bias, layer scale 0.1."""

    trunk = Trunk(embed_dim=384, num_heads=6)

    def build(self, init_values=0.1):
        """timm BEiT's layer scale, at SSL4EO Data2Vec's 0.1 by default."""
        self.beit = Beit(
            **timm_args(self),
            qkv_bias=True,
            use_abs_pos_emb=False,
            use_rel_pos_bias=False,
            use_shared_rel_pos_bias=True,
            init_values=init_values,
        )

    def features(self, x: Tensor) -> list[Tensor]:
        """timm BEiT's intermediates, (B, D, H/16, W/16) per output layer, before the final norm."""
        return timm_intermediates(self.beit, x, self.output_layers)
