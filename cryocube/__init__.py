"""cryocube: evaluate geospatial foundation models on cryosphere benchmarks over Zarr cubes with
Dask.

The notebook API (names load on first use, so `import cryocube` stays light):

    from cryocube import evaluate, load_recipe, runs_from_grid, build_report
    runs = runs_from_grid(["dofa"], ["s3://bucket/glid.zarr"], ["frozen"], [None], [0, 1, 2])
    res = evaluate(runs, "s3://bucket/results", load_recipe(overrides=["epochs=80"]), client=client)
    df = open_results("s3://bucket/results")    # pandas, one row per run; df.cryocube.to_xarray()
"""

__version__ = "0.2.0"

import warnings as _warnings
from importlib import import_module as _import

# zarr warns on every consolidated-metadata write for v3 stores; cubes rely on it deliberately
# (one GET for all metadata on object stores) and xarray/zarr both read it.
_warnings.filterwarnings(
    "ignore", message="Consolidated metadata is currently not part", category=UserWarning
)

_API = {
    "evaluate": "cryocube.engine.evaluate",
    "plan_runs": "cryocube.engine.plan",
    "runs_from_grid": "cryocube.engine.plan",
    "runs_from_benchmark": "cryocube.engine.plan",
    "RunSpec": "cryocube.families",
    "load_recipe": "cryocube.families.recipes",
    "convert": "cryocube.convert.writer",
    "open_cube": "cryocube.cube",
    "build_report": "cryocube.pages",
    "cluster_info": "cryocube.cluster",
    "gpu_resources": "cryocube.cluster",
    "plan_embedding": "cryocube.embeddings.embed",
    "embed": "cryocube.embeddings.embed",
    "load_embeddings": "cryocube.embeddings.embed",
    "probe_embeddings": "cryocube.families.embedding.work",
    "probe_recipe": "cryocube.families.embedding.probe",
    "open_results": "cryocube.results",
}
__all__ = ["__version__", *sorted(_API)]


def __getattr__(name: str):
    if name in _API:
        value = getattr(_import(_API[name]), name)
        # bound here: importing cryocube.convert.writer binds the subpackage `cryocube.convert`
        # as this name, and `from cryocube import convert` would hand out the module
        globals()[name] = value
        return value
    raise AttributeError(f"module 'cryocube' has no attribute {name!r}")
