"""GFM-Swin on timm's SwinTransformer, outputs taken after each stage's merge as GFM does
(docs/models.md)."""

from __future__ import annotations

from timm.models.swin_transformer import SwinTransformer
from torch import Tensor

from .base import Encoder
from .registry import register_architecture


@register_architecture("gfm_swin")
class GfmSwinEncoder(Encoder):
    def build(
        self,
        patch_size=4,
        embed_dim=128,
        depths=(2, 2, 18, 2),
        num_heads=(4, 8, 16, 32),
        window_size=6,
        mlp_ratio=4.0,
        drop_path_rate=0.1,
    ):
        """Swin-B by default; outputs follow each stage's merge (module docstring)."""
        self.swin = SwinTransformer(
            img_size=self.input_size,
            patch_size=patch_size,
            in_chans=self.in_chans,
            num_classes=0,
            embed_dim=embed_dim,
            depths=tuple(depths),
            num_heads=tuple(num_heads),
            window_size=window_size,
            mlp_ratio=mlp_ratio,
            qkv_bias=True,
            drop_path_rate=drop_path_rate,
        )
        n = len(depths)
        stage = [min(i + 1, n - 1) for i in self.output_layers]  # outputs follow a merge
        self.output_channels = [embed_dim * 2**k for k in stage]
        self.output_reductions = [float(patch_size * 2**k) for k in stage]

    def features(self, x: Tensor) -> list[Tensor]:
        """After each stage's PatchMerging, then the final blocks: strides 8, 16, 32, 32 (NCHW)."""
        layers = self.swin.layers
        x = layers[0](self.swin.patch_embed(x))  # NHWC
        outs = []
        for stage in layers[1:]:
            x = stage.downsample(x)
            outs.append(x)
            x = stage.blocks(x)
        outs.append(x)
        return [outs[i].permute(0, 3, 1, 2).contiguous() for i in self.output_layers]
