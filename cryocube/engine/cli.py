"""`cryocube evaluate`, and the console lines of its records (quickstart shows them too)."""

from __future__ import annotations

import contextlib

from .. import harness, outputs, store
from ..catalog import protocol
from ..cluster import announce, parse_cluster_spec, planned_threads
from ..cluster.client import cluster_threads
from ..cluster.runtime import host_cores
from ..errors import UserError
from ..families import PlanContext, get
from ..families.recipes import load_recipe
from ..mapping import names
from ..precision import this_device
from ..record import load_record
from .estimate import estimate_text, load_budget
from .evaluate import dry_run, evaluate, is_done, wait_warm, warm_workers
from .plan import plan_runs, runs_from_benchmark, runs_from_grid

# clusters whose workers are processes of this machine: started while the command plans
WARMED_WHILE_PLANNING = ("local",)


def register(sub) -> None:
    """Adds `evaluate` to the `cryocube` command (cli.COMMAND_MODULES calls it)."""
    p = sub.add_parser(
        "evaluate",
        help="evaluate models on cubes under the benchmark protocols (cached, resumable)",
    )
    harness.add_grid(
        p,
        required=False,
        models_help="comma-separated model ids (see `cryocube list models`)",
        fraction_help=(
            "share(s) of training labels, comma-separated for a label-fraction curve (default: the"
            " protocol's)"
        ),
    )
    p.add_argument("--seeds", type=int, default=1, help="number of seeds (0..N-1)")
    p.add_argument(
        "--benchmark", help="plan the grid of catalogs/benchmarks/<name>.yaml (e.g. cryobench)"
    )
    harness.add_recipe(p, "YAML file of recipe fields (epochs, lr, batch_size, ...)")
    harness.add_weights(
        p,
        "run pretrained models without a checkpoint (random init; every record and report says so)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan (runs, cache hits, weights, steps) and stop",
    )
    p.add_argument(
        "--budget",
        default=None,
        metavar="FILE",
        help=(
            "with --dry-run: estimate the wall time (and the reference's) from a budget measured by"
            " benchmarks/bench_reference.py --budget-out FILE"
        ),
    )
    harness.add_out(p, "results folder/URL (results.jsonl, runs/, features/, logs/)")
    harness.add_storage(
        p, "JSON fsspec options for remote cubes and --out (or $CRYOCUBE_STORAGE_OPTIONS)"
    )
    harness.add_quiet(p, "no progress output (results are still printed)")
    harness.add_cluster(p)
    p.set_defaults(func=_evaluate)


def weights_of(args) -> dict:
    """--weights and --allow-random-weights as `evaluate`, `tune` and `PlanContext` take them."""
    return {"weights_dir": args.weights, "allow_random_weights": args.allow_random_weights}


def grid_runs(args, protocols: list[str], seeds: list[int]):
    """The runs of --cubes x --models x `protocols` x --fraction x `seeds`."""
    cubes = harness.resolve_cubes(args.cubes, args.data_root)
    return runs_from_grid(names(args.models), cubes, protocols, args.fraction or [None], seeds)


def _specs(args):
    protocols = names(args.protocol)
    if args.seeds < 1:
        raise UserError(f"--seeds must be >= 1, got {args.seeds}")
    if args.benchmark:
        return runs_from_benchmark(
            args.benchmark,
            args.data_root,
            seeds=args.seeds,
            models=args.models.split(",") if args.models else None,
            protocols=protocols if args.protocol != "frozen" else None,
        )
    if not args.cubes or not args.models:
        raise UserError("evaluate needs --cubes and --models (or --benchmark)")
    return grid_runs(args, protocols, list(range(args.seeds)))


def _families(specs) -> list[str]:
    return sorted({protocol(s.protocol).family for s in specs})


def claim_for(args, specs, kind: str, threads: int | None = None):
    """The runs' plan context, once --out is claimed for `kind` with their cubes as its inputs."""
    cubes = sorted({s.cube for s in specs})
    for url in cubes:
        store.register_options(url, args.storage_options)
    harness.claim(args, kind, inputs=[("--cubes", c) for c in cubes], write_marker=False)
    return PlanContext(out=args.out, threads=threads, **weights_of(args))


