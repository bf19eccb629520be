"""Raw published layouts -> Zarr cubes. Readers register themselves on import."""
from .base import READERS, ConvertError, Reader, SourceItem, register  # noqa: F401
from . import caffe, gld, glid, gsdd, sicd  # noqa: F401  (registration)
