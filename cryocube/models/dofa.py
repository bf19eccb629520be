"""DOFA ViT-B/16: a patch embedding whose kernel is generated from each band's wavelength
(docs/models.md); module names equal the reference's, so the key map only selects encoder keys."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import UserError
from .base import Encoder, Trunk, sincos_1d, sincos_2d, tokens_to_map, with_cls_token
from .registry import register_architecture


class TransformerWeightGenerator(nn.Module):
    def __init__(self, input_dim: int, output_dim: int, embed_dim: int, wt_num: int = 128):
        super().__init__()
        layer = nn.TransformerEncoderLayer(input_dim, nhead=4, activation="gelu", dropout=0.0)
        self.transformer_encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.fc_weight = nn.Linear(input_dim, output_dim)
        self.fc_bias = nn.Linear(input_dim, embed_dim)
        self.wt_num = wt_num
        self.weight_tokens = nn.Parameter(torch.empty(wt_num, input_dim).normal_(std=0.02))
        self.bias_token = nn.Parameter(torch.empty(1, input_dim).normal_(std=0.02))

    def forward(self, waves: Tensor) -> tuple[Tensor, Tensor]:
        """Band embeddings (C, E) -> kernel weights per band (C, k*k*D) and one bias (D,)."""
        x = torch.cat([self.weight_tokens, waves, self.bias_token], dim=0)
        out = self.transformer_encoder(x)
        weights = self.fc_weight(out[self.wt_num : -1] + waves)
        bias = self.fc_bias(out[-1])
        return weights, bias


class FCResLayer(nn.Module):
    def __init__(self, size: int = 128):
        super().__init__()
        self.w1 = nn.Linear(size, size)
        self.w2 = nn.Linear(size, size)

    def forward(self, x: Tensor) -> Tensor:
        """The residual ReLU MLP DOFA puts on the wavelength sin-cos before the weight generator."""
        return x + F.relu(self.w2(F.relu(self.w1(x))))


class DynamicPatchEmbed(nn.Module):
    def __init__(self, wv_planes: int, kernel_size: int, embed_dim: int, scaler: float = 0.01):
        super().__init__()
        self.wv_planes, self.kernel_size = wv_planes, kernel_size
        self.embed_dim, self.scaler = embed_dim, scaler
        self.weight_generator = TransformerWeightGenerator(
            wv_planes, kernel_size * kernel_size * embed_dim, embed_dim
        )
        self.fclayer = FCResLayer(wv_planes)
        for m in list(self.weight_generator.modules()) + list(self.fclayer.modules()):
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                m.bias.data.fill_(0.01)

    def forward(self, img: Tensor, wavelengths_um: Tensor) -> Tensor:
        """Tokens (B, N, D) of a conv whose kernel is generated from `wavelengths_um`."""
        waves = self.fclayer(sincos_1d(self.wv_planes, wavelengths_um * 1000, torch.float32))
        weight, bias = self.weight_generator(waves)
        k = self.kernel_size
        kernel = (
            weight.view(len(wavelengths_um), k, k, self.embed_dim).permute(3, 0, 1, 2) * self.scaler
        )
        out = F.conv2d(
            img, kernel, bias=bias.view(self.embed_dim) * self.scaler, stride=k, padding=1
        )
        return out.flatten(2).transpose(1, 2)


@register_architecture("dofa")
class DofaEncoder(Encoder):
    trunk = Trunk()

    def build(self, wv_planes=128, wavelengths_um: list[float] | dict[str, float] | None = None):
        """`wavelengths_um` may be a table by band name, read through the match's slots."""
        waves = wavelengths_um
        if isinstance(waves, dict):  # the catalog's table, keyed by Cryo-Bench band name
            if self.match is None:
                raise UserError(
                    "dofa needs each input band's name to look up its wavelength: pass bands="
                )
            missing = [s for s in self.match.slots if s not in waves]
            if missing:
                raise UserError(
                    f"{self.spec.path}: arch.wavelengths_um has no wavelength for bands {missing}"
                )
            waves = [float(waves[s]) for s in self.match.slots]
        if waves is None:
            raise UserError(
                f"{self.spec.path}: dofa needs arch.wavelengths_um (a table by band name, or one"
                " per input channel)"
            )
        if len(waves) != self.in_chans:
            raise UserError(f"dofa: {len(waves)} wavelengths for {self.in_chans} input channels")
        waves = torch.tensor(waves, dtype=torch.float32)
        self.register_buffer("wavelengths_um", waves, persistent=False)
        t = self.trunk
        self.patch_embed = DynamicPatchEmbed(wv_planes, t.patch_size, t.embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, t.embed_dim))
        pos = sincos_2d(t.embed_dim, self.grid, cls_token=True)
        self.pos_embed = nn.Parameter(pos, requires_grad=False)
        self.blocks = t.blocks()
        self.norm = nn.LayerNorm(t.embed_dim, eps=t.norm_eps)

    def features(self, x: Tensor) -> list[Tensor]:
        """(B, D, H/16, W/16) per output layer, class token dropped."""
        t = self.patch_embed(x, self.wavelengths_um) + self.pos_embed[:, 1:]
        outs = with_cls_token(
            self.blocks, t, self.cls_token, self.pos_embed, self.output_layers, self.norm
        )
        return [tokens_to_map(o[:, 1:], self.grid) for o in outs]
