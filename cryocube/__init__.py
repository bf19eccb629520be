"""cryocube: evaluate geospatial foundation models on cryosphere benchmarks over Zarr cubes with Dask."""
__version__ = "0.1.0"

import warnings as _warnings

# zarr warns on every consolidated-metadata write for v3 stores; cubes rely on it deliberately
# (one GET for all metadata on object stores) and xarray/zarr both read it.
_warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part", category=UserWarning)
