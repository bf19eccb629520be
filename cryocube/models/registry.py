"""Registries of encoder architectures and of checkpoint key maps (a leaf: it imports no
architecture).

Each architecture module (vit.py, dofa.py, ...) registers a builder with
`@register_architecture("name")` and the key maps of its checkpoints with `register_keymap`; a model
config's `architecture` and `weights.key_map` fields pick them. Architecture modules of other
packages join through the `cryocube.architectures` entry points. No if-chains on model names
anywhere else.
"""

from __future__ import annotations

import sys
from typing import Callable

from ..plugins import Registry
from .keymap import NATIVE, KeyMap

BUILTIN_ARCHITECTURES = tuple(
    f"cryocube.models.{m}"
    for m in "croma dofa gfm ramen satlas spectralgpt terramind unet vit".split()
)
GROUP = "cryocube.architectures"

Builder = Callable[..., "object"]
ARCHITECTURES: Registry[Builder] = Registry("encoder architecture", GROUP, BUILTIN_ARCHITECTURES)
# key maps are declared by the architecture modules: loading them is loading the architectures
KEYMAPS: Registry[KeyMap] = Registry("key map", GROUP, BUILTIN_ARCHITECTURES)
KEYMAPS.add(NATIVE.name, NATIVE, __name__)


def register_architecture(name: str):
    """Decorator: `name` (a model config's `architecture:`) builds encoders with this function."""

    def deco(fn: Builder) -> Builder:
        return ARCHITECTURES.add(name, fn)

    return deco


def register_keymap(km: KeyMap) -> KeyMap:
    """Makes a key map loadable by the name a config's `weights.key_map` gives; a second, different
    map under one name is refused, naming the modules that registered each."""
    # a KeyMap is an instance: the module that registers it is the caller's, not its class's
    return KEYMAPS.add(km.name, km, sys._getframe(1).f_globals.get("__name__"))


def architectures() -> dict[str, Builder]:
    """Every registered architecture name -> its builder."""
    return dict(ARCHITECTURES.load())


def get_keymap(name: str) -> KeyMap:
    """A key map by name, once the architecture modules (which register their maps) are imported."""
    return KEYMAPS.named(name)
