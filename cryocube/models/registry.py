"""Registries of encoder architectures and of checkpoint key maps (a leaf: it imports no
architecture).

Each architecture module (vit.py, dofa.py, ...) registers a builder with
`@register_architecture("name")` and the key maps of its checkpoints with `register_keymap`; a model
config's `architecture` and `weights.key_map` fields pick them. Architecture modules of other
packages join through the `cryocube.architectures` entry points. No if-chains on model names
anywhere else.
"""

from __future__ import annotations

import warnings
from importlib.metadata import entry_points
from typing import Callable

from .. import plugins
from .keymap import NATIVE, KeyMap

BUILTIN_ARCHITECTURES = tuple(
    f"cryocube.models.{m}"
    for m in (
        "croma",
        "data2vec",
        "dofa",
        "gfm",
        "ramen",
        "satlas",
        "spectralgpt",
        "terramind",
        "unet",
        "vit",
    )
)
GROUP = "cryocube.architectures"
# the group's name before "family" meant only an evaluation family
OLD_GROUP = "cryocube.model_families"

Builder = Callable[..., "object"]
_ARCHITECTURES: dict[str, Builder] = {}
_KEYMAPS: dict[str, KeyMap] = {NATIVE.name: NATIVE}
_old_group_named = False  # the plug-ins under OLD_GROUP were named in a warning (once per process)


def register_architecture(name: str):
    """Decorator: `name` (a model config's `architecture:`) builds encoders with this function."""

    def deco(fn: Builder) -> Builder:
        if name in _ARCHITECTURES and _ARCHITECTURES[name] is not fn:
            raise ValueError(f"encoder architecture {name!r} registered twice")
        _ARCHITECTURES[name] = fn
        return fn

    return deco


def register_family(name: str):
    """The old name of `register_architecture`, kept so a lab's module still loads; it says so
    once."""
    warnings.warn(
        f"register_family({name!r}) is the old name of"
        " cryocube.models.registry.register_architecture; rename the call",
        FutureWarning,
        stacklevel=2,
    )
    return register_architecture(name)


def register_keymap(km: KeyMap) -> KeyMap:
    """Makes a key map loadable by the name a config's `weights.key_map` gives; a second, different
    map under one name is refused."""
    if km.name in _KEYMAPS and _KEYMAPS[km.name] is not km:
        raise ValueError(f"key map {km.name!r} registered twice")
    _KEYMAPS[km.name] = km
    return km


def load_architectures() -> None:
    """Import the built-in architecture modules and the plug-ins; plug-ins declared under the old
    group name still load, with a warning naming each."""
    global _old_group_named
    plugins.load(GROUP, BUILTIN_ARCHITECTURES)
    if not _old_group_named:
        _old_group_named = True
        for ep in entry_points(group=OLD_GROUP):
            warnings.warn(
                f"plug-in {ep.name!r} ({ep.value}) is declared in the entry-point group"
                f" {OLD_GROUP!r}, the old name of {GROUP!r}; rename the group in its package",
                FutureWarning,
                stacklevel=2,
            )
    plugins.load(OLD_GROUP, ())


def architectures() -> dict[str, Builder]:
    """Every registered architecture name -> its builder."""
    load_architectures()
    return dict(_ARCHITECTURES)


def get_keymap(name: str) -> KeyMap:
    """A key map by name, once the architecture modules (which register their maps) are imported."""
    load_architectures()
    if name not in _KEYMAPS:
        raise KeyError(f"unknown key map {name!r}; known: {sorted(_KEYMAPS)}")
    return _KEYMAPS[name]


def keymaps() -> dict[str, KeyMap]:
    """Every key map by name, architecture modules and plug-ins loaded first so none is missing."""
    load_architectures()
    return dict(_KEYMAPS)