def _evaluate(args) -> int:
    """Checks and plans here, every user error before anything is written; a local cluster starts
    first, its workers importing while this process plans, any other once the plan passed."""
    specs = _specs(args)
    # a bad budget file is refused before any cluster or planning
    budget = load_budget(args.budget) if args.budget else None
    parallel = len(set(specs))
    warm = not args.dry_run and parse_cluster_spec(args.cluster)[0] in WARMED_WHILE_PLANNING
    with contextlib.ExitStack() as stack:
        client = (
            stack.enter_context(harness.cluster_for(args, parallel, quiet=True)) if warm else None
        )
        warming = warm_workers(client, _families(specs)) if warm else None
        # a field no requested family reads is refused, not accepted and ignored
        sets = harness.recipe_sets(args)
        recipe = load_recipe(args.config, sets, families=tuple(_families(specs)))
        # a plan of fewer runs than cores gets fewer workers, each with more threads
        ctx = claim_for(args, specs, "results", harness.threads_for(args, parallel))
        if warm:
            ctx.device = this_device()
        planned = plan_runs(specs, recipe, ctx)
        if args.dry_run:
            return _show_plan(args, planned, budget)
        warn_random(planned)
        outputs.mark(args.out, "results", "evaluate")  # every check passed: the first thing written
        if client is None:
            client = stack.enter_context(harness.cluster_for(args, parallel))
        elif not args.quiet:
            announce(args.cluster, client)
        # a plan made here holds when the workers are what it assumed (they are, on one machine)
        same = (
            warm
            and wait_warm(client, warming) == ctx.device
            and cluster_threads(client) == ctx.threads
        )
        kw = weights_of(args) | {"progress": not args.quiet}
        res = evaluate(planned if same else specs, args.out, recipe, client=client, **kw)
        print_records(res.records, res.skipped)
        return 1 if any(r.get("status") != "ok" for r in res.records) else 0


def _show_plan(args, planned, budget) -> int:
    """`evaluate --dry-run`: the plan, and with --budget its estimated wall time."""
    root = args.out.rstrip("/")

    def workers_for(t: int) -> int | None:
        return next(
            (w for w in range(1, host_cores() + 1) if planned_threads(args.cluster, w, None) == t),
            None,
        )

    def prepared(key: str) -> bool:
        return any(store.exists(f"{root}/{d}/{key}.zarr") for d in ("features", "embeddings"))

    workers = workers_for if args.threads_per_worker is None else None
    print(dry_run(planned, args.out, prepared, workers))
    if budget is not None:
        todo = [p for p in planned if not is_done(args.out, p)]
        print(estimate_text(todo, budget, args.budget))
    print(
        "(precision auto is decided by the workers' device, and the default torch threads by"
        " the cluster's configuration; this plan assumed this machine's)"
    )
    return 0


def run_handed(job, args) -> int:
    """A family command's runs (`EngineRuns`) through `evaluate`; the command shows records."""
    with harness.cluster_for(args) as client:
        evaluate(job.runs, job.out, client=client, progress=not args.quiet)
    return job.show([load_record(job.out, p.run_id).to_dict() for p in job.runs])


def warn_random(planned) -> None:
    """Says which pretrained models run with random weights (--allow-random-weights)."""
    both = ("random_init", "pretrained")
    if rnd := sorted({p.spec.model for p in planned if all(p.record.weights[k] for k in both)}):
        harness.warn(
            f"{', '.join(rnd)} run with RANDOM weights (--allow-random-weights): the results"
            " measure the pipeline, not the pretrained models; records and reports mark them"
            " random_init"
        )


def metrics_text(r: dict) -> str:
    """A record's metrics as its family shows them, the primary metric (mIoU, Q, ...) first."""
    fam = get(r.get("family") or "segmentation")
    names = [r.get("primary_metric") or fam.primary_metric, *fam.shown_metrics]
    m = r.get("metrics") or {}
    return "  ".join(
        f"{n} {m[n]:6.2f}" if abs(m[n]) >= 1 else f"{n} {m[n]:6.3f}"
        for n in names
        if isinstance(m.get(n), (int, float))
    )


def print_records(records: list[dict], skipped: list[str]) -> None:
    """The console summary of `evaluate` and `quickstart`: a line per run, then the cached count."""
    for r in sorted(records, key=lambda r: (r["dataset"], r["protocol"], r["model"], r["seed"])):
        w = r.get("weights") or {}
        tag = " (random init)" if w.get("random_init") and w.get("pretrained") else ""
        if r.get("status") == "ok":
            t = (r.get("timings") or {}).get("total_s")
            print(
                f"{r['dataset']:<6} {r['protocol']:<12} {r['fraction']:<4g} {r['model'] + tag:<32}"
                f" seed {r['seed']}: {metrics_text(r)}"
                + (f"  {r['summary_line']}" if r.get("summary_line") else "")
                + (f"  ({t:.0f} s)" if t is not None else "")
            )
        else:
            print(
                f"{r['dataset']:<6} {r['protocol']:<12} {r['model']:<32} seed {r['seed']}: FAILED"
                f" {r['error']}"
            )
    if skipped:
        print(f"{len(skipped)} runs already done (cached), not recomputed")
