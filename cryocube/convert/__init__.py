"""Raw published layouts -> Zarr cubes: readers (one per kind of layout, chosen by the catalog) and
the writer."""

from .base import (
    READERS,
    ConvertError,
    Reader,
    SourceItem,
    open_reader,
    readers,
    register,
)

__all__ = [
    "READERS",
    "ConvertError",
    "Reader",
    "SourceItem",
    "open_reader",
    "readers",
    "register",
]
