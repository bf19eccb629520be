"""Segmentation heads that take an encoder's feature list: `build_decoder(kind, encoder,
num_classes)`.

A decoder's forward is `(features, out_size) -> logits (B, K, *out_size)`, so the engine can cache
frozen-encoder features and train the head on them alone.
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

from ..errors import UserError
from .linear import LinearHead
from .unet import UNetDecoder
from .upernet import UPerNet

_DECODERS: dict[str, Callable[..., nn.Module]] = {}
_OPTIONS: dict[str, tuple[str, ...]] = {}  # recipe-driven keyword arguments each decoder takes


def register_decoder(name: str, options: tuple[str, ...] = ()):
    """Decorator adding a head builder `(encoder, num_classes, **kw)` under `name`; `options` names
    the recipe-driven keywords (e.g. "channels") it takes."""

    def deco(fn):
        _DECODERS[name], _OPTIONS[name] = fn, tuple(options)
        return fn

    return deco


def decoder_options(kind: str) -> tuple[str, ...]:
    """The keyword arguments (e.g. "channels") a decoder kind takes from the recipe."""
    if kind not in _DECODERS:
        raise UserError(f"unknown decoder {kind!r}; known: {decoder_kinds()}")
    return _OPTIONS[kind]


@register_decoder("upernet", options=("channels",))
def _upernet(encoder, num_classes: int, **kw) -> nn.Module:
    return UPerNet(list(encoder.output_channels), num_classes, pyramid=bool(encoder.pyramid), **kw)


@register_decoder("linear")
def _linear(encoder, num_classes: int, **kw) -> nn.Module:
    return LinearHead(list(encoder.output_channels), num_classes, **kw)


@register_decoder("unet")
def _unet(encoder, num_classes: int, **kw) -> nn.Module:
    red = list(getattr(encoder, "output_reductions", []))
    if len(red) < 2 or any(a != 2 * b for a, b in zip(red, red[1:])):
        raise UserError(
            "the U-Net decoder needs skip maps coarsest first, each twice the resolution of the"
            f" one before; {encoder.spec.id!r} returns maps at reductions {red}"
        )
    return UNetDecoder(list(encoder.output_channels), num_classes, **kw)


def decoder_kinds() -> list[str]:
    """What a recipe's `decoder` field may name, sorted as the refusals list them."""
    return sorted(_DECODERS)


def build_decoder(kind: str, encoder, num_classes: int, **kw) -> nn.Module:
    """A head of `kind` ("upernet", "linear", "unet") sized for `encoder`'s outputs."""
    decoder_options(kind)  # refuses an unknown kind
    if num_classes < 1:
        raise UserError(f"num_classes must be >= 1, got {num_classes}")
    dec = _DECODERS[kind](encoder, num_classes, **kw)
    # saved with decoder checkpoints so load_decoder can rebuild the head
    dec.kind, dec.build_kwargs = kind, dict(kw)
    return dec


class Segmenter(nn.Module):
    """Encoder + decoder end to end (fine-tuning and scratch baselines): logits at the input
    size."""

    def __init__(self, encoder: nn.Module, decoder: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    def forward(self, x: Tensor) -> Tensor:
        """The decoder is asked for the input's own size, so fine-tuning scores full-resolution
        logits."""
        return self.decoder(self.encoder(x), tuple(x.shape[-2:]))
