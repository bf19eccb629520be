"""Planning: run specs -> planned runs (each through its protocol's family), every check on the
client before any work reaches a worker, so a user error never costs a cluster start."""

from __future__ import annotations

from ..catalog import load_benchmark, protocol
from ..cube import CubeInfo, cube_info
from ..errors import UserError
from ..families import PlanContext, PlannedRun, RunSpec, get
from ..families.recipes import Recipe


def runs_from_grid(
    models: list[str],
    cubes: list[str],
    protocols: list[str],
    fractions: list[float | None],
    seeds: list[int],
) -> list[RunSpec]:
    """Every cube x model x protocol x fraction x seed as a RunSpec, cube-major; none: an error."""
    out = [
        RunSpec(model=m, cube=c, protocol=pr, fraction=f, seed=s)
        for c in cubes
        for m in models
        for pr in protocols
        for f in fractions
        for s in seeds
    ]
    if not out:
        raise UserError("no runs selected")
    return out


def runs_from_benchmark(
    name: str,
    data_root: str | None,
    seeds: int = 1,
    models: list[str] | None = None,
    protocols: list[str] | None = None,
) -> list[RunSpec]:
    """The grid of catalogs/benchmarks/<name>.yaml: models x datasets x protocols (x seeds)."""
    if not data_root:
        raise UserError("--benchmark needs --data-root holding <dataset>.zarr cubes")
    b = load_benchmark(name)
    runs = []
    for pname, p in b.protocols.items():
        if protocols and pname not in protocols:
            continue
        protocol(pname)  # defined in catalogs/protocols.yaml
        for d in p.get("datasets", b.datasets):
            for row in b.models:
                model = b.model_for(row, d)
                if models and model not in models and row not in models:
                    continue
                runs += [
                    RunSpec(
                        model=model,
                        cube=f"{data_root.rstrip('/')}/{d}.zarr",
                        protocol=pname,
                        seed=s,
                    )
                    for s in range(seeds)
                ]
    if not runs:
        raise UserError(f"{b.path}: the selection matches no runs")
    return runs


def plan_runs(
    runs: list[RunSpec], recipe: Recipe, ctx: PlanContext, cubes: dict[str, CubeInfo] | None = None
) -> list[PlannedRun]:
    """Every run planned up front (a user error fails before any work), each run id once."""
    cubes = {} if cubes is None else cubes
    planned: dict[str, PlannedRun] = {}
    for r in runs:
        if r.cube not in cubes:
            cubes[r.cube] = cube_info(r.cube)
        family = get(protocol(r.protocol).family)
        p = family.plan(r, cubes[r.cube], recipe.of(family.name), ctx)
        planned.setdefault(p.run_id, p)
    return list(planned.values())
