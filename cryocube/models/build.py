"""`build_encoder`: a catalog model spec (or id) + the cube's bands -> an encoder module, weights
loaded."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from ..catalog import Band
from ..errors import UserError
from .bands import BandMatch, match_bands
from .registry import architectures
from .spec import ModelSpec, model_spec
from .weights import load_weights


def build_encoder(
    model: str | ModelSpec,
    bands: Sequence[Band] | None = None,
    weights: str | None = None,
    input_size: int | None = None,
    rule: str = "named",
    match: BandMatch | None = None,
    sha256: str | None = None,
    follow_reference: bool = False,
    **overrides,
):
    """The encoder `model`, random unless `weights` (a local path or fsspec URL). `bands` decide the
    input channels through the band match (`rule`, or `match`), else the spec's slots (or
    `in_chans=`); `overrides` change the catalog's `arch:`; `follow_reference` switches every
    deviation (docs/deviations.md) to the reference's behaviour."""
    spec: ModelSpec = model if isinstance(model, ModelSpec) else model_spec(model)
    if follow_reference:
        spec = spec.following_reference()
    if match is None and bands is not None:
        match = match_bands(spec, bands, rule)
    size = input_size or spec.input_size
    if size is None:
        raise UserError(f"model {spec.id!r} takes the dataset tile size: pass input_size=")
    in_chans = overrides.pop("in_chans", None)
    if match is not None:
        in_chans = match.in_chans
    elif in_chans is None and spec.takes_dataset_bands:
        raise UserError(f"model {spec.id!r} takes the dataset's bands: pass bands= (or in_chans=)")
    elif in_chans is None:
        in_chans = len(spec.slots)
    known = architectures()
    if spec.architecture not in known:
        raise UserError(
            f"{spec.path}: unknown architecture {spec.architecture!r}; known: {sorted(known)}"
        )
    allow_pickle = overrides.pop("allow_pickle", None)
    layers = overrides.pop("output_layers", None)
    if layers is not None:  # e.g. Prithvi's upstream [3, 5, 7, 11], or shallow test models
        spec = dataclasses.replace(spec, output_layers=[int(i) for i in layers], output_channels=[])
    arch = {**spec.arch, **overrides}
    try:
        enc = known[spec.architecture](
            spec=spec, in_chans=in_chans, input_size=int(size), match=match, **arch
        )
    except TypeError as e:  # an argument under `arch:` that the architecture does not take
        raise UserError(
            f"{spec.path}: arch does not fit architecture {spec.architecture!r}: {e}"
        ) from None
    if layers is not None:
        enc.spec = dataclasses.replace(spec, output_channels=list(enc.output_channels))
    if weights is not None:
        load_weights(enc, weights, sha256=sha256, allow_pickle=allow_pickle)
    return enc
