"""SpectralGPT+ encoder: 3-D spectral-spatial tokens (3 bands x 8x8 px) on timm Blocks, groups
concatenated on channels group-major as the reference does (docs/models.md)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .base import Encoder, Trunk, collect_layers
from .registry import register_architecture


@register_architecture("spectralgpt")
class SpectralGptEncoder(Encoder):
    trunk = Trunk(patch_size=8, norm_eps=1e-5, drop_path_rate=0.5)

    def build(self, t_patch_size=3):
        """Refuses a band count not divisible by t_patch_size."""
        if self.in_chans % t_patch_size:
            raise ValueError(
                f"spectralgpt: {self.in_chans} bands do not split into groups of {t_patch_size}"
            )
        t = self.trunk
        self.groups = self.in_chans // t_patch_size
        self.patch_embed = nn.Module()
        kernel = (t_patch_size, t.patch_size, t.patch_size)
        self.patch_embed.proj = nn.Conv3d(1, t.embed_dim, kernel_size=kernel, stride=kernel)
        self.pos_embed_spatial = nn.Parameter(
            torch.zeros(1, self.grid**2, t.embed_dim).normal_(std=0.02)
        )
        self.pos_embed_temporal = nn.Parameter(
            torch.zeros(1, self.groups, t.embed_dim).normal_(std=0.02)
        )
        self.blocks = t.blocks()
        self.same_outputs(t.embed_dim * self.groups, t.patch_size)

    def features(self, x: Tensor) -> list[Tensor]:
        """(B, D x groups, H/8, W/8) per output layer, group-major (g * D + c)."""
        b = x.shape[0]
        t = self.patch_embed.proj(x.unsqueeze(1))  # (B, D, G, g, g)
        d = t.shape[1]
        t = t.flatten(3).permute(0, 2, 3, 1).reshape(b, -1, d)  # (B, G*g*g, D), group-major
        pos = self.pos_embed_spatial.repeat(1, self.groups, 1) + torch.repeat_interleave(
            self.pos_embed_temporal, self.grid**2, dim=1
        )
        t = t + pos
        outs, _ = collect_layers(self.blocks, t, self.output_layers)
        g = self.groups
        return [
            o.reshape(b, g, -1, d).transpose(2, 3).reshape(b, g * d, self.grid, self.grid)
            for o in outs
        ]
