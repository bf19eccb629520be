"""cryocube: evaluate geospatial foundation models on cryosphere benchmarks over Zarr cubes with
Dask.

The notebook API (names load on first use, so `import cryocube` stays light):

    from cryocube import evaluate, load_recipe, runs_from_grid, build_report
    runs = runs_from_grid(["dofa"], ["s3://bucket/glid.zarr"], ["frozen"], [None], [0, 1, 2])
    res = evaluate(runs, "s3://bucket/results", load_recipe(overrides=["epochs=80"]), client=client)
    df = open_results("s3://bucket/results")    # pandas, one row per run; df.cryocube.to_xarray()
"""

__version__ = "0.3.1"

import warnings as _warnings

from .plugins import lazy_exports

# zarr warns on every consolidated-metadata write for v3 stores; cubes rely on it deliberately
# (one GET for all metadata on object stores) and xarray/zarr both read it.
_warnings.filterwarnings(
    "ignore", message="Consolidated metadata is currently not part", category=UserWarning
)

_EXPORTS = {
    "engine.evaluate": ("evaluate",),
    "engine.plan": ("plan_runs", "runs_from_grid", "runs_from_benchmark"),
    "families": ("RunSpec",),
    "families.recipes": ("load_recipe",),
    "convert.writer": ("convert",),
    "cube": ("open_cube",),
    "pages": ("build_report",),
    "cluster": ("cluster_info", "gpu_resources"),
    "embeddings.embed": ("plan_embedding", "embed", "load_embeddings"),
    "families.embedding.work": ("probe_embeddings",),
    "families.embedding.probe": ("probe_recipe",),
    "results": ("open_results",),
}
_names, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = ["__version__", *_names]
