"""The encoder contract every architecture implements (band-matched, normalised (B, in_chans, H, W)
in, one (B, C_i, h_i, w_i) map per output layer out, sizes known without a forward pass), and the
pieces architectures share: the timm block trunk, layer taps, patches, sin-cos embeddings."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, fields, replace
from functools import partial

import torch
from timm.models.vision_transformer import Block
from torch import Tensor, nn

from .bands import BandMatch
from .spec import ModelSpec


@dataclass(frozen=True)
class Trunk:
    """The `arch:` arguments the ViT-shaped architectures share; each class sets its defaults."""

    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    patch_size: int = 16
    norm_eps: float = 1e-6
    drop_path_rate: float = 0.0

    def blocks(self, qkv_bias: bool = True, norm_layer=None, **block) -> nn.ModuleList:
        """`depth` timm Blocks, stochastic depth rising linearly from 0 to `drop_path_rate`."""
        norm_layer = norm_layer or partial(nn.LayerNorm, eps=self.norm_eps)
        n, rate = self.depth, self.drop_path_rate
        rates = [rate * i / (n - 1) if n > 1 else 0.0 for i in range(n)]
        return nn.ModuleList(
            Block(
                self.embed_dim,
                self.num_heads,
                self.mlp_ratio,
                qkv_bias,
                drop_path=r,
                norm_layer=norm_layer,
                **block,
            )
            for r in rates
        )


class Encoder(nn.Module):
    """Base class and the builder an architecture registers: `cls(spec, in_chans, input_size, match,
    **arch)` calls `build(**arch)`; an unknown argument is a TypeError build_encoder reports."""

    #: whether H, W must equal input_size, or only be divisible by `size_multiple`
    fixed_size: bool = True
    size_multiple: int = 1
    #: the shared ViT arguments' defaults, if any; `build` reads `self.trunk` and `self.grid`
    trunk: Trunk | None = None

    def __init__(
        self,
        spec: ModelSpec,
        in_chans: int,
        input_size: int,
        match: BandMatch | None = None,
        **arch,
    ):
        super().__init__()
        self.spec = spec
        self.in_chans = int(in_chans)
        self.input_size = int(input_size)
        self.match = match
        self.output_channels: list[int] = list(spec.output_channels)
        self.output_reductions: list[float] = []
        self.pyramid = spec.pyramid
        shared = {f.name for f in fields(Trunk)} if self.trunk else set()
        unused = set(arch) - set(inspect.signature(self.build).parameters) - shared
        if unused:
            raise TypeError(f"{spec.id}: unknown architecture arguments {sorted(unused)}")
        if self.trunk:
            self.trunk = replace(self.trunk, **{k: arch.pop(k) for k in shared & set(arch)})
            self.grid = self.input_size // self.trunk.patch_size
        self.build(**arch)
        if self.trunk and not self.output_reductions:  # ViT-shaped: every map at the patch stride
            self.same_outputs(self.trunk.embed_dim, self.trunk.patch_size)

    def build(self) -> None:  # pragma: no cover - abstract
        """What an architecture implements: its layers, from the catalog's `arch:` arguments."""
        raise NotImplementedError

    def same_outputs(self, channels: int, reduction: float) -> None:
        """Every output layer is one map of `channels` at `reduction` (the ViT-shaped encoders)."""
        n = len(self.spec.output_layers)
        self.output_channels, self.output_reductions = [channels] * n, [float(reduction)] * n

    @property
    def output_layers(self) -> list[int]:
        """Read from the spec, so a build-time output_layers override reaches `features`."""
        return list(self.spec.output_layers)

    def features(self, x: Tensor) -> list[Tensor]:  # pragma: no cover - abstract
        """What an architecture implements: one (B, C_i, h_i, w_i) map per output layer."""
        raise NotImplementedError

    def forward(self, x: Tensor) -> list[Tensor]:
        """Refuses an input band matching would not produce (channels, side) before `features`."""
        if x.ndim != 4 or x.shape[1] != self.in_chans:
            raise ValueError(
                f"{self.spec.id}: expected input (B, {self.in_chans}, H, W) after band matching,"
                f" got {tuple(x.shape)}"
            )
        h, w = x.shape[-2:]
        if self.fixed_size and (h, w) != (self.input_size, self.input_size):
            raise ValueError(
                f"{self.spec.id}: expected {self.input_size}x{self.input_size} input, got {h}x{w}"
            )
        if not self.fixed_size and (h % self.size_multiple or w % self.size_multiple):
            raise ValueError(
                f"{self.spec.id}: input side must be a multiple of {self.size_multiple}, got"
                f" {h}x{w}"
            )
        return self.features(x)

    def feature_shapes(self, size: int | None = None) -> list[tuple[int, int, int]]:
        """(C, h, w) of every output at `size` (default input_size), without running the model."""
        s = size or self.input_size
        return [
            (c, int(s // r), int(s // r))
            for c, r in zip(self.output_channels, self.output_reductions)
        ]

    def extra_repr(self) -> str:
        """Names the model and input in print(encoder), which otherwise shows only layers."""
        return f"model={self.spec.id}, in_chans={self.in_chans}, input_size={self.input_size}"


def timm_intermediates(model: nn.Module, x: Tensor, layers: list[int]) -> list[Tensor]:
    """A timm model's (B, D, H/p, W/p) maps after the blocks `layers`, before its final norm."""
    return list(
        model.forward_intermediates(
            x,
            indices=layers,
            norm=False,
            output_fmt="NCHW",
            intermediates_only=True,
            stop_early=True,
        )
    )


def patches(x: Tensor, p: int, pixel_major: bool = False) -> Tensor:
    """(B, C, H, W) -> (B, N, C*p*p) patches, channel-major (CROMA) or pixel-major (TerraMind)."""
    b, c, h, w = x.shape
    x = x.reshape(b, c, h // p, p, w // p, p)
    x = x.permute(0, 2, 4, 3, 5, 1) if pixel_major else x.permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // p) * (w // p), c * p * p)


def collect_layers(
    blocks,
    t: Tensor,
    layers: list[int],
    *,
    norm: nn.Module | None = None,
    norm_after_final: bool = False,
    stop_early: bool = True,
    **block_kwargs,
) -> tuple[list[Tensor], Tensor]:
    """(tokens after each block index in `layers`, the last tokens computed) of `blocks` on `t`;
    `norm_after_final` norms right after the final block (DOFA, RAMEN)."""
    wanted, last = set(layers), max(layers)
    outs = []
    for i, blk in enumerate(blocks):
        t = blk(t, **block_kwargs)
        if norm_after_final and i == len(blocks) - 1:
            t = norm(t)
        if i in wanted:
            outs.append(t)
        if stop_early and i == last:
            break
    return outs, t


def with_cls_token(
    blocks, t: Tensor, cls_token, pos: Tensor, layers: list[int], norm
) -> list[Tensor]:
    """The taps of `blocks` on a class token (at `pos[:, :1]`) and `t`, normed after the last."""
    cls = (cls_token + pos[:, :1]).expand(t.shape[0], -1, -1)
    t = torch.cat([cls, t], dim=1)
    return collect_layers(blocks, t, layers, norm=norm, norm_after_final=True)[0]


def tokens_to_map(tokens: Tensor, grid: int) -> Tensor:
    """(B, N, C) patch tokens -> (B, C, grid, grid) in row-major patch order."""
    b, n, c = tokens.shape
    if n != grid * grid:
        raise ValueError(f"{n} tokens do not form a {grid}x{grid} grid")
    return tokens.transpose(1, 2).reshape(b, c, grid, grid)


def _meshgrid(grid: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    r = torch.arange(grid, dtype=dtype)
    return torch.meshgrid(r, r, indexing="ij")


def sincos_1d(dim: int, pos: Tensor, dtype: torch.dtype = torch.float64) -> Tensor:
    """MAE 1-D sin-cos: [sin(pos*w), cos(pos*w)], w = 1/10000^(k/(dim/2)); (M, dim). DOFA's and
    RAMEN's references compute in float32: pretrained kernels see the same inputs."""
    if dim % 2:
        raise ValueError("sin-cos embedding dimension must be even")
    omega = torch.arange(dim // 2, dtype=dtype, device=pos.device) / (dim / 2.0)
    omega = 1.0 / 10000**omega
    out = pos.reshape(-1).to(dtype)[:, None] * omega[None, :]
    return torch.cat([torch.sin(out), torch.cos(out)], dim=1).float()


def sincos_2d(dim: int, grid: int, scale: float = 1.0, cls_token: bool = False) -> Tensor:
    """MAE 2-D sin-cos (first half the column, second the row; `scale`: Scale-MAE's GSD scaling of
    the coordinates); (1, [1+]grid^2, dim)."""
    rows, cols = _meshgrid(grid, torch.float64)
    emb = torch.cat([sincos_1d(dim // 2, cols * scale), sincos_1d(dim // 2, rows * scale)], dim=1)
    if cls_token:
        emb = torch.cat([torch.zeros(1, dim), emb], dim=0)
    return emb.unsqueeze(0)


def sincos_2d_mocov3(dim: int, grid: int) -> Tensor:
    """MoCo-v3 2-D sin-cos in float32 (sin, cos of the row, then the column); (1, grid^2, dim)."""
    if dim % 4:
        raise ValueError("MoCo-v3 sin-cos embedding needs a dimension divisible by 4")
    rows, cols = _meshgrid(grid, torch.float32)
    halves = [sincos_1d(dim // 2, x, torch.float32) for x in (rows, cols)]
    return torch.cat(halves, dim=1).unsqueeze(0)


def sincos_3d(dim: int, grid: tuple[int, int, int], cls_token: bool = False) -> Tensor:
    """Prithvi 3-D sin-cos (width, height, time: 6/16, 6/16, 4/16); (1, [1+]T*H*W, dim)."""
    if dim % 16:
        raise ValueError("3-D sin-cos embedding needs a dimension divisible by 16")
    t, h, w = grid
    wd, hd, td = dim // 16 * 6, dim // 16 * 6, dim // 16 * 4
    tt, hh, ww = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
    emb = torch.cat([sincos_1d(wd, ww), sincos_1d(hd, hh), sincos_1d(td, tt)], dim=1)
    if cls_token:
        emb = torch.cat([torch.zeros(1, dim), emb], dim=0)
    return emb.unsqueeze(0)


def count_params(module: nn.Module) -> int:
    """Frozen parameters (fixed position embeddings) count too; profiles set it beside params_m."""
    return sum(p.numel() for p in module.parameters())
