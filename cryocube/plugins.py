"""Registries filled by modules: the built-in ones and those other packages declare as entry points.

As xarray finds its backends, a lab can add a reader, an encoder architecture or an evaluation
family from its own package, without forking cryocube, by declaring an entry point in the group
named here:

    [project.entry-points."cryocube.readers"]
    my_layout = "mylab.readers"          # a module that registers its reader(s) on import

The `cryocube.catalogs` group names a folder of catalog files a package ships (its protocols, read
by catalog.protocols without importing the package).
"""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import entry_points
from typing import Callable, Iterable

from .errors import UserError

GROUPS = ("cryocube.readers", "cryocube.architectures", "cryocube.families", "cryocube.adapters")
_loaded: set[str] = set()


def load(group: str, builtin: Iterable[str]) -> None:
    """Import the built-in modules of a registry, then every entry point of `group` (once per
    process)."""
    if group in _loaded:
        return
    for name in builtin:
        importlib.import_module(name)
    for ep in entry_points(group=group):
        try:
            ep.load()
        except Exception as e:  # a broken plug-in must not hide which one it is
            raise UserError(
                f"plug-in {ep.name!r} ({ep.value}) of {group} failed to load:"
                f" {type(e).__name__}: {e}"
            ) from e
    _loaded.add(group)


def lazy_exports(
    package: str, exports: dict[str, tuple[str, ...]]
) -> tuple[list[str], Callable, Callable]:
    """(`__all__`, module `__getattr__`, module `__dir__`) of a package whose names are imported on
    first use: its modules' heavy imports (torch, matplotlib) are paid by callers that use them,
    not by the CLI's parser or `--help`. `exports` maps each module to the names it gives."""
    where = {name: mod for mod, names in exports.items() for name in names}

    def __getattr__(name: str):
        if name in where:
            return getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return sorted(where), __getattr__, __dir__
