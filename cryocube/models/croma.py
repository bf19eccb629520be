"""CROMA (optical and SAR) ViT encoders: linear 8x8 patches, 2-D ALiBi as the blocks' attention
mask (docs/models.md)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .base import Encoder, Trunk, collect_layers, patches, tokens_to_map
from .registry import register_architecture


def alibi_slopes(n: int) -> list[float]:
    """ALiBi head slopes (Press et al.), including the non-power-of-two interleaving."""

    def pow2(k: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(k) - 3)))
        return [start * start**i for i in range(k)]

    if math.log2(n).is_integer():
        return pow2(n)
    p = 2 ** math.floor(math.log2(n))
    return pow2(p) + alibi_slopes(2 * p)[0::2][: n - p]


def alibi_2d(num_heads: int, grid: int) -> Tensor:
    """(1, heads, N, N) bias = -slope_h * euclidean distance between patch centres (row-major)."""
    rr, cc = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
    pts = torch.stack([rr.reshape(-1), cc.reshape(-1)], dim=1).double()
    dist = torch.cdist(pts, pts)
    slopes = torch.tensor(alibi_slopes(num_heads), dtype=torch.float64)
    return (-slopes[:, None, None] * dist[None]).float().unsqueeze(0)


@register_architecture("croma")
class CromaEncoder(Encoder):
    trunk = Trunk(embed_dim=1024, depth=24, num_heads=16, patch_size=8, norm_eps=1e-5)

    def build(self):
        """Optical and SAR configs share it, differing in arch and key map."""
        t = self.trunk
        self.patch_embed = nn.Linear(t.patch_size * t.patch_size * self.in_chans, t.embed_dim)
        self.blocks = t.blocks(qkv_bias=False)
        self.norm = nn.LayerNorm(t.embed_dim, eps=t.norm_eps)
        self.register_buffer("attn_bias", alibi_2d(t.num_heads, self.grid), persistent=False)

    def features(self, x: Tensor) -> list[Tensor]:
        """(B, D, H/8, W/8) per output layer, the last one final-normed; ALiBi as attention mask."""
        t = self.patch_embed(patches(x, self.trunk.patch_size))
        outs, _ = collect_layers(
            self.blocks, t, self.output_layers, attn_mask=self.attn_bias.to(t.dtype)
        )
        outs[-1] = self.norm(outs[-1])
        return [tokens_to_map(o, self.grid) for o in outs]
