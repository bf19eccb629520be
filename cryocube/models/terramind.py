"""TerraMind v1 encoders on timm Blocks: bias-free pre-norm blocks, SwiGLU, linear patches
(docs/models.md)."""

from __future__ import annotations

from functools import partial

import torch
from timm.layers import SwiGLU
from torch import Tensor, nn

from .base import Encoder, Trunk, collect_layers, patches, sincos_2d_mocov3, tokens_to_map
from .registry import register_architecture


def terramind_mlp(in_features: int, hidden_features: int, **kw) -> SwiGLU:
    """SwiGLU with TerraMind's width rule: 2/3 of the nominal 4x hidden width."""
    return SwiGLU(in_features, int(2 * hidden_features / 3), **kw)


class PatchEmbedLinear(nn.Module):
    """TerraMind's bias-free linear patch embedding; the encoder adds mod_emb."""

    def __init__(self, in_chans: int, patch_size: int, embed_dim: int):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Linear(in_chans * patch_size * patch_size, embed_dim, bias=False)
        self.mod_emb = nn.Parameter(torch.zeros(1, 1, embed_dim).normal_(std=0.02))

    def forward(self, x: Tensor) -> Tensor:
        """Tokens (B, N, D)."""
        return self.proj(patches(x, self.patch_size, pixel_major=True))


@register_architecture("terramind")
class TerraMindEncoder(Encoder):
    trunk = Trunk(embed_dim=1024, depth=24, num_heads=16)

    def build(self, modality: str = "untok_sen2l2a@224"):
        """Base or large by arch; S2L2A or S1GRD by the config's key map."""
        t = self.trunk
        self.modality = modality
        self.embed = PatchEmbedLinear(self.in_chans, t.patch_size, t.embed_dim)
        self.register_buffer("pos_emb", sincos_2d_mocov3(t.embed_dim, self.grid), persistent=False)
        norm = partial(nn.LayerNorm, eps=t.norm_eps, bias=False)
        self.blocks = t.blocks(
            qkv_bias=False,
            proj_bias=False,
            act_layer=nn.SiLU,
            norm_layer=norm,
            mlp_layer=terramind_mlp,
        )
        self.norm = norm(t.embed_dim)

    def features(self, x: Tensor) -> list[Tensor]:
        """(B, D, H/16, W/16) per output layer; every block runs (the last output is normed)."""
        t = self.embed(x) + (self.pos_emb.to(x.dtype) + self.embed.mod_emb)
        outs, t = collect_layers(self.blocks, t, self.output_layers, stop_early=False)
        # the reference replaces the last output by the final-normed last block
        outs[-1] = self.norm(t)
        return [tokens_to_map(o, self.grid) for o in outs]
