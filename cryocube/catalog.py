"""Typed specs for the YAML catalogs, so a malformed entry fails once, at load, naming the file and
field; files are looked up in the folders of $CRYOCUBE_CATALOGS first, then in cryocube's."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import yaml

from .errors import CatalogError, FieldError, UserError, yaml_problem
from .mapping import from_mapping, rule


def packaged_dir(packaged: str, in_repo: str) -> Path:
    """A data folder of the repository (`in_repo`) or its copy in an installed wheel."""
    here = Path(__file__).resolve().parent
    return here / packaged if (here / packaged).is_dir() else here.parent / in_repo


CATALOG_DIR = packaged_dir("catalogs", "catalogs")  # the catalogs shipped with cryocube
# Band roles the cube and the band matcher understand.
ROLES = tuple(
    "optical sar coherence elevation slope velocity thermal incidence ancillary phase"
    " rendering".split()
)
# a dataset's task when its YAML names none (Cryo-Bench's tiles, ranked on its boards)
DEFAULT_TASK = "segmentation"
CUBE_IGNORE_INDEX = -1  # every cube stores ignore/padding pixels as -1, whatever the source used


def catalog_dirs() -> list[Path]:
    """Where catalog files are looked up, first match wins: $CRYOCUBE_CATALOGS, then cryocube's."""
    extra = [Path(p) for p in os.environ.get("CRYOCUBE_CATALOGS", "").split(os.pathsep) if p]
    return extra + [CATALOG_DIR]


@dataclass(frozen=True)
class Band:
    name: str  # what the layer is (e.g. "coherence")
    role: str = rule(choices=ROLES)
    # the Cryo-Bench configs' name for it (protocol-compatible band matching); default: its name
    alias: str = ""
    wavelength_um: float = rule(math.nan, unit="µm")
    sensor: str = ""
    units: str = ""
    mean: float = math.nan  # published statistics, kept for comparison with the cube's own
    std: float = math.nan
    min: float = math.nan
    max: float = math.nan

    def __post_init__(self):
        object.__setattr__(self, "alias", self.alias or self.name)


@dataclass(frozen=True)
class ClassSpec:
    name: str
    colour: str = "#808080"


@dataclass(frozen=True)
class Layout:
    """One published raw layout of a dataset: its reader (cryocube.convert), options and labels."""

    name: str
    reader: str  # reader name (see `cryocube list readers`)
    label_map: dict[int, int]  # raw label value -> class index
    ignore_values: tuple[int, ...] = ()  # raw values that become CUBE_IGNORE_INDEX
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DatasetSpec:
    id: str
    name: str
    tile_size: int = rule(lo=1)
    dtype: str
    bands: tuple[Band, ...]
    classes: tuple[ClassSpec, ...]
    layouts: dict[str, Layout]
    short_name: str = ""  # as tables print it (GLID, CaFFe, ...); default: the id
    task: str = DEFAULT_TASK
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    # "error": NaN is bad input; "fill": replace by nan_fill
    nan_policy: str = rule("error", choices=("error", "fill"))
    nan_fill: float = 0.0
    doi: str = ""
    article: str = ""
    licence: str = ""
    description: str = ""
    sensors: tuple[str, ...] = ()
    class_distribution: tuple[float, ...] = ()
    time: tuple[str, ...] = ()  # names of the time steps of multi-temporal datasets (e.g. seasons)
    # other published (mean, std) sets: set name -> {band: (mean, std)}
    statistics: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)
    # the organisers' mean embedding: band groups, grid
    mean_baseline: dict[str, Any] = field(default_factory=dict)
    # band-matching rule of `embed` (no protocol to choose one): see models/bands.py
    embed_bands: str = "named"
    path: str = rule("", internal=True)

    def __post_init__(self):
        object.__setattr__(self, "short_name", self.short_name or self.id)
        object.__setattr__(self, "description", self.description.strip())

    @property
    def num_classes(self) -> int:
        """Class indices run 0..num_classes-1; parse_dataset refuses label maps pointing outside."""
        return len(self.classes)

    @property
    def band_names(self) -> list[str]:
        """In catalog order; parse_dataset refuses duplicates, so a name picks exactly one band."""
        return [b.name for b in self.bands]

    def layout(self, name: str) -> Layout:
        """A raw layout by name; an unknown one is a CatalogError listing the dataset's layouts."""
        if name not in self.layouts:
            raise CatalogError(
                f"dataset {self.id!r} has no layout {name!r}; known: {sorted(self.layouts)}"
            )
        return self.layouts[name]


