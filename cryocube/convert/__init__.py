"""Raw published layouts -> Zarr cubes: readers (one per kind of layout, chosen by the catalog) and
the writer."""

from .base import ConvertError, open_reader, readers

__all__ = ["ConvertError", "open_reader", "readers"]
