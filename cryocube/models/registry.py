"""Registries of encoder families and of checkpoint key maps (a leaf: it imports no family).

Each family module (vit.py, dofa.py, ...) registers a builder with `@register_family("name")` and
the key maps of its checkpoints with `register_keymap`; the catalog's `family` and `weights.key_map`
fields pick them. Family modules of other packages join through the `cryocube.model_families` entry
points. No if-chains on model names anywhere else.
"""
from __future__ import annotations

from typing import Callable

from .. import plugins
from .keymap import NATIVE, KeyMap

BUILTIN_FAMILIES = tuple(f"cryocube.models.{m}" for m in (
    "croma", "data2vec", "dofa", "gfm", "ramen", "satlas", "spectralgpt", "terramind", "unet", "vit"))

Builder = Callable[..., "object"]
_FAMILIES: dict[str, Builder] = {}
_KEYMAPS: dict[str, KeyMap] = {NATIVE.name: NATIVE}


def register_family(name: str):
    def deco(fn: Builder) -> Builder:
        if name in _FAMILIES and _FAMILIES[name] is not fn:
            raise ValueError(f"encoder family {name!r} registered twice")
        _FAMILIES[name] = fn
        return fn

    return deco


def register_keymap(km: KeyMap) -> KeyMap:
    if km.name in _KEYMAPS and _KEYMAPS[km.name] is not km:
        raise ValueError(f"key map {km.name!r} registered twice")
    _KEYMAPS[km.name] = km
    return km


def load_families() -> None:
    plugins.load("cryocube.model_families", BUILTIN_FAMILIES)


def families() -> dict[str, Builder]:
    load_families()
    return dict(_FAMILIES)


def get_keymap(name: str) -> KeyMap:
    load_families()
    if name not in _KEYMAPS:
        raise KeyError(f"unknown key map {name!r}; known: {sorted(_KEYMAPS)}")
    return _KEYMAPS[name]


def keymaps() -> dict[str, KeyMap]:
    load_families()
    return dict(_KEYMAPS)
