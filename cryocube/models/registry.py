"""Registries (a leaf: no architecture imported) of encoder architectures (`@register_architecture`
in each architecture module, or a `cryocube.architectures` entry point) and of checkpoint key maps
(catalogs/keymaps.yaml, or a plug-in's `register_keymap`): a model config's `architecture` and
`weights.key_map` pick them, never an if-chain on model names."""

from __future__ import annotations

import sys
from functools import partial
from typing import Callable

from ..plugins import Registry
from .keymap import KEYMAP_FILE, KeyMap, catalog_keymaps

BUILTIN_ARCHITECTURES = tuple(
    f"cryocube.models.{m}"
    for m in "croma dofa gfm ramen satlas spectralgpt terramind unet vit".split()
)
GROUP = "cryocube.architectures"

Builder = Callable[..., "object"]
ARCHITECTURES: Registry[Builder] = Registry("encoder architecture", GROUP, BUILTIN_ARCHITECTURES)
# a plug-in architecture module may register the key maps of its checkpoints
KEYMAPS: Registry[KeyMap] = Registry("key map", GROUP, BUILTIN_ARCHITECTURES)
for _km in catalog_keymaps():
    KEYMAPS.add(_km.name, _km, str(KEYMAP_FILE))


def register_architecture(name: str):
    """Decorator: `name` (a model config's `architecture:`) builds encoders with this function."""
    return partial(ARCHITECTURES.add, name)


def register_keymap(km: KeyMap) -> KeyMap:
    """Makes a plug-in's key map loadable by its name; a second one under a name is refused."""
    # a KeyMap is an instance: the module that registers it is the caller's, not its class's
    return KEYMAPS.add(km.name, km, sys._getframe(1).f_globals.get("__name__"))


def architectures() -> dict[str, Builder]:
    """Every registered architecture name -> its builder."""
    return dict(ARCHITECTURES.load())


def get_keymap(name: str) -> KeyMap:
    """A key map by name, the catalog's and those plug-in architecture modules register."""
    return KEYMAPS.named(name)
