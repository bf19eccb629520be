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
from importlib.metadata import entry_points
from typing import Iterable

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
