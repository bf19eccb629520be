"""UPerNet head (PPM + FPN) with the Feature2Pyramid neck, as the PANGAEA/Cryo-Bench protocol
uses it (docs/models.md)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

NECK_SCALES = (4, 2, 1, 0.5)


class _Bilinear(torch.autograd.Function):
    """torch's bilinear resize (align_corners=False) whose backward keeps a channels_last layout:
    torch's own copies the strided gradient cat's backward hands each FPN level to NCHW and runs
    its NCHW kernel (UPerNet-512, 56x56, 2 CPU threads: 40 ms a call against 1-3 ms)."""

    @staticmethod
    def forward(ctx, x: Tensor, size: tuple[int, int]) -> Tensor:
        ctx.input_size = tuple(x.shape)
        ctx.layout = (
            torch.channels_last
            if x.dim() == 4
            and not x.is_contiguous()
            and x.is_contiguous(memory_format=torch.channels_last)
            else torch.contiguous_format
        )
        return F.interpolate(x, size=size, mode="bilinear", align_corners=False)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        grad = grad.contiguous(memory_format=ctx.layout)
        size = list(grad.shape[2:])
        dx = torch.ops.aten.upsample_bilinear2d_backward(grad, size, list(ctx.input_size), False)
        return dx, None


def resize(x: Tensor, size) -> Tensor:
    """F.interpolate's bilinear (align_corners=False) values, channels_last kept in backward."""
    return _Bilinear.apply(x, tuple(int(v) for v in size))


def shifted_resize(n: int, size: int, k: int, like: Tensor) -> Tensor:
    """(k, size, n): bilinear resize (align_corners=False) of n points to `size` as a matrix, its
    rows shifted by each offset of a k-wide kernel (zero beyond the border, as a conv's padding)."""
    eye = torch.eye(n, dtype=torch.float64, device=like.device)[None, None]
    m = F.interpolate(eye, size=(n, size), mode="bilinear", align_corners=False)[0, 0].T
    out = m.new_zeros((k, size, n))
    for t in range(k):
        d = t - k // 2
        out[t, max(0, -d) : size - max(0, d)] = m[max(0, d) : size - max(0, -d)]
    return out.to(like.dtype)


