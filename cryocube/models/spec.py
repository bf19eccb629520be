"""Model specs: catalogs/models/<id>.yaml as typed, validated objects, the one truth `cryocube
inspect`, the band matcher and the engine read."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..catalog import CatalogError, band_names, find, ids, load_yaml
from ..mapping import from_mapping, rule


@dataclass(frozen=True)
class WeightsSpec:
    key_map: str  # name of the checkpoint key map (cryocube.models.keymap registry)
    url: str | None = None  # None: no public URL (fetch by hand, then pass a local path)
    sha256: str | None = None  # None: not published; fetch prints the digest it computed
    filename: str | None = None
    # checkpoint holds non-tensor objects (args, configs): needs full unpickling
    allow_pickle: bool = False
    notes: str = ""

    def __post_init__(self):
        object.__setattr__(self, "notes", self.notes.strip())


@dataclass(frozen=True)
class Deviation:
    """Where this model's wrapper differs from the reference on purpose (docs/deviations.md);
    `follow` reproduces the reference: `arch` arguments, checkpoint keys its loader drops."""

    name: str
    reference: str
    cryocube: str
    why: str
    arch: dict[str, Any] = rule(factory=dict, key="follow.arch")
    drop_keys: str | None = rule(None, key="follow.drop_keys")

    def __post_init__(self):
        for k in ("reference", "cryocube", "why"):
            object.__setattr__(self, k, getattr(self, k).strip())


@dataclass(frozen=True)
class ModelSpec:
    """One catalogs/models/<id>.yaml, typed; `arch` holds the arguments of its `architecture`."""

    id: str
    architecture: str
    display_name: str
    # Cryo-Bench band names, or "dataset" (all usable cube bands)
    input_bands: list[str] | str = rule(what='a list of band names or "dataset"')
    output_layers: list[int]
    output_channels: list[int]
    input_size: int | None = rule(None, lo=1)  # None: the dataset tile size
    sar_bands: list[str] = rule(factory=list)
    pyramid: bool = False
    pretrained: bool = True
    weights: WeightsSpec | None = None
    # published (measured on the reference code, pangaea-models.md 1.5)
    params_m: float | None = rule(None, key="published.params_m", unit="million")
    gflops: float | None = rule(None, key="published.gflops")
    licence: str = ""
    # bands/input_size/arch the figures were measured with
    published_setup: dict[str, Any] = rule(factory=dict, key="published.setup")
    arch: dict[str, Any] = field(default_factory=dict)
    # a decoder this encoder always takes (U-Net's up path), else the recipe's
    decoder: str | None = None
    benchmark_entry: str = ""  # default: the id
    dataset_modalities: tuple[str, ...] = ("optical", "sar")  # for input_bands == "dataset"
    reference_config: str = ""
    notes: str = ""
    path: str = rule("", internal=True)
    deviations: tuple[Deviation, ...] = ()  # in effect unless following the reference
    # deviations switched to the reference's behaviour
    followed: tuple[str, ...] = rule((), internal=True)
    # set by following_reference(): keys the reference's loader drops
    drop_checkpoint_keys: str | None = rule(None, internal=True)

    def following_reference(self) -> "ModelSpec":
        """This spec with every deviation switched to the reference's behaviour."""
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
        """The run record's `deviations` field: those in effect and those followed."""
        return {"in_effect": [d.name for d in self.deviations], "followed": list(self.followed)}

    @property
    def takes_dataset_bands(self) -> bool:
        """`input_bands: dataset`: no fixed slots, every cube band of its dataset_modalities."""
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


def _band_list(v: list[str], where: str, key: str) -> None:
    unknown = [b for b in v if b not in band_names().all]
    if unknown:
        raise CatalogError(
            f"{where}: {key} has names that are not Cryo-Bench band names: {unknown}"
        )


def parse_model(d: dict, where: str) -> ModelSpec:
    """A model YAML mapping, each field checked by its type (mapping.py), then the rules across
    fields (band names, as many channels as layers, weights of a pretrained model)."""
    spec = from_mapping(ModelSpec, d, where)
    if spec.input_bands != "dataset":
        _band_list(spec.input_bands, where, "input_bands")
    _band_list(spec.sar_bands, where, "sar_bands")
    _band_list(spec.published_setup.get("bands", []), where, "published.setup.bands")
    if set(spec.published_setup) - {"bands", "input_size", "arch"}:
        raise CatalogError(
            f"{where}: published.setup takes bands, input_size and arch, got"
            f" {spec.published_setup!r}"
        )
    if len(spec.output_layers) != len(spec.output_channels):
        raise CatalogError(
            f"{where}: output_layers {spec.output_layers} and output_channels"
            f" {spec.output_channels} differ in length"
        )
    if spec.pretrained and spec.weights is None:
        raise CatalogError(f"{where}: a pretrained model needs a weights section")
    return dataclasses.replace(
        spec, path=where, benchmark_entry=spec.benchmark_entry or spec.id, notes=spec.notes.strip()
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
