"""Band matching: which cube band feeds which encoder input slot, by band name as the reference
does, under a protocol's rule (docs/models.md), as a printable table."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import cycle
from typing import Sequence

from ..catalog import Band, band_names
from ..errors import BandMatchError, UserError
from .spec import ModelSpec

RULES = ("named", "cross_sensor", "rendered_rgb")
# the band role of a rendered picture's channels (catalogs/datasets/hephaestus.yaml)
RENDERED = "rendering"


def reference_modality(band: Band) -> str | None:
    """The PANGAEA modality a band would be declared under in a Cryo-Bench dataset config."""
    names = band_names()
    if band.alias in names.sar:
        return "sar"
    if band.alias in names.optical:
        return "optical"
    return None  # not a Cryo-Bench band name: no reference config declares it


@dataclass(frozen=True)
class BandMatch:
    model_id: str
    rule: str
    slots: list[str]  # encoder input slots, in input-channel order
    index: list[int]  # cube band index per slot, -1 = zero-filled (the mean after normalisation)
    replicated: bool  # the cross-sensor rule put SAR/grey bands into RGB slots
    bands: tuple[Band, ...]  # the cube's bands (all of them)
    slot_modality: list[str] = field(default_factory=list)  # "optical" / "sar" per slot
    # cube band index -> why it is not fed
    unused_reasons: dict[int, str] = field(default_factory=dict)

    @property
    def in_chans(self) -> int:
        """One channel per slot, zero-filled included: build_encoder sizes the encoder by it."""
        return len(self.index)

    @property
    def zero_slots(self) -> list[str]:
        """Slots no band feeds (0 = the band mean); the table lists them so a thin match shows."""
        return [s for s, i in zip(self.slots, self.index) if i < 0]

    def slot_band(self, k: int) -> Band | None:
        """The band feeding slot `k`, None if zero-filled: how embed's provenance names inputs."""
        i = self.index[k]
        return self.bands[i] if i >= 0 else None

    def table(self) -> str:
        """The match as `cryocube inspect --bands` prints it, with every band not fed and why."""
        rows = [("slot", "cube band", "alias", "role", "wavelength_um")]
        for k, (slot, i) in enumerate(zip(self.slots, self.index)):
            if i < 0:
                rows.append((slot, "(zero = band mean)", "", "", ""))
            else:
                b = self.bands[i]
                wl = "" if math.isnan(b.wavelength_um) else f"{b.wavelength_um:g}"
                rows.append((slot, f"[{i}] {b.name}", b.alias, b.role, wl))
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        rep = " (cross-sensor: SAR/grey bands replicated into RGB slots)" if self.replicated else ""
        lines = [f"band match: {self.model_id}, rule={self.rule}{rep}"]
        lines += [fmt.format(*r).rstrip() for r in rows]
        used = {i for i in self.index if i >= 0}
        for i, b in enumerate(self.bands):
            if i not in used:
                why = self.unused_reasons.get(i, "no encoder slot takes it")
                lines.append(f"not fed: [{i}] {b.name} (alias {b.alias}, {b.role}): {why}")
        z = self.zero_slots
        if z:
            lines.append(f"zero-filled slots ({len(z)}/{len(self.slots)}): {', '.join(z)}")
        return "\n".join(lines)


def _error(
    spec: ModelSpec, bands: Sequence[Band], rule: str, slots: Sequence[str], hint: str
) -> BandMatchError:
    desc = ", ".join(f"{b.name} (alias {b.alias}, {b.role})" for b in bands) or "none"
    wanted = ", ".join(slots) or "the dataset bands of modalities " + "/".join(
        spec.dataset_modalities
    )
    return BandMatchError(
        f"model {spec.id!r} cannot take any band of this dataset (bands rule {rule}): dataset"
        f" bands: {desc}; encoder slots: {wanted}."
        f" {hint}"
    )


