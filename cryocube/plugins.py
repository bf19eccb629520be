"""Registries filled by modules: the built-in ones and those other packages declare as entry points.

Every registry of cryocube (readers, architectures and key maps, evaluation families, adapters,
cluster backends) is one `Registry`: names to entries, filled when their modules are imported, and
refusing a second entry under a name already taken, naming the modules of both. As xarray finds its
backends, a lab can add a reader, an encoder architecture, an evaluation family or an adapter from
its own package, without forking cryocube, by declaring an entry point in the registry's group:

    [project.entry-points."cryocube.readers"]
    my_layout = "mylab.readers"          # a module that registers its reader(s) on import

The `cryocube.catalogs` group names a folder of catalog files a package ships (its protocols, read
by catalog.protocols without importing the package)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator, Mapping
from importlib.metadata import entry_points
from typing import Callable, Generic, Iterable, TypeVar

from .errors import PluginError, UserError

_loaded: set[str] = set()
T = TypeVar("T")


def load(group: str, builtin: Iterable[str]) -> None:
    """Import a registry's built-in modules, then the entry points of `group` (once a process)."""
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


def source_of(entry: object) -> str:
    """The module an entry (a class or a function) was defined in, as duplicate refusals name it."""
    return getattr(entry, "__module__", None) or type(entry).__module__


class Registry(Mapping[str, T], Generic[T]):
    """Names to entries of one kind of plug-in, read like a dict. `add` refuses a second, different
    entry under a name already taken (a built-in and a plug-in, or two plug-ins, would otherwise
    shadow each other by import order) in one sentence naming the modules of both; `load` imports
    the built-in modules and the entry points of `group` first (once per process)."""

    def __init__(self, kind: str, group: str | None = None, builtin: Iterable[str] = ()):
        self.kind, self.group, self.builtin = kind, group, tuple(builtin)
        self._entries: dict[str, T] = {}
        self._sources: dict[str, str] = {}

    def add(self, name: str, entry: T, source: str | None = None) -> T:
        """Registers `entry` under `name` (`source`: the registering module, else the entry's);
        the same entry again is a no-op."""
        source = source or source_of(entry)
        if name in self._entries and self._entries[name] is not entry:
            raise PluginError(
                f"{self.kind} {name!r} is registered twice: by {self._sources[name]} and by"
                f" {source}; rename one of them"
            )
        self._entries[name] = entry
        self._sources[name] = source
        return entry

    def load(self) -> "Registry[T]":
        """Itself, once its built-in modules and its group's entry points are imported."""
        if self.group is not None:
            load(self.group, self.builtin)
        return self

    def names(self) -> list[str]:
        """Every name, sorted, plug-ins loaded."""
        return sorted(self.load())

    def named(self, name: str, hint: str = "") -> T:
        """The entry under `name`, plug-ins loaded; an unknown name is refused, naming the known."""
        if name not in self.load():
            raise PluginError(
                f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}{hint}"
            )
        return self._entries[name]

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
