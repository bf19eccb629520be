"""Model specs: the facts of catalogs/models/<id>.yaml as typed, validated objects.

An encoder's architecture arguments, input bands, output layers and weights source live in the
catalog, not in code, so `cryocube inspect`, the band matcher and the engine all read one truth.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..catalog import CatalogError, band_names, find, ids, load_yaml, need


@dataclass(frozen=True)
class WeightsSpec:
    url: str | None  # None: no public URL (fetch by hand, then pass a local path)
    sha256: str | None  # None: not published; fetch prints the digest it computed
    key_map: str  # name of the checkpoint key map (cryocube.models.keymap registry)
    filename: str | None = None
    # checkpoint holds non-tensor objects (args, configs): needs full unpickling
    allow_pickle: bool = False
    notes: str = ""


@dataclass(frozen=True)
class Deviation:
    """A place where this model's wrapper chooses differently from the Cryo-Bench reference, on
    purpose.

    `follow` is the switch that reproduces the reference: architecture arguments (`arch`) and
    checkpoint keys the reference's loader drops (`drop_keys`, a regex on our key names).
    docs/deviations.md lists every deviation; a run record names those in effect."""

    name: str
    reference: str
    cryocube: str
    why: str
    arch: dict[str, Any] = field(default_factory=dict)
    drop_keys: str | None = None


@dataclass(frozen=True)
class ModelSpec:
    """A model config: one catalogs/models/<id>.yaml, typed. `architecture` names the registered
    builder (models/registry.py) that turns it into an encoder; `arch` holds that builder's
    arguments."""

    id: str
    architecture: str
    display_name: str
    input_size: int | None  # None: the dataset tile size
    input_bands: list[str] | str  # Cryo-Bench band names, or "dataset" (all usable cube bands)
    sar_bands: list[str]
    output_layers: list[int]
    output_channels: list[int]
    pyramid: bool
    pretrained: bool
    weights: WeightsSpec | None
    params_m: float | None  # published (measured on the reference code, pangaea-models.md 1.5)
    gflops: float | None
    licence: str
    # bands/input_size/arch the figures were measured with
    published_setup: dict[str, Any] = field(default_factory=dict)
    arch: dict[str, Any] = field(default_factory=dict)
    # a decoder this encoder always takes (U-Net's up path), else the recipe's
    decoder: str | None = None
    benchmark_entry: str = ""
    dataset_modalities: tuple[str, ...] = ("optical", "sar")  # for input_bands == "dataset"
    reference_config: str = ""
    notes: str = ""
    path: str = ""
    deviations: tuple[Deviation, ...] = ()  # in effect unless following the reference
    followed: tuple[str, ...] = ()  # deviations switched to the reference's behaviour
    # set by following_reference(): keys the reference's loader drops
    drop_checkpoint_keys: str | None = None

    def following_reference(self) -> "ModelSpec":
        """This spec with every deviation switched to the reference's behaviour (`follow_reference:
        true`)."""
        if not self.deviations:
            return self
        drops = [d.drop_keys for d in self.deviations if d.drop_keys]
        arch = dict(self.arch)
        for d in self.deviations:
            arch.update(d.arch)
        return dataclasses.replace(
            self,
            arch=arch,
            deviations=(),
            followed=self.followed + tuple(d.name for d in self.deviations),
            drop_checkpoint_keys="|".join(f"(?:{r})" for r in drops) or None,
        )

    def deviation_record(self) -> dict:
        """The run record's `deviations` field: deviations from the reference in effect, and those
        followed."""
        return {"in_effect": [d.name for d in self.deviations], "followed": list(self.followed)}

    @property
    def takes_dataset_bands(self) -> bool:
        """`input_bands: dataset`: no fixed slots; the encoder takes every cube band of its
        dataset_modalities (in_chans from the match)."""
        return self.input_bands == "dataset"

    @property
    def optical_only(self) -> bool:
        """No SAR slot: such encoders get SAR/grey data only through the cross-sensor rule."""
        return not self.sar_bands

    @property
    def slots(self) -> list[str]:
        """Fixed encoder input slots (optical first, then SAR); empty for dataset-band encoders."""
        if self.takes_dataset_bands:
            return []
        return list(self.input_bands) + list(self.sar_bands)


def _band_list(v, where: str, key: str) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(b, str) for b in v):
        raise CatalogError(f"{where}: {key} must be a list of band names, got {v!r}")
    unknown = [b for b in v if b not in band_names().all]
    if unknown:
        raise CatalogError(
            f"{where}: {key} has names that are not Cryo-Bench band names: {unknown}"
        )
    return list(v)


def parse_model(d: dict, where: str) -> ModelSpec:
    """A model YAML mapping checked field by field (band names, layer/channel counts, weights,
    published setup, deviations); `where` names the file in errors."""
    ib = need(d, "input_bands", where)
    if ib != "dataset":
        ib = _band_list(ib, where, "input_bands")
    sar = _band_list(d.get("sar_bands", []) or [], where, "sar_bands")
    layers = need(d, "output_layers", where, list)
    chans = need(d, "output_channels", where, list)
    if len(layers) != len(chans):
        raise CatalogError(
            f"{where}: output_layers {layers} and output_channels {chans} differ in length"
        )
    size = d.get("input_size")
    if size is not None and not isinstance(size, int):
        raise CatalogError(
            f"{where}: input_size must be an integer or null (the dataset tile size), got {size!r}"
        )
    w = d.get("weights")
    weights = None
    if w is not None:
        if not isinstance(w, dict):
            raise CatalogError(f"{where}: weights must be a mapping")
        weights = WeightsSpec(
            url=w.get("url"),
            sha256=w.get("sha256"),
            key_map=str(need(w, "key_map", f"{where}: weights")),
            filename=w.get("filename"),
            allow_pickle=bool(w.get("allow_pickle", False)),
            notes=str(w.get("notes", "")).strip(),
        )
    pretrained = bool(d.get("pretrained", True))
    if pretrained and weights is None:
        raise CatalogError(f"{where}: a pretrained model needs a weights section")
    pub = d.get("published", {}) or {}
    setup = pub.get("setup") or {}
    if not isinstance(setup, dict) or set(setup) - {"bands", "input_size", "arch"}:
        raise CatalogError(
            f"{where}: published.setup takes bands, input_size and arch, got {setup!r}"
        )
    if "bands" in setup:
        setup = {**setup, "bands": _band_list(setup["bands"], where, "published.setup.bands")}
    devs = []
    for i, dv in enumerate(d.get("deviations", []) or []):
        w_ = f"{where}: deviations[{i}]"
        if not isinstance(dv, dict):
            raise CatalogError(f"{w_} must be a mapping")
        unknown = set(dv) - {"name", "reference", "cryocube", "why", "follow"}
        if unknown:
            raise CatalogError(f"{w_} has unknown fields {sorted(unknown)}")
        follow = dv.get("follow") or {}
        if not isinstance(follow, dict) or set(follow) - {"arch", "drop_keys"}:
            raise CatalogError(
                f"{w_}: follow must be a mapping with arch and/or drop_keys, got {follow!r}"
            )
        devs.append(
            Deviation(
                name=str(need(dv, "name", w_)),
                reference=str(need(dv, "reference", w_)).strip(),
                cryocube=str(need(dv, "cryocube", w_)).strip(),
                why=str(need(dv, "why", w_)).strip(),
                arch=dict(follow.get("arch") or {}),
                drop_keys=follow.get("drop_keys"),
            )
        )
    mods = tuple(d.get("dataset_modalities", ("optical", "sar")))
    return ModelSpec(
        id=str(need(d, "id", where)),
        architecture=str(need(d, "architecture", where)),
        display_name=str(need(d, "display_name", where)),
        input_size=size,
        input_bands=ib,
        sar_bands=sar,
        output_layers=[int(x) for x in layers],
        output_channels=[int(x) for x in chans],
        pyramid=bool(d.get("pyramid", False)),
        pretrained=pretrained,
        weights=weights,
        params_m=pub.get("params_m"),
        gflops=pub.get("gflops"),
        published_setup=dict(setup),
        licence=str(d.get("licence", "")),
        arch=dict(d.get("arch", {}) or {}),
        decoder=(str(d["decoder"]) if d.get("decoder") else None),
        benchmark_entry=str(d.get("benchmark_entry", d["id"])),
        dataset_modalities=mods,
        reference_config=str(d.get("reference_config", "")),
        notes=str(d.get("notes", "")).strip(),
        path=where,
        deviations=tuple(devs),
    )


def list_models() -> list[str]:
    """Ids of every model in the catalogs."""
    return ids("models")


@lru_cache(maxsize=None)
def model_spec(model_id: str) -> ModelSpec:
    """The spec of a model by id (catalogs/models/<id>.yaml) or by a YAML path."""
    path = find("models", model_id)
    spec = parse_model(load_yaml("models", str(path)), str(path))
    if not model_id.endswith((".yaml", ".yml")) and spec.id != model_id:
        raise CatalogError(f"{path}: id {spec.id!r} does not match the file name {model_id!r}")
    return spec
