"""One flat mapping of recipe values (`--set`, `--config`, the benchmark's `recipe:`) of which each
family takes and checks its recipe class's fields; a field no family declares is refused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import mapping
from ..catalog import load_benchmark
from ..recipe import BaseRecipe, RecipeError, check_keys, parse_overrides, read_config
from . import get, names


@dataclass(frozen=True, kw_only=True)
class QuestionRecipe(BaseRecipe):
    """The recipe of the families that answer the question tasks: heads, and vqa with its own."""

    # () = every catalog task the cube can serve (heads: those with a class/number/box answer)
    vqa_tasks: tuple[str, ...] | str = mapping.rule((), what="task names (a list or 'a,b')")

    @property
    def task_names(self) -> list[str]:
        """vqa_tasks as a list, from 'a,b' (--set) or YAML; empty: every task the cube can serve."""
        return mapping.names(self.vqa_tasks)


def recipe_types(only: tuple[str, ...] | None = None) -> dict[str, type[BaseRecipe]]:
    """Family name -> its recipe class (every registered family, or `only` these)."""
    return {n: get(n).recipe for n in only or names()}


class Recipe:
    """All families' recipes from one mapping of values; `recipe.epochs` reads any one's field."""

    def __init__(
        self, values: dict[str, Any], types: dict[str, type[BaseRecipe]], where: str = "recipe"
    ):
        check_keys(values, {f for t in types.values() for f in t.field_names()}, where)
        self._types = types
        self._parts = {n: t.from_values(values, where) for n, t in types.items()}
        self._values = {k: getattr(p, k) for p in self._parts.values() for k in p.field_names()}

    def of(self, family: str) -> BaseRecipe:
        """The family's own recipe (its fields, checked)."""
        if family not in self._parts:  # a family registered after this recipe was read
            self._types = {**self._types, family: get(family).recipe}
            self._parts[family] = self._types[family].from_values(self._values)
        return self._parts[family]

    def fields(self) -> tuple[str, ...]:
        """Every field its families read: the names --config and --set keys are checked against."""
        return tuple(self._values)

    def execution_fields(self) -> set[str]:
        """Fields that change no family's result."""
        return set.intersection(*(set(t.EXECUTION_FIELDS) for t in self._types.values()))

    def replace(self, **kw) -> "Recipe":
        """A new Recipe with `kw` over these values, checked again by every family as --set."""
        return Recipe({**self._values, **kw}, self._types, "--set")

    def as_dict(self) -> dict[str, Any]:
        """All families' checked fields, flat (tuples as lists): the recipe a record stores."""
        return {k: v for p in self._parts.values() for k, v in p.as_dict().items()}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self.__dict__.get("_values", {}):
            raise AttributeError(f"no recipe field {name!r}")
        return self._values[name]

    def __eq__(self, other) -> bool:
        return isinstance(other, Recipe) and self._values == other._values

    def __repr__(self) -> str:
        return f"Recipe({self._values!r})"


def default_recipe(benchmark: str = "cryobench", families: tuple[str, ...] | None = None) -> Recipe:
    """The benchmark catalog's recipe (engineering fields at their defaults)."""
    b = load_benchmark(benchmark)
    where = f"{b.path}: recipe"
    values = dict(b.recipe)
    if families:  # the benchmark's fields of other families are theirs, not errors
        check_keys(values, {f for t in recipe_types().values() for f in t.field_names()}, where)
        mine = {f for t in recipe_types(families).values() for f in t.field_names()}
        values = {k: v for k, v in values.items() if k in mine}
    return Recipe(values, recipe_types(families), where)


def load_recipe(
    path: str | None = None,
    overrides: list[str] | dict | None = None,
    base: Recipe | None = None,
    families: tuple[str, ...] | None = None,
) -> Recipe:
    """The catalog's recipe (or `base`), then a YAML file, then `key=value` overrides."""
    cfg = base or default_recipe(families=families)
    values: dict[str, Any] = {}
    if path:
        data = read_config(path)
        data = data.get("train", data)
        _check_used(data, cfg, families, path)
        values.update(data)
    extra = overrides if isinstance(overrides, dict) else parse_overrides(overrides or [])
    _check_used(extra, cfg, families, "--set")
    values.update(extra)
    return cfg.replace(**values)


def _check_used(values: dict, cfg: Recipe, families: tuple[str, ...] | None, where: str) -> None:
    """Refuses a field none of `families` reads (it would be ignored) or no family knows."""
    if families:
        every = {f for t in recipe_types().values() for f in t.field_names()}
        unused = sorted(k for k in values if k in every and k not in cfg.fields())
        if unused:
            raise RecipeError(
                f"{where} {', '.join(unused)}: not used by the {', '.join(families)} family (it"
                f" reads: {', '.join(sorted(cfg.fields()))}); drop"
                f" {'it' if len(unused) == 1 else 'them'}"
            )
    check_keys(values, cfg.fields(), where)


__all__ = [
    "QuestionRecipe",
    "Recipe",
    "RecipeError",
    "default_recipe",
    "load_recipe",
    "recipe_types",
]
