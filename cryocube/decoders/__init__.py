"""Segmentation heads on an encoder's feature list, `build_decoder(kind, encoder, num_classes)`: a
decoder's forward is `(features, out_size) -> logits`, so frozen-encoder features can be cached."""

from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

from ..errors import UserError
from .linear import LinearHead
from .unet import UNetDecoder
from .upernet import UPerNet


def _upernet(encoder, num_classes: int, **kw) -> nn.Module:
    return UPerNet(list(encoder.output_channels), num_classes, pyramid=bool(encoder.pyramid), **kw)


def _unet(encoder, num_classes: int, **kw) -> nn.Module:
    red = list(getattr(encoder, "output_reductions", []))
    if len(red) < 2 or any(a != 2 * b for a, b in zip(red, red[1:])):
        raise UserError(
            "the U-Net decoder needs skip maps coarsest first, each twice the resolution of the"
            f" one before; {encoder.spec.id!r} returns maps at reductions {red}"
        )
    return UNetDecoder(list(encoder.output_channels), num_classes, **kw)


# kind -> (builder `(encoder, num_classes, **kw)`, the keywords it takes from the recipe)
_DECODERS: dict[str, tuple[Callable[..., nn.Module], tuple[str, ...]]] = {
    "upernet": (_upernet, ("channels",)),
    "linear": (lambda enc, k, **kw: LinearHead(list(enc.output_channels), k, **kw), ()),
    "unet": (_unet, ()),
}


def decoder_options(kind: str) -> tuple[str, ...]:
    """The keyword arguments (e.g. "channels") a decoder kind takes from the recipe."""
    if kind not in _DECODERS:
        raise UserError(f"unknown decoder {kind!r}; known: {decoder_kinds()}")
    return _DECODERS[kind][1]


def decoder_kinds() -> list[str]:
    """What a recipe's `decoder` field may name, sorted as the refusals list them."""
    return sorted(_DECODERS)


def build_decoder(kind: str, encoder, num_classes: int, **kw) -> nn.Module:
    """A head of `kind` ("upernet", "linear", "unet") sized for `encoder`'s outputs."""
    decoder_options(kind)  # refuses an unknown kind
    if num_classes < 1:
        raise UserError(f"num_classes must be >= 1, got {num_classes}")
    dec = _DECODERS[kind][0](encoder, num_classes, **kw)
    # saved with decoder checkpoints so load_decoder can rebuild the head
    dec.kind, dec.build_kwargs = kind, dict(kw)
    return dec


class Segmenter(nn.Module):
    """Encoder + decoder end to end (fine-tuning, scratch baselines): logits at the input size."""

    def __init__(self, encoder: nn.Module, decoder: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    def forward(self, x: Tensor) -> Tensor:
        """Logits at the input's own size, so fine-tuning scores full resolution."""
        return self.decoder(self.encoder(x), tuple(x.shape[-2:]))