def fused_conv(conv: nn.Conv2d, maps: list[Tensor]) -> Tensor:
    """conv(cat([maps[0], *maps[1:] resized to its size])), the coarser maps' share mixed at their
    own size: channel mixing commutes with the per-channel resize, so each coarse map's k*k taps
    are 1x1 convolutions, resized and shifted by two matrix products (exact up to rounding;
    UPerNet's fusion in about a quarter of the FLOPs). On CPU in NCHW, where it measured faster;
    CUDA and channels_last (AMX) keep the cat."""
    x, (H, W) = maps[0], maps[0].shape[2:]
    if (
        x.device.type != "cpu"
        or len(maps) < 2
        or not x.is_contiguous()
        or any(m.shape[2:].numel() >= H * W for m in maps[1:])
    ):
        return conv(torch.cat([x, *(resize(m, (H, W)) for m in maps[1:])], dim=1))
    C, w, k = x.shape[1], conv.weight, conv.kernel_size[0]
    coarse = w[:, C:]  # the coarse maps' input channels: only they become 1x1 taps
    per_tap = coarse.permute(2, 3, 0, 1).reshape(k * k * w.shape[0], coarse.shape[1], 1, 1)
    cols, rows = [], []  # per map: (B, n, k*h, W) resized along W, (H, k*h) to resize along H
    for i, m in enumerate(maps[1:]):
        taps = F.conv2d(m, per_tap[:, i * C : (i + 1) * C]).unflatten(1, (k, k, -1))
        along_w = shifted_resize(m.shape[3], W, k, m)
        cols.append(torch.einsum("bdxcij,xWj->bcdiW", taps, along_w).flatten(2, 3))
        rows.append(shifted_resize(m.shape[2], H, k, m).transpose(0, 1).flatten(1))
    base = F.conv2d(x, w[:, :C], conv.bias, padding=k // 2)
    return base + torch.cat(rows, 1) @ torch.cat(cols, 2)


def up_lateral(op: nn.Module, lateral: nn.Sequential, x: Tensor) -> Tensor:
    """lateral(op(x)). Where op ends in a transposed conv and the lateral starts with a 1x1 conv,
    both linear, they are one transposed conv of weight W_lat . W_up: the up-conv then mixes
    c -> c channels at the input's size only, and the lateral's c -> 512 disappears (ViT-L's x4
    level: 19.7 -> 8.7 GMAC at batch 4). Taken when the FLOPs say so, the composed weight
    included; exact up to rounding."""
    steps = list(op) if isinstance(op, nn.Sequential) else [op]
    up, first = steps[-1], lateral[0]
    if not (
        isinstance(up, nn.ConvTranspose2d)
        and isinstance(first, nn.Conv2d)
        and first.kernel_size == first.stride == (1, 1)
        and first.padding == (0, 0)
        and up.groups == first.groups == 1
    ):
        return lateral(op(x))
    for step in steps[:-1]:
        x = step(x)
    (b, cin, h, w), c, o = x.shape, up.out_channels, first.out_channels
    kk = up.kernel_size[0] * up.kernel_size[1]
    out_px = (h - 1) * up.stride[0] + up.kernel_size[0], (w - 1) * up.stride[1] + up.kernel_size[1]
    separate = b * h * w * kk * cin * c + b * out_px[0] * out_px[1] * c * o
    if b * h * w * kk * cin * o + kk * cin * c * o >= separate:
        return lateral(up(x))
    w_lat = first.weight[:, :, 0, 0]
    # einsum's strides would make the output channels_last, and the fusion then take the cat form
    weight = torch.einsum("ichw,oc->iohw", up.weight, w_lat).contiguous()
    bias = first.bias
    if up.bias is not None:
        bias = w_lat @ up.bias if bias is None else bias + w_lat @ up.bias
    y = F.conv_transpose2d(
        x, weight, bias, up.stride, up.padding, up.output_padding, 1, up.dilation
    )
    return lateral[1:](y)


def conv_bn_relu(cin: int, cout: int, k: int) -> nn.Sequential:
    """Conv-BN-ReLU, padding k // 2: every lateral, FPN and bottleneck conv of UPerNet."""
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, padding=k // 2), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)
    )


RESCALE = {  # neck rescale -> its op on a map of c channels
    4: lambda c: nn.Sequential(
        nn.ConvTranspose2d(c, c, 2, 2), nn.BatchNorm2d(c), nn.GELU(), nn.ConvTranspose2d(c, c, 2, 2)
    ),
    2: lambda c: nn.Sequential(nn.ConvTranspose2d(c, c, 2, 2)),
    1: lambda c: nn.Identity(),
    0.5: lambda c: nn.MaxPool2d(2, 2),
}


class Feature2Pyramid(nn.Module):
    """Turns same-resolution ViT maps into a 4-level pyramid (x4, x2, x1, x0.5)."""

    def __init__(self, channels: list[int], rescales: list[float]):
        super().__init__()
        self.rescales = list(rescales)  # each one of NECK_SCALES (or 1: a pyramid as it is)
        self.ops = nn.ModuleList(RESCALE[k](c) for c, k in zip(channels, rescales))


class AdaptiveAvgPool2d(nn.AdaptiveAvgPool2d):
    """torch's adaptive average pool; on CUDA under deterministic algorithms the same bins as two
    matrix products, as CUDA's own backward adds with atomics (equal runs would differ in bits)."""

    def forward(self, x: Tensor) -> Tensor:
        """The matrix form only on CUDA with deterministic algorithms on."""
        if not (x.is_cuda and torch.are_deterministic_algorithms_enabled()):
            return super().forward(x)
        return adaptive_avg_pool_mm(x, self.output_size)


def adaptive_avg_pool_mm(x: Tensor, output_size) -> Tensor:
    """Adaptive average pooling as P_h · x · P_wᵀ (backward: matrix products, no atomics)."""
    oh, ow = (output_size, output_size) if isinstance(output_size, int) else output_size
    h, w = x.shape[-2:]
    ph, pw = pool_matrix(oh or h, h, x), pool_matrix(ow or w, w, x)
    return torch.einsum("ih,nchw,jw->ncij", ph, x, pw)


