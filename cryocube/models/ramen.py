"""RAMEN mono-temporal encoder: per-pixel spectral embedding, scale resampler, timm ViT-B blocks
(docs/models.md); the band of each channel, not its position, picks its embedding."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import UserError
from .base import Encoder, Trunk, sincos_1d, sincos_2d, tokens_to_map, with_cls_token
from .registry import register_architecture

POLS = ("asc_vv", "asc_vh", "asc_hv", "asc_hh", "des_vv", "des_vh", "des_hv", "des_hh")
MODALITY_ORDER = ("optical", "sar")


def _mlp(dim: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim), nn.LayerNorm(dim)
    )


class SpectralProjector(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.mlp = _mlp(dim, hidden)

    def forward(self, wavelengths_nm: Tensor) -> Tensor:
        """Per-band embeddings (C, D) from wavelengths in nm (sin-cos, then MLP), for all pixels."""
        return self.mlp(sincos_1d(self.mlp[0].in_features, wavelengths_nm, torch.float32))


class RadarProjector(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        for p in POLS:
            self.register_parameter(f"{p}_param", nn.Parameter(torch.empty(dim).normal_(0.0, 0.02)))
        self.mlp = _mlp(dim, hidden)

    def forward(self, pols: list[str]) -> Tensor:
        """Per-band embeddings (C, D): each polarisation's learned vector, through the MLP."""
        return self.mlp(torch.stack([getattr(self, f"{p}_param") for p in pols], dim=0))


class ScaleResampler(nn.Module):
    def __init__(self, dim: int, num_experts: int = 4):
        super().__init__()
        self.experts = nn.ModuleList(nn.Conv2d(dim, dim, 1) for _ in range(num_experts))
        self.mlp = nn.Sequential(
            nn.Linear(dim, dim // 4), nn.GELU(), nn.Linear(dim // 4, num_experts)
        )
        self.temperature = nn.Parameter(torch.tensor(0.7))
        self.dim = dim

    def forward(self, x: Tensor, scale: float) -> Tensor:
        """Bilinear resize by `scale`, plus a residual mix of 1x1-conv experts chosen by scale."""
        x = F.interpolate(x, scale_factor=scale, mode="bilinear", align_corners=False)
        log_scale = torch.log(torch.tensor([scale], device=x.device, dtype=torch.float32))
        emb = sincos_1d(self.dim, log_scale, torch.float32).to(x.dtype)
        w = (self.mlp(emb) / self.temperature.clamp(min=1e-3)).softmax(dim=-1)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            out = out + w[0, i] * expert(x)
        return x + out


def modality_groups(where: str, slots, wavelengths_nm: dict, polarisations: dict) -> dict:
    """Input channel indices per modality (optical by wavelength, sar by polarisation)."""
    if not wavelengths_nm and not polarisations:
        raise UserError(
            f"{where}: ramen needs arch.wavelengths_nm and arch.polarisations (band name ->"
            " embedding)"
        )
    bad = sorted(set(polarisations.values()) - set(POLS))
    if bad:
        raise UserError(
            f"{where}: arch.polarisations names {bad}, not among the projector's {POLS}"
        )
    groups: dict[str, list[int]] = {}
    for k, s in enumerate(slots):
        if s not in wavelengths_nm and s not in polarisations:
            raise UserError(
                f"ramen has no embedding for band {s!r} (known:"
                f" {sorted(wavelengths_nm) + sorted(polarisations)})"
            )
        groups.setdefault("optical" if s in wavelengths_nm else "sar", []).append(k)
    return groups


@register_architecture("ramen")
class RamenEncoder(Encoder):
    trunk = Trunk()

    def build(
        self,
        input_res: float = 10.0,
        res: float = 40.0,
        band_slots: list[str] | None = None,
        wavelengths_nm: dict[str, float] | None = None,
        polarisations: dict[str, str] | None = None,
    ):
        """Each channel's band comes from the match (or arch band_slots): embeddings are by band."""
        slots = band_slots or (self.match.slots if self.match is not None else None)
        if slots is None:
            raise UserError(
                "ramen needs the band of each input channel: pass bands= (or band_slots=)"
            )
        if len(slots) != self.in_chans:
            raise UserError(f"ramen: {len(slots)} band slots for {self.in_chans} channels")
        waves, pols = dict(wavelengths_nm or {}), dict(polarisations or {})
        groups = modality_groups(self.spec.path, slots, waves, pols)
        self.modalities = [m for m in MODALITY_ORDER if m in groups]
        for m in self.modalities:
            self.register_buffer(f"idx_{m}", torch.tensor(groups[m]), persistent=False)
        optical = [float(waves[slots[k]]) for k in groups.get("optical", [])]
        waves = torch.tensor(optical, dtype=torch.float32)
        self.register_buffer("wavelengths_nm", waves, persistent=False)
        self.pols = [str(pols[slots[k]]) for k in groups.get("sar", [])]
        self.input_res, self.res = float(input_res), float(res)
        self.scale = self.input_res / self.res
        self.grid = int(self.input_size * self.scale)
        if self.grid < 1:
            raise UserError(
                f"ramen: input_size {self.input_size} x input_res {input_res} / res {res} leaves no"
                " token"
            )
        embed_dim = self.trunk.embed_dim
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.spectral_projector = SpectralProjector(embed_dim, embed_dim * 2)
        if "sar" in self.modalities:
            self.radar_projector = RadarProjector(embed_dim, embed_dim * 2)
        self.resampler = ScaleResampler(embed_dim)
        self.in_norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.blocks = self.trunk.blocks()
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        pos = sincos_2d(embed_dim, self.grid, scale=self.res, cls_token=True)
        self.register_buffer("pos_embed", pos, persistent=False)
        self.same_outputs(embed_dim * len(self.modalities), self.res / self.input_res)
        # checkpoint parts this instance does not build (other modalities, the multi-temporal L-TAE)
        self.unused_checkpoint_keys = r"(dem_projector|ltae)\..*" + (
            "" if "sar" in self.modalities else r"|radar_projector\..*"
        )

    def feature_shapes(self, size: int | None = None):
        """The built g x g token grid for every output, whatever `size`: RAMEN is fixed-size."""
        return [(c, self.grid, self.grid) for c in self.output_channels]

    def features(self, x: Tensor) -> list[Tensor]:
        """(B, D x modalities, g, g) per output layer, optical first, class token dropped."""
        tokens = []
        for m in self.modalities:
            xm = x.index_select(1, getattr(self, f"idx_{m}")).permute(0, 2, 3, 1)  # (B, H, W, Cm)
            enc = (
                self.spectral_projector(self.wavelengths_nm)
                if m == "optical"
                else self.radar_projector(self.pols)
            )
            f = (xm @ enc.to(xm.dtype)).permute(0, 3, 1, 2)  # (B, D, H, W)
            f = self.resampler(f, self.scale)
            if f.shape[-1] != self.grid or f.shape[-2] != self.grid:
                f = F.interpolate(f, size=(self.grid, self.grid), mode="bilinear")
            tokens.append(self.in_norm(f.flatten(2).transpose(1, 2)))
        pos = self.pos_embed.to(x.dtype)
        t = torch.cat(tokens, dim=1) + pos[:, 1:].repeat(1, len(self.modalities), 1)
        outs = with_cls_token(self.blocks, t, self.cls_token, pos, self.output_layers, self.norm)
        n = self.grid**2  # each modality's run of n tokens, side by side on channels
        return [tokens_to_map(torch.cat(o[:, 1:].split(n, dim=1), dim=-1), self.grid) for o in outs]
