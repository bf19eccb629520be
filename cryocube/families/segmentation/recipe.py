"""The segmentation training recipe: typed, validated fields whose values come from the benchmark catalog.

The defaults are the Cryo-Bench/PANGAEA recipe in catalogs/benchmarks/cryobench.yaml (`recipe:`);
every field can be overridden from YAML (`--config`) or `--set k=v`. Every value is checked here,
before any cluster starts, with one sentence naming the field, the value and what it may be.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import yaml

from ...catalog import load_benchmark
from ...errors import UserError
from ...precision import PRECISIONS

MEMORY_FORMATS = ("auto", "channels_last", "contiguous")
FEATURE_DTYPES = ("float16", "float32")
NORMALIZATIONS = ("published", "cube")


class RecipeError(UserError, ValueError):
    """A recipe field has a value it cannot take."""


@dataclass(frozen=True)
class Recipe:
    # the protocol's values (defaults: the benchmark catalog's recipe)
    epochs: int
    lr: float
    weight_decay: float
    betas: tuple[float, float]
    batch_size: int
    milestones: tuple[float, ...]  # fractions of all iterations, LR x gamma at each
    gamma: float
    val_every: int  # validate before epochs 0, val_every, ... and after the last
    decoder: str
    decoder_channels: int
    normalization: str  # "published": the dataset catalog's mean/std (the reference); "cube": the cube's train stats
    few_shot_bins: int
    precision: str  # auto | bf16 | fp16 | fp32
    # cryocube's engineering (not part of the reference recipe)
    crops_per_sample: int = 4  # size of the fixed bank of random training crops (frozen protocols)
    feature_dtype: str = "float16"  # storage of cached features
    input_size: int | None = None  # override the encoder's input size (e.g. small test tiles)
    memory_format: str = "auto"  # channels_last for conv decoders where it measures faster (CUDA), else contiguous
    block_samples: int = 8  # samples per Dask task when extracting features / testing
    threads: int | None = None  # torch threads per task (default: the host's cores divided among running tasks)
    max_val_samples: int | None = None  # cap validation cost on big datasets (None = all)
    cache_in_memory_mb: float = 1024  # cached features smaller than this are read once per task, else streamed
    decoders_per_task: int = 8  # frozen runs sharing a feature cache train together, up to this many per task
    extract_batch: int | None = None  # encoder batch in extraction/inference (None: sized to the device)
    encoder_weights: dict[str, str] = field(default_factory=dict)  # model id -> checkpoint path/URL

    def __post_init__(self):
        validate(self)

    def replace(self, **kw) -> "Recipe":
        return dataclasses.replace(self, **kw)

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        d["milestones"] = list(self.milestones)
        return d


PROTOCOL_FIELDS = ("epochs", "lr", "weight_decay", "betas", "batch_size", "milestones", "gamma", "val_every", "decoder",
                   "decoder_channels", "normalization", "few_shot_bins", "precision")
# fields that never change a run's result (they are left out of its content hash)
EXECUTION_FIELDS = ("block_samples", "threads", "cache_in_memory_mb", "decoders_per_task", "extract_batch",
                    "encoder_weights", "max_val_samples")


def _int(name: str, v: Any, lo: int = 1, none: bool = False) -> None:
    if v is None and none:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise RecipeError(f"recipe field {name} must be an integer >= {lo}{' or null' if none else ''}, got {v!r}")


def _num(name: str, v: Any, lo: float, lo_open: bool = False, hi: float = math.inf, hi_open: bool = False) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    ok = ok and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    if not ok:
        rng = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise RecipeError(f"recipe field {name} must be a number in {rng}, got {v!r}")


def _choice(name: str, v: Any, choices: tuple[str, ...]) -> None:
    if v not in choices:
        raise RecipeError(f"recipe field {name} must be one of {', '.join(choices)}, got {v!r}")


def validate(r: Recipe) -> None:
    _int("epochs", r.epochs)
    _num("lr", r.lr, 0.0, lo_open=True)
    _num("weight_decay", r.weight_decay, 0.0)
    if len(r.betas) != 2:
        raise RecipeError(f"recipe field betas must be two numbers, got {list(r.betas)!r}")
    for b in r.betas:
        _num("betas", b, 0.0, hi=1.0, hi_open=True)
    _int("batch_size", r.batch_size)
    for m in r.milestones:
        _num("milestones", m, 0.0, lo_open=True, hi=1.0)
    if list(r.milestones) != sorted(r.milestones):
        raise RecipeError(f"recipe field milestones must be increasing fractions of the iterations, got {list(r.milestones)!r}")
    _num("gamma", r.gamma, 0.0, lo_open=True)
    _int("val_every", r.val_every)
    if not isinstance(r.decoder, str) or not r.decoder:
        raise RecipeError(f"recipe field decoder must be a decoder name, got {r.decoder!r}")
    _int("decoder_channels", r.decoder_channels)
    _choice("normalization", r.normalization, NORMALIZATIONS)
    _int("few_shot_bins", r.few_shot_bins)
    _choice("precision", r.precision, PRECISIONS)
    _int("crops_per_sample", r.crops_per_sample)
    _choice("feature_dtype", r.feature_dtype, FEATURE_DTYPES)
    _int("input_size", r.input_size, none=True)
    _choice("memory_format", r.memory_format, MEMORY_FORMATS)
    _int("block_samples", r.block_samples)
    _int("threads", r.threads, none=True)
    _int("max_val_samples", r.max_val_samples, none=True)
    _num("cache_in_memory_mb", r.cache_in_memory_mb, 0.0)
    _int("decoders_per_task", r.decoders_per_task)
    _int("extract_batch", r.extract_batch, none=True)
    if not isinstance(r.encoder_weights, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in r.encoder_weights.items()):
        raise RecipeError(f"recipe field encoder_weights must map model ids to checkpoint paths/URLs, got {r.encoder_weights!r}")


def _coerce(values: dict[str, Any]) -> dict[str, Any]:
    out = dict(values)
    for k in ("betas", "milestones"):
        if k in out:
            if not isinstance(out[k], (list, tuple)):
                raise RecipeError(f"recipe field {k} must be a list of numbers, got {out[k]!r}")
            out[k] = tuple(out[k])
    for k in ("lr", "weight_decay", "gamma", "cache_in_memory_mb"):  # YAML reads 1e-4 (no dot) as a string
        if isinstance(out.get(k), str):
            try:
                out[k] = float(out[k])
            except ValueError:
                raise RecipeError(f"recipe field {k} must be a number, got {out[k]!r}") from None
    return out


def _check_keys(values: dict, where: str) -> None:
    known = {f.name for f in dataclasses.fields(Recipe)}
    bad = sorted(set(values) - known)
    if bad:
        raise RecipeError(f"{where}: unknown recipe fields {bad}; known: {sorted(known)}")


def default_recipe(benchmark: str = "cryobench") -> Recipe:
    """The benchmark catalog's recipe (engineering fields at their defaults)."""
    b = load_benchmark(benchmark)
    _check_keys(b.recipe, f"{b.path}: recipe")
    missing = [f for f in PROTOCOL_FIELDS if f not in b.recipe]
    if missing:
        raise RecipeError(f"{b.path}: recipe lacks {missing}")
    return Recipe(**_coerce(b.recipe))


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`key=value` strings (values YAML-typed) -> a mapping."""
    values: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise RecipeError(f"--set {item!r}: expected key=value")
        k, v = item.split("=", 1)
        try:
            values[k.strip()] = yaml.safe_load(v)
        except yaml.YAMLError:
            raise RecipeError(f"--set {item!r}: the value is not valid YAML") from None
    return values


def read_config(path: str) -> dict[str, Any]:
    """A --config YAML file as a mapping (its fields not yet checked: `tune` takes a `space:` section too)."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except OSError as e:
        raise RecipeError(f"{path}: cannot read the config ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise RecipeError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a config must be a mapping of recipe fields")
    return data


def set_fields(path: str | None, overrides: list[str] | dict | None) -> set[str]:
    """The recipe fields a user set (in a --config file or with --set), to check that something reads them."""
    names = set(overrides if isinstance(overrides, dict) else parse_overrides(overrides or []))
    if path:
        data = read_config(path)
        names |= set(data.get("train", data))
    return names


def load_recipe(path: str | None = None, overrides: list[str] | dict | None = None, base: Recipe | None = None) -> Recipe:
    """Recipe from the catalog's defaults (or `base`), then a YAML file, then `key=value` overrides."""
    cfg = base or default_recipe()
    values: dict[str, Any] = {}
    if path:
        data = read_config(path)
        data = data.get("train", data)
        _check_keys(data, path)
        values.update(data)
    extra = overrides if isinstance(overrides, dict) else parse_overrides(overrides or [])
    _check_keys(extra, "--set")
    values.update(extra)
    return cfg.replace(**_coerce(values))
