"""Plan runs from a benchmark catalog (catalogs/benchmarks/<name>.yaml): models x datasets x protocols."""
from __future__ import annotations

from ..catalog import CatalogError, load_yaml
from ..errors import UserError
from .runs import RunSpec


def runs_from_benchmark(name: str, data_root: str | None, seeds: int = 1, models: list[str] | None = None,
                        protocols: list[str] | None = None) -> list[RunSpec]:
    if not data_root:
        raise UserError("--benchmark needs --data-root holding <dataset>.zarr cubes")
    b = load_yaml("benchmarks", name)
    where = f"catalogs/benchmarks/{name}.yaml"
    try:
        datasets, entries, protos = b["datasets"], b["models"], b["protocols"]
    except KeyError as e:
        raise CatalogError(f"{where}: missing field {e}") from None
    runs = []
    for pname, p in protos.items():
        if protocols and pname not in protocols:
            continue
        for d in p.get("datasets", datasets):
            for row, m in entries.items():
                model = m if isinstance(m, str) else m.get(d, m["default"])
                if models and model not in models and row not in models:
                    continue
                for s in range(seeds):
                    runs.append(RunSpec(model=model, cube=f"{data_root.rstrip('/')}/{d}.zarr", protocol=pname,
                                        fraction=p.get("fraction"), seed=s))
    if not runs:
        raise UserError(f"{where}: the selection matches no runs")
    return runs
