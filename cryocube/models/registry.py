"""Registry of encoder families and `build_encoder`.

Each family module (croma.py, dofa.py, ...) registers a builder with `@register_family("name")`;
the catalog's `family` field picks it. No if-chains on model names anywhere else.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, Sequence

from ..catalog import Band
from ..errors import UserError
from .bands import BandMatch, match_bands
from .spec import ModelSpec, model_spec

FAMILY_MODULES = (
    "croma", "dofa", "gfm", "prithvi", "remoteclip", "satlas", "scalemae", "spectralgpt",
    "ssl4eo", "terramind", "ramen", "unet", "vit",
)

Builder = Callable[..., "object"]
_FAMILIES: dict[str, Builder] = {}
_loaded = False


def register_family(name: str):
    def deco(fn: Builder) -> Builder:
        if name in _FAMILIES:
            raise ValueError(f"encoder family {name!r} registered twice")
        _FAMILIES[name] = fn
        return fn

    return deco


def load_families() -> None:
    global _loaded
    if not _loaded:
        for m in FAMILY_MODULES:
            importlib.import_module(f"{__package__}.{m}")
        _loaded = True


def families() -> list[str]:
    load_families()
    return sorted(_FAMILIES)


def build_encoder(
    model_id: str,
    bands: Sequence[Band] | None = None,
    weights: str | None = None,
    input_size: int | None = None,
    mode: str = "protocol",
    match: BandMatch | None = None,
    sha256: str | None = None,
    **overrides,
):
    """Build the encoder `model_id` (random init unless `weights`, a local path or fsspec URL).

    `bands` (the cube's bands) decide the input channels through the band match (`mode`, or an
    explicit `match`); without bands the spec's own slots are used (dataset-band encoders then need
    `in_chans=`). `input_size` is required for encoders whose catalog input_size is null (the tile
    size). `overrides` change architecture arguments of the catalog (e.g. `drop_path_rate=0`).
    """
    load_families()
    spec: ModelSpec = model_spec(model_id)
    if match is None and bands is not None:
        match = match_bands(spec, bands, mode)
    size = input_size or spec.input_size
    if size is None:
        raise UserError(f"model {model_id!r} takes the dataset tile size: pass input_size=")
    if match is not None:
        in_chans = match.in_chans
    elif "in_chans" in overrides:
        in_chans = int(overrides.pop("in_chans"))
    elif spec.takes_dataset_bands:
        raise UserError(f"model {model_id!r} takes the dataset's bands: pass bands= (or in_chans=)")
    else:
        in_chans = len(spec.slots)
    overrides.pop("in_chans", None)
    if spec.family not in _FAMILIES:
        raise UserError(f"{spec.path}: unknown family {spec.family!r}; known: {sorted(_FAMILIES)}")
    allow_pickle = overrides.pop("allow_pickle", None)
    layers = overrides.pop("output_layers", None)
    if layers is not None:  # e.g. Prithvi's upstream [3, 5, 7, 11], or shallow test models
        spec = dataclasses.replace(spec, output_layers=[int(i) for i in layers], output_channels=[])
    arch = {**spec.arch, **overrides}
    enc = _FAMILIES[spec.family](spec=spec, in_chans=in_chans, input_size=int(size), match=match, **arch)
    if layers is not None:
        enc.spec = dataclasses.replace(spec, output_channels=list(enc.output_channels))
    if weights is not None:
        from .weights import load_weights

        load_weights(enc, weights, sha256=sha256, allow_pickle=allow_pickle)
    return enc
