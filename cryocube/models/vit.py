"""ViTs on timm: one architecture (`vit`, timm's VisionTransformer) for every plain ViT of the
benchmark, and `ssl4eo_data2vec` (timm's BEiT).

timm supplies the patch embedding, blocks and `forward_intermediates`; what differs between the
ViT-based models (SSL4EO MoCo/DINO/MAE, Prithvi, RemoteCLIP, Scale-MAE, the scratch ViT: position
embedding kind, pre-norm, final norm on the last output, eps, biases) is a few constructor
arguments set from the catalog's `arch`, and the key map of their checkpoints
(catalogs/keymaps.yaml). A new ViT model is one YAML (architecture: vit).

Prithvi-100M is a 3-D ViT (Conv3d patch embedding, tubelet 1); with one frame the Conv3d is a Conv2d
with the time axis squeezed, which its key map does, and the position embedding is the 3-D sin-cos
for T=1 (recomputed). RemoteCLIP's OpenCLIP visual tower is timm's pre-norm CLIP ViT (bias-free
patch conv, ln_pre). Scale-MAE's GSD-scaled sin-cos at the protocol's input_res=1.0 is the MAE one.
"""

from __future__ import annotations

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
    t = enc.trunk
    return dict(
        img_size=enc.input_size,
        patch_size=t.patch_size,
        in_chans=enc.in_chans,
        num_classes=0,
        global_pool="token",
        embed_dim=t.embed_dim,
        depth=t.depth,
        num_heads=t.num_heads,
        mlp_ratio=t.mlp_ratio,
        drop_path_rate=t.drop_path_rate,
        norm_layer=partial(nn.LayerNorm, eps=t.norm_eps),
    )


@register_architecture("vit")
class TimmViTEncoder(Encoder):
    """A timm VisionTransformer returning the maps of `output_layers` (B, C, g, g).

    pos_embed: "learn" (trained, loaded), "sincos" (MAE 2-D), "mocov3" (MoCo-v3 2-D), "sincos3d"
    (Prithvi, T=1), "zeros" (the reference's scratch ViT, which never fills its frozen zeros).
    Fixed kinds are frozen parameters (as in the reference code) so checkpoints may carry them.
    `norm_last`: apply the final LayerNorm to the last returned map (DOFA/ViT-scratch behaviour);
    `final_norm`: keep the final LayerNorm at all (False when the reference encoder has none).
    """

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
        """The arguments of the models' `arch:`, as the class docstring explains them."""
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
