"""Linear probe head: a 1x1 conv on the last feature map, sized by that map's width, unlike the
reference's (docs/models.md)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class LinearHead(nn.Module):
    def __init__(self, in_channels: list[int], num_classes: int, layer: int = -1):
        super().__init__()
        self.layer = layer
        self.num_classes = num_classes
        self.conv_seg = nn.Conv2d(in_channels[layer], num_classes, 1)

    def forward(self, features: list[Tensor], out_size: tuple[int, int]) -> Tensor:
        """Reads only the map at `layer`, whose width sized the conv."""
        x = self.conv_seg(features[self.layer])
        return F.interpolate(x, size=tuple(out_size), mode="bilinear", align_corners=False)
