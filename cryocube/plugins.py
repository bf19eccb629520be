"""Registries filled by modules: the built-in ones and those other packages declare as entry points
(`[project.entry-points."cryocube.readers"] my_layout = "mylab.readers"`), as xarray finds its
backends; docs/architecture.md says which registries there are."""

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
    """(`__all__`, `__getattr__`, `__dir__`) of a package whose names (`exports`: module -> names)
    import on first use, so the CLI's `--help` never pays for torch or matplotlib."""
    where = {name: mod for mod, names in exports.items() for name in names}

    def __getattr__(name: str):
        if name in where:
            value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
            # bound: importing cryocube.convert.writer binds the subpackage `cryocube.convert` as
            # this name, and `from cryocube import convert` would hand out the module
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return sorted(where), __getattr__, __dir__


def source_of(entry: object) -> str:
    """The module an entry (a class or a function) was defined in, as duplicate refusals name it."""
    return getattr(entry, "__module__", None) or type(entry).__module__


class Registry(Mapping[str, T], Generic[T]):
    """Names to entries of one kind of plug-in, read like a dict; a second, different entry under a
    taken name is refused, as two plug-ins would otherwise shadow each other by import order."""

    def __init__(self, kind: str, group: str | None = None, builtin: Iterable[str] = ()):
        self.kind, self.group, self.builtin = kind, group, tuple(builtin)
        self._entries: dict[str, T] = {}
        self._sources: dict[str, str] = {}

    def add(self, name: str, entry: T, source: str | None = None) -> T:
        """Registers `entry` (`source`: the registering module, else the entry's); again: no-op."""
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