def _layout(name: str, d: Any, where: str) -> Layout:
    """A layout's label map, ignored values and reader; every other key is the reader's option."""
    if not isinstance(d, dict):
        raise CatalogError(f"{where}: layout must be a mapping")
    own = {k: v for k, v in d.items() if k in ("label_map", "ignore_values", "reader")}
    options = {k: v for k, v in d.items() if k not in own}
    return from_mapping(Layout, {**own, "name": name, "options": options}, where)


def parse_dataset(d: Any, where: str) -> DatasetSpec:
    """A dataset YAML mapping checked as a whole (unique bands, statistics, label maps)."""
    if isinstance(d, dict) and isinstance(d.get("layouts"), dict):
        d = d | {
            "layouts": {k: _layout(k, v, f"{where}: layouts.{k}") for k, v in d["layouts"].items()}
        }
    spec = replace(from_mapping(DatasetSpec, d, where), path=where)
    names = spec.band_names
    if len(set(names)) != len(names):
        raise CatalogError(f"{where}: duplicate band names in {names}")
    for sname, table in spec.statistics.items():
        unknown = sorted(set(table) - set(names))
        if unknown:
            raise CatalogError(
                f"{where}: statistics.{sname} names bands {unknown} that the dataset does not have"
            )
    for lay in spec.layouts.values():
        bad = [v for v in lay.label_map.values() if not 0 <= v < spec.num_classes]
        if bad:
            raise CatalogError(
                f"{where}: layout {lay.name!r} maps to class indices {bad} outside"
                f" 0..{spec.num_classes - 1}"
            )
    return spec


def read_yaml(path: Path, error: type[UserError] = CatalogError) -> Any:
    """A YAML file's content; unreadable or not YAML is one sentence naming the file."""
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML ({yaml_problem(e)})") from None
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror})") from None


def find(kind: str, name: str) -> Path:
    """The catalog file of `name` under catalogs/<kind>/, or `name` itself when a YAML path."""
    p = Path(name)
    if p.suffix in (".yaml", ".yml"):
        if not p.is_file():
            raise CatalogError(f"catalog file {p} does not exist")
        return p
    for d in catalog_dirs():
        q = d / kind / f"{name}.yaml"
        if q.is_file():
            return q
    singular = kind[:-1] if kind.endswith("s") else kind
    raise CatalogError(
        f"unknown {singular} {name!r} (known: {', '.join(ids(kind)) or 'none'}; "
        f"searched {', '.join(str(d / kind) for d in catalog_dirs())})"
    )


def ids(kind: str) -> list[str]:
    """Every id under catalogs/<kind>/ in the search path."""
    return sorted({p.stem for d in catalog_dirs() for p in (d / kind).glob("*.yaml")})


def load_yaml(kind: str, name: str) -> dict:
    """Raw mapping of catalogs/<kind>/<name>.yaml (models parse their own fields)."""
    p = find(kind, name)
    d = read_yaml(p)
    if not isinstance(d, dict):
        raise CatalogError(f"{p}: top level must be a mapping")
    return d


@lru_cache(maxsize=None)
def load_dataset(dataset_id: str) -> DatasetSpec:
    """The spec of a dataset by id (catalogs/datasets/<id>.yaml) or by a YAML path."""
    by_path = dataset_id.endswith((".yaml", ".yml"))
    p = find("datasets", dataset_id if by_path else dataset_id.lower())
    spec = parse_dataset(read_yaml(p), str(p))
    if p.stem != spec.id and not by_path:
        raise CatalogError(f"{p}: id {spec.id!r} does not match the file name")
    return spec


def dataset_ids() -> list[str]:
    """Dataset ids in the search path, lab catalogs too: what CLIs list and tell from cube paths."""
    return ids("datasets")


def _top_file(name: str) -> Path:
    for d in catalog_dirs():
        if (d / name).is_file():
            return d / name
    raise CatalogError(f"no {name} in {', '.join(map(str, catalog_dirs()))}")


# -- the band vocabulary ---------------------------------------------------------------------------
@dataclass(frozen=True)
class BandNames:
    """Band names of the Cryo-Bench / PANGAEA configs, which encoder slots and band aliases use."""

    optical: tuple[str, ...]
    sar: tuple[str, ...]
    rgb_slots: tuple[str, ...]

    @property
    def all(self) -> tuple[str, ...]:
        """Every Cryo-Bench band name, optical then SAR: the names a model spec's bands must use."""
        return self.optical + self.sar


