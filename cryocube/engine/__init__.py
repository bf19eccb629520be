"""The engine: planning runs, scheduling their work on Dask, tune studies; it knows no family."""
