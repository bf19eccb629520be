"""The recipe fields every evaluation family shares, their checks, and the `--set` / `--config`
readers.

A family's recipe is a frozen dataclass over `BaseRecipe` that adds its own fields and checks
(families/segmentation/recipe.py); fields without a default take the benchmark catalog's value
(`recipe:` in catalogs/benchmarks/<name>.yaml). Every value is checked before any work reaches a
worker, with one sentence naming the field, the value and what it may be. The set of all families'
recipes read from one set of values is `families.recipes.Recipe`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import yaml

from .errors import RecipeError, yaml_problem
from .precision import PRECISIONS

NORMALIZATIONS = ("published", "cube")


def check_int(name: str, v: Any, lo: int = 1, none: bool = False) -> None:
    """Refuses, naming the field, anything but an int >= `lo` (bools too); `none` lets null through
    where None means a default."""
    if v is None and none:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise RecipeError(
            f"recipe field {name} must be an integer >= {lo}{' or null' if none else ''}, got {v!r}"
        )


def check_num(
    name: str, v: Any, lo: float, lo_open: bool = False, hi: float = math.inf, hi_open: bool = False
) -> None:
    """Refuses, naming the field and its interval, a bool, a non-finite number, or one outside
    `lo`..`hi` (either end open on request)."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    ok = ok and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    if not ok:
        rng = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise RecipeError(f"recipe field {name} must be a number in {rng}, got {v!r}")


def check_choice(name: str, v: Any, choices: tuple[str, ...]) -> None:
    """Refuses a value outside `choices` in one sentence that lists them."""
    if v not in choices:
        raise RecipeError(f"recipe field {name} must be one of {', '.join(choices)}, got {v!r}")


@dataclass(frozen=True, kw_only=True)
class BaseRecipe:
    """The fields every family reads: how inputs are normalised and computed, and how tasks are
    cut."""

    precision: str  # auto | bf16 | fp16 | fp32
    # "published": the dataset catalog's mean/std (the reference); "cube": the cube's train stats
    normalization: str
    input_size: int | None = None  # override the encoder's input size (e.g. small test tiles)
    block_samples: int = 8  # samples per Dask task when extracting features / embedding / testing
    # torch threads per task (default: the worker's configured torch threads)
    threads: int | None = None
    # encoder batch in extraction/inference (None: sized to the device)
    extract_batch: int | None = None
    encoder_weights: dict[str, str] = field(default_factory=dict)  # model id -> checkpoint path/URL
    # switch every model deviation to the reference's behaviour (docs/deviations.md)
    follow_reference: bool = False

    # fields that never change a run's result, left out of its run id, each with the reason
    # (tests/test_plan_fields.py holds every other field to reaching the run id and its work)
    EXECUTION_FIELDS: ClassVar[dict[str, str]] = {
        "block_samples": "how samples are cut into Dask tasks",
        "threads": "where threads change the bits (CPU), the run id takes the run's arithmetic"
        " threads (PlanContext.arithmetic_threads), on CUDA none",
        "extract_batch": "an encoder batch computes each sample alone",
        "encoder_weights": "the run id takes the checkpoint's sha256, not where it was read",
    }
    TUPLE_FIELDS: ClassVar[tuple[str, ...]] = ()  # list-valued fields, kept as tuples (hashable)
    FLOAT_FIELDS: ClassVar[tuple[str, ...]] = ()  # YAML reads 1e-4 (no dot) as a string

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Runs on construction (`__post_init__`), so no recipe holds a bad value; a family's recipe
        adds its own fields' checks."""
        check_choice("precision", self.precision, PRECISIONS)
        check_choice("normalization", self.normalization, NORMALIZATIONS)
        check_int("input_size", self.input_size, none=True)
        check_int("block_samples", self.block_samples)
        check_int("threads", self.threads, none=True)
        check_int("extract_batch", self.extract_batch, none=True)
        if not isinstance(self.follow_reference, bool):
            raise RecipeError(
                "recipe field follow_reference must be true or false, got"
                f" {self.follow_reference!r}"
            )
        w = self.encoder_weights
        if not isinstance(w, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in w.items()
        ):
            raise RecipeError(
                "recipe field encoder_weights must map model ids to checkpoint paths/URLs, got"
                f" {w!r}"
            )

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The fields `--set` and a config may name for this family (`check_keys`)."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def benchmark_fields(cls) -> tuple[str, ...]:
        """Fields without a default: the benchmark catalog must give them."""
        return tuple(
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )

    @classmethod
    def from_values(cls, values: dict[str, Any], where: str = "recipe"):
        """This family's recipe from a mapping that may hold other families' fields too (they are
        left)."""
        mine = {k: v for k, v in coerce(cls, values).items() if k in cls.field_names()}
        missing = [f for f in cls.benchmark_fields() if f not in mine]
        if missing:
            raise RecipeError(f"{where} lacks {missing}")
        return cls(**mine)

    def updated(self, values: dict[str, Any], where: str = "--set"):
        """A copy with `values` (only this family's fields) checked and applied."""
        check_keys(values, self.field_names(), where)
        return dataclasses.replace(self, **coerce(type(self), values))

    def replace(self, **kw):
        """A copy with fields the planner fixes itself (the run's threads): no key check or YAML
        coercion, but checked again on construction."""
        return dataclasses.replace(self, **kw)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready values (tuple fields as lists): the run record's `config`, and what `identity`
        filters."""
        d = dataclasses.asdict(self)
        for k in self.TUPLE_FIELDS:
            d[k] = list(d[k])
        return d

    def identity(self) -> dict[str, Any]:
        """The fields that define a run's result (its content hash takes these)."""
        d = {k: v for k, v in self.as_dict().items() if k not in self.EXECUTION_FIELDS}
        # the default leaves every existing run's identity as it was
        if not d.get("follow_reference"):
            d.pop("follow_reference", None)
        return d


def coerce(cls: type[BaseRecipe], values: dict[str, Any]) -> dict[str, Any]:
    """YAML's types as the fields take them: lists -> tuples, numbers written as strings ->
    floats."""
    out = dict(values)
    for k in cls.TUPLE_FIELDS:
        if k in out:
            if not isinstance(out[k], (list, tuple)):
                raise RecipeError(f"recipe field {k} must be a list of numbers, got {out[k]!r}")
            out[k] = tuple(out[k])
    for k in cls.FLOAT_FIELDS:
        if isinstance(out.get(k), str):
            try:
                out[k] = float(out[k])
            except ValueError:
                raise RecipeError(f"recipe field {k} must be a number, got {out[k]!r}") from None
    return out


def check_keys(values: dict, known, where: str) -> None:
    """Refuses fields no recipe has, naming where they came from (--set, a config) and listing the
    known ones."""
    bad = sorted(set(values) - set(known))
    if bad:
        raise RecipeError(f"{where}: unknown recipe fields {bad}; known: {sorted(known)}")


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
    """A --config YAML file as a mapping (its fields not yet checked: `tune` takes a `space:`
    section too)."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except OSError as e:
        raise RecipeError(f"{path}: cannot read the config ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise RecipeError(f"{path}: not valid YAML ({yaml_problem(e)})") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a config must be a mapping of recipe fields")
    return data
