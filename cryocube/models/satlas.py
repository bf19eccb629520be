"""SatlasNet Sentinel-2 encoder: torchvision swin_v2_b with a 9-band stem, kept whole as in the
reference (docs/models.md)."""

from __future__ import annotations

import torchvision
from torch import Tensor, nn

from .base import Encoder
from .registry import register_architecture


@register_architecture("satlas_swin")
class SatlasSwinEncoder(Encoder):
    def build(self, arch: str = "swin_v2_b"):
        """`arch` may name another torchvision Swin (default swin_v2_b)."""
        self.backbone = getattr(torchvision.models, arch)()
        c = self.backbone.features[0][0].out_channels
        self.backbone.features[0][0] = nn.Conv2d(self.in_chans, c, kernel_size=4, stride=4)
        self.output_channels = [c * 2**i for i in self.output_layers]
        self.output_reductions = [4.0 * 2**i for i in self.output_layers]

    def features(self, x: Tensor) -> list[Tensor]:
        """The stage outputs output_layers picks (strides 4, 8, 16, 32; channels C to 8C), NCHW."""
        outs = []
        for i, layer in enumerate(self.backbone.features):
            x = layer(x)
            if i in (1, 3, 5, 7):
                outs.append(x.permute(0, 3, 1, 2).contiguous())
        return [outs[i] for i in self.output_layers]