def _rendered_rgb(spec: ModelSpec, bands: tuple[Band, ...], rule: str) -> BandMatch:
    """The rendered_rgb rule (module docstring): rendered R, G, B into the encoder's RGB slots."""
    rgb_slots = list(band_names().rgb_slots)
    rendered = [i for i, b in enumerate(bands) if b.role == RENDERED]
    slots = rgb_slots if spec.takes_dataset_bands else spec.slots
    if len(rendered) < 3 or not all(s in slots for s in rgb_slots):
        why = (
            f"it has {len(rendered)} bands of role {RENDERED!r} (needs 3: red, green, blue)"
            if len(rendered) < 3
            else "the encoder has no red, green and blue slots"
        )
        raise _error(spec, bands, rule, slots, f"The rendered_rgb rule cannot apply: {why}.")
    fill = dict(zip(rgb_slots, rendered[:3]))
    index = [fill.get(s, -1) for s in slots]
    reasons = {
        i: (
            "a rendered grey layer (coherence): no slot of this encoder takes it"
            if b.role == RENDERED
            else "not part of the rendered picture"
        )
        for i, b in enumerate(bands)
        if i not in index
    }
    modality = ["sar" if s in band_names().sar else "optical" for s in slots]
    return BandMatch(spec.id, rule, slots, index, False, bands, modality, reasons)


def match_bands(
    spec: ModelSpec, bands: Sequence[Band], rule: str = "named", offers_cross_sensor: bool = True
) -> BandMatch:
    """Which cube band feeds each encoder slot; `offers_cross_sensor`: whether the caller has a
    cross_sensor protocol to suggest when nothing fits (evaluate has, embed has not)."""
    if rule not in RULES:
        raise UserError(f"unknown band-matching rule {rule!r}; use one of {RULES}")
    bands = tuple(bands)
    if rule == "rendered_rgb":
        return _rendered_rgb(spec, bands, rule)
    slots, index, modality, reasons = (
        _dataset_slots(spec, bands) if spec.takes_dataset_bands else _model_slots(spec, bands)
    )
    if any(i >= 0 for i in index):
        return BandMatch(spec.id, rule, slots, index, False, bands, modality, reasons)
    no_optical = not any(reference_modality(b) == "optical" for b in bands)
    rgb = list(band_names().rgb_slots)
    src = [i for i, b in enumerate(bands) if b.role != "optical"]
    if rule == "cross_sensor" and spec.optical_only and no_optical and src:
        slots = slots or rgb
        if all(s in slots for s in rgb):
            fill = dict(zip(rgb, cycle(src)))  # cycled until the slots are full
            index = [fill.get(s, -1) for s in slots]
            why = "more non-optical bands than RGB slots"
            reasons = {i: why for i in range(len(bands)) if i not in index}
            modality = modality or ["optical"] * len(rgb)
            return BandMatch(spec.id, rule, slots, index, True, bands, modality, reasons)
    hint = (
        "Use the cross_sensor protocol (bands rule cross_sensor) to feed SAR/grey bands into"
        " the RGB slots of an optical-only encoder."
        if rule == "named" and spec.optical_only and no_optical and offers_cross_sensor
        else "Choose an encoder that takes these bands."
    )
    raise _error(spec, bands, rule, [] if spec.takes_dataset_bands else slots, hint)


def _model_slots(spec: ModelSpec, bands: tuple[Band, ...]):
    """The encoder's own slots, each fed by the first band of that alias (-1: none)."""
    by_alias = {b.alias: i for i, b in reversed(list(enumerate(bands)))}  # the first one wins
    index = [by_alias.get(s, -1) for s in spec.slots]
    reasons = {
        i: f"alias {b.alias!r} is not one of the encoder's slots"
        for i, b in enumerate(bands)
        if i not in index
    }
    modality = ["sar" if s in band_names().sar else "optical" for s in spec.slots]
    return list(spec.slots), index, modality, reasons


def _dataset_slots(spec: ModelSpec, bands: tuple[Band, ...]):
    """`input_bands: dataset` encoders take every band a Cryo-Bench config would declare."""
    index, slots, modality, reasons = [], [], [], {}
    for i, b in enumerate(bands):
        m = reference_modality(b)
        if m is None:
            reasons[i] = (
                f"alias {b.alias!r} is not a Cryo-Bench band name (no reference config declares it)"
            )
        elif m not in spec.dataset_modalities:
            reasons[i] = (
                f"the reference encoder reads only the {'/'.join(spec.dataset_modalities)} modality"
            )
        else:
            index.append(i)
            slots.append(b.alias)
            modality.append(m)
    return slots, index, modality, reasons
