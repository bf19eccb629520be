"""Typed specs for the YAML catalogs (datasets, models, benchmarks).

The catalogs are facts (bands, classes, sources); code reads them only through these specs so a
malformed entry fails once, at load, with the file and field named.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from .errors import UserError


def packaged_dir(packaged: str, in_repo: str) -> Path:
    """A data folder of the repository (`in_repo`, relative to its root) or, in an installed wheel,
    its copy inside the package (`packaged`, see pyproject's package-dir)."""
    here = Path(__file__).resolve().parent
    return here / packaged if (here / packaged).is_dir() else here.parent / in_repo


# $CRYOCUBE_CATALOGS points at another catalog tree (e.g. a lab's own datasets and models)
CATALOG_DIR = Path(os.environ.get("CRYOCUBE_CATALOGS") or packaged_dir("catalogs", "catalogs"))
# Band roles the cube and the band matcher understand.
ROLES = ("optical", "sar", "coherence", "elevation", "slope", "velocity", "thermal", "incidence", "ancillary")
CUBE_IGNORE_INDEX = -1  # every cube stores ignore/padding pixels as -1, whatever the source used


class CatalogError(UserError, ValueError):
    """A catalog file is missing a field or has a value of the wrong kind."""


@dataclass(frozen=True)
class Band:
    name: str  # what the layer is (e.g. "coherence")
    alias: str  # the name the Cryo-Bench configs give it (drives protocol-compatible band matching)
    role: str
    wavelength_um: float = math.nan
    sensor: str = ""
    units: str = ""
    mean: float = math.nan  # published statistics, kept for comparison with the cube's own
    std: float = math.nan
    min: float = math.nan
    max: float = math.nan


@dataclass(frozen=True)
class ClassSpec:
    name: str
    colour: str


@dataclass(frozen=True)
class Layout:
    name: str
    label_map: dict[int, int]  # raw label value -> class index
    ignore_values: tuple[int, ...] = ()  # raw values that become CUBE_IGNORE_INDEX
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DatasetSpec:
    id: str
    name: str
    task: str
    tile_size: int
    dtype: str
    bands: tuple[Band, ...]
    classes: tuple[ClassSpec, ...]
    layouts: dict[str, Layout]
    sources: dict[str, dict[str, Any]]
    nan_policy: str = "error"  # "error": NaN is bad input; "fill": replace by nan_fill
    nan_fill: float = 0.0
    doi: str = ""
    licence: str = ""
    description: str = ""
    sensors: tuple[str, ...] = ()
    class_distribution: tuple[float, ...] = ()
    path: str = ""

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def band_names(self) -> list[str]:
        return [b.name for b in self.bands]

    def layout(self, name: str) -> Layout:
        if name not in self.layouts:
            raise CatalogError(f"dataset {self.id!r} has no layout {name!r}; known: {sorted(self.layouts)}")
        return self.layouts[name]


def need(d: dict, key: str, where: str, kind: type | tuple[type, ...] | None = None):
    if key not in d:
        raise CatalogError(f"{where}: missing field {key!r}")
    v = d[key]
    if kind is not None and not isinstance(v, kind):
        raise CatalogError(f"{where}: field {key!r} should be {kind}, got {type(v).__name__} ({v!r})")
    return v


def _float(v, where: str) -> float:
    if v is None:
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        raise CatalogError(f"{where}: {v!r} is not a number") from None


def _band(d: Any, where: str) -> Band:
    if not isinstance(d, dict):
        raise CatalogError(f"{where}: a band must be a mapping, got {d!r}")
    role = need(d, "role", where, str)
    if role not in ROLES:
        raise CatalogError(f"{where}: role {role!r} is not one of {ROLES}")
    name = str(need(d, "name", where))
    return Band(
        name=name,
        alias=str(d.get("alias", name)),
        role=role,
        wavelength_um=_float(d.get("wavelength_um"), where),
        sensor=str(d.get("sensor", "")),
        units=str(d.get("units", "")),
        mean=_float(d.get("mean"), where),
        std=_float(d.get("std"), where),
        min=_float(d.get("min"), where),
        max=_float(d.get("max"), where),
    )


def _layout(name: str, d: Any, where: str) -> Layout:
    if not isinstance(d, dict):
        raise CatalogError(f"{where}: layout must be a mapping")
    lm = need(d, "label_map", where, dict)
    try:
        label_map = {int(k): int(v) for k, v in lm.items()}
    except (TypeError, ValueError):
        raise CatalogError(f"{where}: label_map must map integers to integers, got {lm!r}") from None
    ignore = tuple(int(v) for v in d.get("ignore_values", []) or [])
    opts = {k: v for k, v in d.items() if k not in ("label_map", "ignore_values")}
    return Layout(name=name, label_map=label_map, ignore_values=ignore, options=opts)


def parse_dataset(d: Any, where: str) -> DatasetSpec:
    if not isinstance(d, dict):
        raise CatalogError(f"{where}: top level must be a mapping")
    bands = need(d, "bands", where, list)
    classes = need(d, "classes", where, list)
    layouts = need(d, "layouts", where, dict)
    spec = DatasetSpec(
        id=str(need(d, "id", where)),
        name=str(need(d, "name", where)),
        task=str(d.get("task", "segmentation")),
        tile_size=int(need(d, "tile_size", where, int)),
        dtype=str(need(d, "dtype", where, str)),
        bands=tuple(_band(b, f"{where}: bands[{i}]") for i, b in enumerate(bands)),
        classes=tuple(
            ClassSpec(str(need(c, "name", f"{where}: classes[{i}]")), str(c.get("colour", "#808080")))
            for i, c in enumerate(classes)
        ),
        layouts={k: _layout(k, v, f"{where}: layouts.{k}") for k, v in layouts.items()},
        sources=dict(d.get("sources", {}) or {}),
        nan_policy=str(d.get("nan_policy", "error")),
        nan_fill=float(d.get("nan_fill", 0.0)),
        doi=str(d.get("doi", "")),
        licence=str(d.get("licence", "")),
        description=str(d.get("description", "")).strip(),
        sensors=tuple(d.get("sensors", []) or []),
        class_distribution=tuple(float(x) for x in d.get("class_distribution", []) or []),
        path=where,
    )
    if spec.nan_policy not in ("error", "fill"):
        raise CatalogError(f"{where}: nan_policy must be 'error' or 'fill', got {spec.nan_policy!r}")
    names = spec.band_names
    if len(set(names)) != len(names):
        raise CatalogError(f"{where}: duplicate band names in {names}")
    for lay in spec.layouts.values():
        bad = [v for v in lay.label_map.values() if not 0 <= v < spec.num_classes]
        if bad:
            raise CatalogError(f"{where}: layout {lay.name!r} maps to class indices {bad} outside 0..{spec.num_classes - 1}")
    return spec


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise CatalogError(f"{path}: not valid YAML: {e}") from None


@lru_cache(maxsize=None)
def load_dataset(dataset_id: str, catalog_dir: str | None = None) -> DatasetSpec:
    """The spec of a dataset by id (file catalogs/datasets/<id>.yaml) or by a YAML path."""
    p = Path(dataset_id)
    if p.suffix not in (".yaml", ".yml"):
        p = Path(catalog_dir or CATALOG_DIR) / "datasets" / f"{dataset_id.lower()}.yaml"
    if not p.exists():
        raise CatalogError(f"unknown dataset {dataset_id!r}: no catalog file {p} (known: {', '.join(dataset_ids())})")
    return parse_dataset(_read_yaml(p), str(p))


def dataset_ids(catalog_dir: str | None = None) -> list[str]:
    return sorted(p.stem for p in (Path(catalog_dir or CATALOG_DIR) / "datasets").glob("*.yaml"))


def load_yaml(kind: str, name: str, catalog_dir: str | None = None) -> dict:
    """Raw mapping of catalogs/<kind>/<name>.yaml (models and benchmarks parse their own fields)."""
    p = Path(name)
    if p.suffix not in (".yaml", ".yml"):
        p = Path(catalog_dir or CATALOG_DIR) / kind / f"{name}.yaml"
    if not p.exists():
        raise CatalogError(f"unknown {kind[:-1]} {name!r}: no catalog file {p}")
    d = _read_yaml(p)
    if not isinstance(d, dict):
        raise CatalogError(f"{p}: top level must be a mapping")
    return d
