"""The recipe fields every evaluation family shares, checked before any work starts, and the
`--set` / `--config` readers; a family's recipe subclasses `BaseRecipe`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml

from .catalog import read_yaml
from .errors import RecipeError
from .mapping import check_field, from_mapping, rule
from .precision import PRECISIONS

NORMALIZATIONS = ("published", "cube")
_COUNT = {"lo": 1}  # an integer >= 1


@dataclass(frozen=True, kw_only=True)
class BaseRecipe:
    """The fields every family reads: how inputs are normalised and computed, and how tasks are
    cut; fields without a default take the benchmark catalog's `recipe:`."""

    NOUN: ClassVar[str] = "recipe field"
    ERROR: ClassVar[type] = RecipeError

    precision: str = rule(choices=PRECISIONS)
    # "published": the dataset catalog's mean/std (the reference); "cube": the cube's train stats
    normalization: str = rule(choices=NORMALIZATIONS)
    input_size: int | None = rule(None, **_COUNT)  # the encoder's input size (small test tiles)
    block_samples: int = rule(8, **_COUNT)  # samples per Dask task (extraction, embedding, test)
    threads: int | None = rule(None, **_COUNT)  # torch threads per task (None: the worker's)
    extract_batch: int | None = rule(None, **_COUNT)  # encoder batch (None: sized to the device)
    encoder_weights: dict[str, str] = rule(
        factory=dict, what="a mapping of model ids to checkpoint paths/URLs"
    )
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

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Every field against its rule, on construction; a family adds its cross-field rules."""
        for f in dataclasses.fields(self):
            check_field(type(self), f, getattr(self, f.name), floats=False)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The fields `--set` and a config may name for this family (`check_keys`)."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_values(cls, values: dict[str, Any], where: str = "recipe"):
        """This family's recipe from a mapping that may hold other families' fields (left alone)."""
        mine = {k: v for k, v in values.items() if k in cls.field_names()}
        # coerce first: a null is refused where the field takes none, never read as the default
        return from_mapping(cls, coerce(cls, mine, where), where, floats=False)

    def updated(self, values: dict[str, Any], where: str = "--set"):
        """A copy with `values` (only this family's fields) checked and applied."""
        check_keys(values, self.field_names(), where)
        return dataclasses.replace(self, **coerce(type(self), values, where))

    def replace(self, **kw):
        """A copy with fields the planner fixes (the run's threads), checked on construction."""
        return dataclasses.replace(self, **kw)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready values (tuples as lists): the record's `config`, what `identity` filters."""
        return {
            k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()
        }

    def identity(self) -> dict[str, Any]:
        """The fields that define a run's result (its content hash takes these)."""
        d = {k: v for k, v in self.as_dict().items() if k not in self.EXECUTION_FIELDS}
        # the default leaves every existing run's identity as it was
        if not d.get("follow_reference"):
            d.pop("follow_reference", None)
        return d


def coerce(cls: type[BaseRecipe], values: dict[str, Any], where: str = "") -> dict[str, Any]:
    """YAML's types as the fields of `cls` take them, each checked; other keys pass as they are."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    return {
        k: check_field(cls, fields[k], v, where, floats=False) if k in fields else v
        for k, v in values.items()
    }


def check_keys(values: dict, known, where: str) -> None:
    """Refuses fields no recipe has, naming where they came from (--set, a config)."""
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
    """A --config YAML file as a mapping, fields unchecked (`tune` takes a `space:` section too)."""
    data = read_yaml(Path(path), RecipeError) or {}
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a config must be a mapping of recipe fields")
    return data
