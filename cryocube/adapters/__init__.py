"""Generative model adapters (a picture and a prompt in, text out), one module each, registered
here or through the `cryocube.adapters` entry point; a model is `<adapter>[:<location>]`."""

from __future__ import annotations

from .. import plugins
from .base import Adapter, ModelRef, split_ref

BUILTIN = ("cryocube.adapters.transformers_vlm",)
ADAPTERS: plugins.Registry[type[Adapter]] = plugins.Registry(
    "model adapter", "cryocube.adapters", BUILTIN
)

__all__ = ["Adapter", "ModelRef", "get", "names", "register", "split_ref"]
# every adapter's name, built-ins and entry points loaded (`cryocube list adapters`)
names = ADAPTERS.names


def register(cls: type[Adapter]) -> type[Adapter]:
    """Class decorator: `<name>:` in a model ref finds the class; a taken name is refused."""
    return ADAPTERS.add(cls.name, cls)


def get(name: str) -> type[Adapter]:
    """The adapter class a model ref names; an unknown name is one sentence listing known ones."""
    return ADAPTERS.named(name, " (`cryocube list adapters`)")
