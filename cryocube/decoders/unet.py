"""U-Net up path for the U-Net baseline encoder (docs/models.md, pangaea-models.md 2.3)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .upernet import conv_bn_relu


def double_conv(cin: int, cout: int) -> nn.Sequential:
    """conv3x3-BN-ReLU twice; the U-Net baseline encoder (models/unet.py) builds on it too."""
    return nn.Sequential(*conv_bn_relu(cin, cout, 3), *conv_bn_relu(cout, cout, 3))


class Up(nn.Module):
    def __init__(self, cin: int, cskip: int, cout: int):
        super().__init__()
        self.up = nn.ConvTranspose2d(cin, cin, 2, stride=2)
        self.conv = double_conv(cin + cskip, cout)

    def forward(self, x: Tensor, skip: Tensor) -> Tensor:
        """Upsampled, padded to the skip's size (odd sizes lose a pixel going down), skip first."""
        x = self.up(x)
        dy, dx = skip.shape[2] - x.shape[2], skip.shape[3] - x.shape[3]
        x = F.pad(x, (dx // 2, dx - dx // 2, dy // 2, dy - dy // 2))
        return self.conv(torch.cat([skip, x], dim=1))


class UNetDecoder(nn.Module):
    """Takes the encoder's maps coarsest first: [(C4, H/16), (C3, H/8), ..., (C0, H)]."""

    def __init__(self, in_channels: list[int], num_classes: int):
        super().__init__()
        if len(in_channels) < 2:
            raise ValueError("the U-Net decoder needs at least two feature maps")
        skips = list(in_channels[1:])
        outs = skips[1:] + skips[-1:]  # each level ends at the next skip's width
        ins = [in_channels[0], *outs[:-1]]
        self.up_seq = nn.ModuleList(Up(*widths) for widths in zip(ins, skips, outs))
        self.conv_seg = nn.Conv2d(outs[-1], num_classes, 1)
        self.num_classes = num_classes

    def forward(self, features: list[Tensor], out_size: tuple[int, int]) -> Tensor:
        """Up the maps coarsest first; resized only when the up path missed `out_size`."""
        x = features[0]
        for up, skip in zip(self.up_seq, features[1:]):
            x = up(x, skip)
        x = self.conv_seg(x)
        if tuple(x.shape[-2:]) != tuple(out_size):
            x = F.interpolate(x, size=tuple(out_size), mode="bilinear", align_corners=False)
        return x
