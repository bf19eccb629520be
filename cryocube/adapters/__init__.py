"""Generative model adapters: a model that reads a picture and a prompt and writes text.

One file per adapter, each a `base.Adapter` subclass registered with `@register`; a lab adds one
from its own package through the `cryocube.adapters` entry point. A run names its model as
`<adapter>[:<location>]` (`transformers:/ckpt/SmolVLM-256M-Instruct`,
`transformers:s3://bucket/llava`).
"""

from __future__ import annotations

from .. import plugins
from .base import Adapter, ModelRef, split_ref

BUILTIN = ("cryocube.adapters.transformers_vlm",)
ADAPTERS: plugins.Registry[type[Adapter]] = plugins.Registry(
    "model adapter", "cryocube.adapters", BUILTIN
)

__all__ = ["Adapter", "ModelRef", "get", "names", "register", "split_ref"]


def register(cls: type[Adapter]) -> type[Adapter]:
    """Class decorator an adapter module applies on import, so `<name>:` in a model ref finds it;
    a second class under a taken name is refused."""
    return ADAPTERS.add(cls.name, cls)


def names() -> list[str]:
    """Every adapter's name, once the built-in modules and the entry points are loaded (`cryocube
    list adapters`, `is_adapter_ref`)."""
    return ADAPTERS.names()


def get(name: str) -> type[Adapter]:
    """The adapter class a model ref names; an unknown name is one sentence listing known ones."""
    return ADAPTERS.named(name, " (`cryocube list adapters`)")


def is_adapter_ref(model: str) -> bool:
    """True when `model` names an adapter (`transformers` or `transformers:LOCATION`)."""
    return split_ref(model)[0] in names()
