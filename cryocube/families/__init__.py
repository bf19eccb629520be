"""Evaluation families: what a kind of evaluation needs, fits, maps, reduces and scores
(`base.Family`).

Built in: `segmentation` (dense segmentation, the Cryo-Bench protocols) and, for embeddings,
`cryocube embed` / `cryocube probe` (families/embedding). A lab adds a family from its own package
through an entry point in the `cryocube.families` group (a module that calls `register`).
"""

from __future__ import annotations

from .. import plugins
from ..errors import UserError
from .base import Family, PlanContext, PlannedRun, RunSpec

BUILTIN = (
    "cryocube.families.segmentation",
    "cryocube.families.embedding",
    "cryocube.families.vqa",
    "cryocube.families.heads",
)
_FAMILIES: dict[str, Family] = {}

__all__ = ["Family", "PlanContext", "PlannedRun", "RunSpec", "get", "names", "register"]


def register(cls: type[Family]) -> type[Family]:
    """Class decorator: one instance, made here, serves every run whose protocol names it."""
    _FAMILIES[cls.name] = cls()
    return cls


def names() -> list[str]:
    """Every family's name, once the built-in modules and the entry points are loaded."""
    plugins.load("cryocube.families", BUILTIN)
    return sorted(_FAMILIES)


def get(name: str) -> Family:
    """The one instance of a family, whose hooks the scheduler calls; unknown names: UserError."""
    plugins.load("cryocube.families", BUILTIN)
    if name not in _FAMILIES:
        raise UserError(
            f"unknown evaluation family {name!r}; known: {', '.join(sorted(_FAMILIES))}"
        )
    return _FAMILIES[name]
