"""Evaluation families (`base.Family`), one registry: the built-in ones and those a lab's package
registers through an entry point in the `cryocube.families` group (a module calling `register`)."""

from __future__ import annotations

from .. import plugins
from .base import Family, PlanContext, PlannedRun, Resolved, RunSpec

BUILTIN = tuple(f"cryocube.families.{n}" for n in ("segmentation", "embedding", "vqa", "heads"))
# one instance per family, made at registration, serves every run whose protocol names it
FAMILIES: plugins.Registry[Family] = plugins.Registry(
    "evaluation family", "cryocube.families", BUILTIN
)

__all__ = ["Family", "PlanContext", "PlannedRun", "Resolved", "RunSpec", "get", "names", "register"]


def register(cls: type[Family]) -> type[Family]:
    """Class decorator: one instance per family; a second class under its name is refused."""
    old = FAMILIES.get(cls.name)
    FAMILIES.add(cls.name, old if type(old) is cls else cls(), plugins.source_of(cls))
    return cls


def names() -> list[str]:
    """Every family's name, once the built-in modules and the entry points are loaded."""
    return FAMILIES.names()


def get(name: str) -> Family:
    """The one instance of a family; an unknown name is one sentence listing the known."""
    return FAMILIES.named(name)


def report_key(record) -> tuple:
    """Its family's part of a record's report key; none for a family not installed here."""
    return get(record.family).report_key(record) if record.family in names() else ()