def pool_matrix(out: int, size: int, like: Tensor) -> Tensor:
    """(out, size) weights of adaptive pooling's bins [floor(i*size/out), ceil((i+1)*size/out))."""
    m = torch.zeros(out, size, dtype=like.dtype, device=like.device)
    for i in range(out):
        a, b = (i * size) // out, -((-(i + 1) * size) // out)
        m[i, a:b] = 1.0 / (b - a)
    return m


class PPM(nn.ModuleList):
    def __init__(self, pool_scales, cin: int, channels: int):
        super().__init__(
            nn.Sequential(AdaptiveAvgPool2d(s), *conv_bn_relu(cin, channels, 1))
            for s in pool_scales
        )

    def forward(self, x: Tensor) -> list[Tensor]:
        """Each pool scale's map upsampled back to the input's size."""
        return [resize(m(x), x.shape[2:]) for m in self]


class UPerNet(nn.Module):
    def __init__(
        self,
        in_channels: list[int],
        num_classes: int,
        pyramid: bool = False,
        channels: int = 512,
        pool_scales=(1, 2, 3, 6),
        dropout: float = 0.1,
        neck: bool = True,
    ):
        super().__init__()
        self.in_channels = list(in_channels)
        self.num_classes = num_classes
        n = len(in_channels)  # pyramids as they are, else x4, x2, x1, x0.5 by depth
        rescales = [1] * n if pyramid else [NECK_SCALES[int(i / n * 4)] for i in range(n)]
        self.neck = Feature2Pyramid(self.in_channels, rescales) if neck else None
        self.psp_modules = PPM(pool_scales, self.in_channels[-1], channels)
        self.bottleneck = conv_bn_relu(
            self.in_channels[-1] + len(pool_scales) * channels, channels, 3
        )
        self.lateral_convs = nn.ModuleList(
            conv_bn_relu(c, channels, 1) for c in self.in_channels[:-1]
        )
        self.fpn_convs = nn.ModuleList(
            conv_bn_relu(channels, channels, 3) for _ in self.in_channels[:-1]
        )
        self.fpn_bottleneck = conv_bn_relu(len(self.in_channels) * channels, channels, 3)
        self.dropout = nn.Dropout2d(dropout)
        self.conv_seg = nn.Conv2d(channels, num_classes, 1)

    def forward(self, features: list[Tensor], out_size: tuple[int, int]) -> Tensor:
        """Neck, PPM on the last map, top-down FPN, fusion at the finest level, logits resized."""
        # a ViT's maps are its tokens transposed (channels_last in memory); in the module's own
        # layout, so that an NCHW decoder's fusion takes its tap form (fused_conv)
        nchw = self.fpn_bottleneck[0].weight.is_contiguous()
        fmt = torch.contiguous_format if nchw else torch.channels_last
        feats = [f.contiguous(memory_format=fmt) for f in features]
        ops = list(self.neck.ops) if self.neck is not None else [nn.Identity()] * len(feats)
        if len(feats) != len(ops):
            raise ValueError(f"neck expects {len(ops)} feature maps, got {len(feats)}")
        laterals = [up_lateral(op, lat, f) for op, lat, f in zip(ops, self.lateral_convs, feats)]
        top = ops[-1](feats[-1])
        laterals.append(self.bottleneck(torch.cat([top, *self.psp_modules(top)], dim=1)))
        for i in range(len(laterals) - 1, 0, -1):
            laterals[i - 1] = laterals[i - 1] + resize(laterals[i], laterals[i - 1].shape[2:])
        outs = [self.fpn_convs[i](laterals[i]) for i in range(len(laterals) - 1)] + [laterals[-1]]
        x = self.fpn_bottleneck[1:](fused_conv(self.fpn_bottleneck[0], outs))
        x = self.conv_seg(self.dropout(x))
        return resize(x, out_size)
