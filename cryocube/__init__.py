"""cryocube: evaluate geospatial foundation models on cryosphere benchmarks over Zarr cubes with Dask."""
__version__ = "0.1.0"