@lru_cache(maxsize=None)
def band_names() -> BandNames:
    """The band vocabulary from the first bands.yaml in the search path, read once per process."""
    p = _top_file("bands.yaml")
    return from_mapping(BandNames, read_yaml(p), str(p))


# -- protocols and benchmarks ---
@dataclass(frozen=True)
class ProtocolSpec:
    family: str  # the evaluation family that runs it (cryocube.families)
    name: str = rule("", internal=True)
    title: str = ""  # default: its name
    fraction: float = rule(1.0, lo=0.0, lo_open=True, hi=1.0)  # default share of training labels
    trains_encoder: bool = False  # True: fine-tuning; the encoder runs in the training loop
    bands: str = "named"  # band-matching rule, see cryocube.models.bands
    description: str = ""

    def __post_init__(self):
        object.__setattr__(self, "title", self.title or self.name)
        object.__setattr__(self, "description", self.description.strip())


def plugin_catalog_dirs() -> list[Path]:
    """Catalog folders that packages declare in the `cryocube.catalogs` entry-point group, found
    without importing them (reading the catalog never runs plug-in code)."""
    out = []
    for ep in entry_points(group="cryocube.catalogs"):
        where = ep.dist.locate_file(ep.value.replace(".", "/")) if ep.dist is not None else None
        if where is None or not Path(str(where)).is_dir():
            raise CatalogError(
                f"catalog plug-in {ep.name!r} ({ep.value}) of cryocube.catalogs: no folder {where}"
            )
        out.append(Path(str(where)))
    return out


def _protocol_file(p: Path) -> dict[str, ProtocolSpec]:
    raw = read_yaml(p)
    if not isinstance(raw, dict):
        raise CatalogError(f"{p}: top level must be a mapping of protocol names")
    return {
        str(name): replace(from_mapping(ProtocolSpec, d, f"{p}: {name}"), name=str(name))
        for name, d in raw.items()
    }


@lru_cache(maxsize=None)
def protocols() -> dict[str, ProtocolSpec]:
    """The first catalogs/protocols.yaml, then those plug-in packages ship with their families."""
    out, seen = {}, {}
    top = _top_file("protocols.yaml")
    shipped = [d / "protocols.yaml" for d in plugin_catalog_dirs()]
    for p in [top, *(f for f in shipped if f.is_file())]:
        for name, spec in _protocol_file(p).items():
            if name in seen:
                raise CatalogError(
                    f"{p}: protocol {name!r} is defined in {seen[name]} already; give it another"
                    " name"
                )
            out[name], seen[name] = spec, p
    return out


def protocol(name: str) -> ProtocolSpec:
    """By name, refusing an unknown one in one sentence listing the known."""
    ps = protocols()
    if name not in ps:
        raise CatalogError(f"unknown protocol {name!r}; known: {', '.join(ps)}")
    return ps[name]


@dataclass(frozen=True)
class BenchmarkSpec:
    datasets: tuple[str, ...]  # in the paper's column order
    # row name -> a model id or {"default": model id, <dataset>: model id}, in row order
    models: dict[str, str | dict[str, str]]
    protocols: dict[str, dict[str, Any]]  # protocol -> {"fraction": f, "datasets": [...]}
    recipe: dict[str, Any] = field(default_factory=dict)  # fields of its training protocol
    name: str = ""  # default: the file's name
    path: str = rule("", internal=True)

    def __post_init__(self):
        rows = {r: {"default": m} if isinstance(m, str) else m for r, m in self.models.items()}
        bad = [r for r, m in rows.items() if "default" not in m]
        if bad:
            raise FieldError(f"models.{bad[0]} must be a model id or a mapping with a 'default' id")
        object.__setattr__(self, "models", rows)

    def model_for(self, row: str, dataset: str) -> str:
        """A row's model id on a dataset: its own for it (CROMA's SAR on SICD), else default."""
        m = self.models[row]
        return m.get(dataset, m["default"])

    def model_order(self) -> list[str]:
        """Row names in the paper's table order; the report sorts models by it."""
        return list(self.models)


@lru_cache(maxsize=None)
def load_benchmark(name: str = "cryobench") -> BenchmarkSpec:
    """A benchmark's grid and training recipe (catalogs/benchmarks/<name>.yaml)."""
    p = find("benchmarks", name)
    spec = from_mapping(BenchmarkSpec, read_yaml(p), str(p))
    return replace(spec, name=spec.name or p.stem, path=str(p))
