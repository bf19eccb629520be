"""`cryocube evaluate` and `cryocube quickstart`."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from ..errors import UserError

# clusters whose workers are processes of this machine: started while the command plans
WARMED_WHILE_PLANNING = ("local",)


def fractions_arg(text: str) -> list[float]:
    """Comma-separated numbers in (0, 1]; an empty item (`,`, `0.1,`) is refused, not skipped."""
    bad = argparse.ArgumentTypeError(
        f"--fraction takes comma-separated numbers in (0, 1], got {text!r}"
    )
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise bad from None
    if not all(0 < v <= 1 for v in values):  # NaN too
        raise bad
    return values


def register(sub) -> None:
    """Adds `evaluate` and `quickstart` to the `cryocube` command (cli.COMMAND_MODULES calls it)."""
    from ..cluster import add_cluster_args
    from ..store import options_arg

    p = sub.add_parser(
        "evaluate",
        help="evaluate models on cubes under the benchmark protocols (cached, resumable)",
    )
    p.add_argument(
        "--cubes", help="comma-separated cube paths/URLs, or catalog dataset ids with --data-root"
    )
    p.add_argument("--data-root", help="folder/URL holding <dataset>.zarr cubes")
    p.add_argument("--models", help="comma-separated model ids (see `cryocube list models`)")
    p.add_argument(
        "--protocol",
        default="frozen",
        help="comma-separated protocols (see `cryocube list protocols`)",
    )
    p.add_argument(
        "--fraction",
        type=fractions_arg,
        default=None,
        help=(
            "share(s) of training labels, comma-separated for a label-fraction curve (default: the"
            " protocol's)"
        ),
    )
    p.add_argument("--seeds", type=int, default=1, help="number of seeds (0..N-1)")
    p.add_argument(
        "--benchmark", help="plan the grid of catalogs/benchmarks/<name>.yaml (e.g. cryobench)"
    )
    p.add_argument("--config", help="YAML file of recipe fields (epochs, lr, batch_size, ...)")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override one recipe field"
    )
    p.add_argument("--epochs", type=int, help="shorthand for --set epochs=N")
    p.add_argument(
        "--weights",
        default=None,
        metavar="DIR",
        help="folder of checkpoints (default: where `cryocube weights fetch` puts them)",
    )
    p.add_argument(
        "--allow-random-weights",
        action="store_true",
        help=(
            "run pretrained models without a checkpoint (random init; every record and report"
            " says so)"
        ),
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
    p.add_argument(
        "--out", required=True, help="results folder/URL (results.jsonl, runs/, features/, logs/)"
    )
    p.add_argument(
        "--storage-options",
        type=options_arg,
        default=None,
        help="JSON fsspec options for remote cubes and --out (or $CRYOCUBE_STORAGE_OPTIONS)",
    )
    p.add_argument(
        "--quiet", action="store_true", help="no progress output (results are still printed)"
    )
    add_cluster_args(p)
    p.set_defaults(func=_evaluate)

    q = sub.add_parser(
        "quickstart",
        help="generate sample datasets, convert, evaluate a few models, print the leaderboard",
    )
    q.add_argument("--out", default="quickstart-out")
    q.add_argument("--datasets", default="glid,caffe")
    q.add_argument("--models", default="unet,vit_scratch,ssl4eo_moco")
    q.add_argument("--epochs", type=int, default=6)
    q.add_argument(
        "--interferograms",
        type=int,
        default=24,
        help=(
            "synthetic interferogram pairs for the InSAR question tasks (0: leave them out; "
            f"at least {QUICKSTART_MIN_PAIRS} with --gfm)"
        ),
    )
    q.add_argument(
        "--vlm",
        default="transformers",
        help="generative model for the interferogram tasks (adapter[:checkpoint])",
    )
    q.add_argument(
        "--gfm",
        default="ssl4eo_moco",
        help=(
            "encoder on the interferogram board beside the VLM: probed, and, when pretrained,"
            " frozen + a decoder for localisation ('': none)"
        ),
    )
    q.add_argument("--quiet", action="store_true")
    add_cluster_args(q)
    q.set_defaults(func=_quickstart)


def resolve_cubes(cubes: str, data_root: str | None) -> list[str]:
    """A --cubes item that is a catalog dataset id (and no local path) becomes
    <data-root>/<id>.zarr; without --data-root such an id is refused."""
    from ..catalog import dataset_ids

    out = []
    for c in [c.strip() for c in cubes.split(",") if c.strip()]:
        if c in dataset_ids() and not Path(c).exists():
            if not data_root:
                raise UserError(
                    f"{c!r} is a dataset id: pass --data-root holding {c}.zarr, or a cube path/URL"
                )
            out.append(f"{data_root.rstrip('/')}/{c}.zarr")
        else:
            out.append(c)
    return out


def _specs(args):
    from .plan import runs_from_benchmark, runs_from_grid

    protocols = [p.strip() for p in args.protocol.split(",") if p.strip()]
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
    return runs_from_grid(
        [m.strip() for m in args.models.split(",") if m.strip()],
        resolve_cubes(args.cubes, args.data_root),
        protocols,
        args.fraction or [None],
        list(range(args.seeds)),
    )


def _families(specs) -> list[str]:
    from ..catalog import protocol

    return sorted({protocol(s.protocol).family for s in specs})


def _checked(args, specs):
    """(recipe, plan context) once the recipe and --out pass their checks (no cluster needed)."""
    from .. import outputs, store
    from ..cluster import planned_threads
    from ..families import PlanContext
    from ..families.recipes import load_recipe

    sets = list(args.set) + ([f"epochs={args.epochs}"] if args.epochs is not None else [])
    # a field no requested family reads is refused, not accepted and ignored
    recipe = load_recipe(args.config, sets, families=tuple(_families(specs)))
    for url in [args.out, *{s.cube for s in specs}]:
        store.register_options(url, args.storage_options)
    outputs.claim(
        args.out,
        "results",
        "evaluate",
        inputs=[("--cubes", c) for c in sorted({s.cube for s in specs})],
        write_marker=False,
    )
    ctx = PlanContext(
        out=args.out,
        weights_dir=args.weights,
        allow_random_weights=args.allow_random_weights,
        threads=planned_threads(
            args.cluster, args.workers, args.threads_per_worker, parallel=len(set(specs))
        ),
    )
    return recipe, ctx


def _evaluate(args) -> int:
    from ..cluster import parse_cluster_spec

    specs = _specs(args)
    budget = None
    if args.budget:
        from .estimate import load_budget

        budget = load_budget(args.budget)  # a bad file is refused before any cluster or planning
    if not args.dry_run and parse_cluster_spec(args.cluster)[0] in WARMED_WHILE_PLANNING:
        return _evaluate_warmed(args, specs)
    from .. import outputs, store
    from ..cluster import planned_threads
    from .evaluate import dry_run
    from .plan import plan_runs

    # any other cluster: check and plan on this machine first, every user error before a cluster
    # starts
    recipe, ctx = _checked(args, specs)
    # a plan of fewer runs than cores gets fewer workers, each with more threads
    parallel = len(set(specs))
    planned = plan_runs(specs, recipe, ctx)
    if args.dry_run:
        root = args.out.rstrip("/")

        # the --workers whose local cluster gives t torch threads
        def workers_for(t: int) -> int | None:
            from ..cluster.runtime import host_cores

            return next(
                (
                    w
                    for w in range(1, host_cores() + 1)
                    if planned_threads(args.cluster, w, None) == t
                ),
                None,
            )

        print(
            dry_run(
                planned,
                args.out,
                lambda key: any(
                    store.exists(f"{root}/{d}/{key}.zarr") for d in ("features", "embeddings")
                ),
                workers_for if args.threads_per_worker is None else None,
            )
        )
        if budget is not None:
            from .estimate import estimate_text
            from .records import load_record

            todo = [
                p
                for p in planned
                if (r := load_record(args.out, p.run_id)) is None or r.get("status") != "ok"
            ]
            print(estimate_text(todo, budget, args.budget))
        print(
            "(precision auto is decided by the workers' device, and the default torch threads by"
            " the cluster's configuration; this plan assumed this machine's)"
        )
        return 0
    _warn_random(planned, args.quiet)
    outputs.mark(args.out, "results", "evaluate")  # every check passed: the first thing written
    with _open_cluster(args, parallel, quiet=args.quiet) as client:
        return _run_and_show(args, specs, recipe, client)


def _open_cluster(args, parallel: int, quiet: bool):
    """The cluster evaluate's --cluster flags ask for, sized to a plan of `parallel` runs."""
    from ..cluster import open_cluster

    return open_cluster(
        args.cluster,
        n_workers=args.workers,
        threads_per_worker=args.threads_per_worker,
        memory_limit=args.memory_limit,
        quiet=quiet,
        parallel=parallel,
    )


def _run_and_show(args, runs, recipe, client) -> int:
    """The runs (specs, or runs planned already) through the engine; their records printed, exit 1
    when one failed."""
    from .evaluate import evaluate

    res = evaluate(
        runs,
        args.out,
        recipe,
        client=client,
        progress=not args.quiet,
        weights_dir=args.weights,
        allow_random_weights=args.allow_random_weights,
    )
    print_records(res.records, res.skipped)
    return 1 if any(r.get("status") != "ok" for r in res.records) else 0


def _evaluate_warmed(args, specs) -> int:
    """`evaluate` on a local cluster: its worker processes start first and import what the runs'
    first tasks need while this process checks and plans (seconds of a short run). A user error
    closes them before anything is written; the cluster line waits for a plan that passed."""
    from .. import outputs
    from ..cluster import announce
    from ..cluster.client import cluster_threads
    from ..precision import this_device
    from .evaluate import wait_warm, warm_workers
    from .plan import plan_runs

    with _open_cluster(args, len(set(specs)), quiet=True) as client:
        warm = warm_workers(client, _families(specs))
        recipe, ctx = _checked(args, specs)
        ctx.device = this_device()
        planned = plan_runs(specs, recipe, ctx)
        _warn_random(planned, args.quiet)
        outputs.mark(args.out, "results", "evaluate")  # every check passed: the first thing written
        if not args.quiet:
            announce(args.cluster, client)
        # the plan holds when the workers are what this process assumed (they are, on one machine)
        same = wait_warm(client, warm) == ctx.device and cluster_threads(client) == ctx.threads
        return _run_and_show(args, planned if same else specs, recipe, client)


def run_handed(job, args) -> int:
    """A family command's runs (`EngineRuns`) through `evaluate`, on the cluster its --cluster flags
    ask for; the command shows their records, cached ones included."""
    from ..cluster import open_cluster
    from .evaluate import evaluate
    from .records import load_record

    with open_cluster(
        args.cluster,
        n_workers=args.workers,
        threads_per_worker=args.threads_per_worker,
        memory_limit=args.memory_limit,
        quiet=args.quiet,
    ) as client:
        evaluate(job.runs, job.out, client=client, progress=not args.quiet)
    return job.show([load_record(job.out, p.run_id) for p in job.runs])


def _warn_random(planned, quiet: bool) -> None:
    rnd = sorted(
        {
            p.spec.model
            for p in planned
            if p.record["weights"]["random_init"] and p.record["weights"]["pretrained"]
        }
    )
    if rnd:
        print(
            f"cryocube: WARNING: {', '.join(rnd)} run with RANDOM weights (--allow-random-weights):"
            " the results measure the pipeline, not the pretrained models; records and reports"
            " mark them random_init",
            file=sys.stderr,
        )


def metrics_text(r: dict) -> str:
    """A record's metrics as its family shows them: the primary metric first (mIoU, Q, ...), then
    the others."""
    from ..families import get

    fam = get(r.get("family") or "segmentation")
    names = [r.get("primary_metric") or fam.primary_metric, *fam.shown_metrics]
    m = r.get("metrics") or {}
    return "  ".join(
        f"{n} {m[n]:6.2f}" if abs(m[n]) >= 1 else f"{n} {m[n]:6.3f}"
        for n in names
        if isinstance(m.get(n), (int, float))
    )


def print_records(records: list[dict], skipped: list[str]) -> None:
    """The console summary of `evaluate` and `quickstart`: a line per run (failed ones with their
    error), then how many were cached."""
    for r in sorted(records, key=lambda r: (r["dataset"], r["protocol"], r["model"], r["seed"])):
        tag = (
            " (random init)"
            if (r.get("weights") or {}).get("random_init")
            and (r.get("weights") or {}).get("pretrained")
            else ""
        )
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


# the embedding probe's R² needs 2 test rows of a 10 % split (families/embedding/probe.py)
QUICKSTART_MIN_PAIRS = 11
# a 10 % few-shot subset is then ~5 tiles, one per stratum or more
QUICKSTART_TILES = {"train": 48, "val": 8, "test": 8}
QUICKSTART_SCENES = {"train": 6, "val": 1, "test": 1}


def chance_miou(cube: str) -> float:
    """mIoU of predicting every pixel as the test split's most frequent class (what any model must
    beat)."""

    from ..cube import as_text, open_cube

    ds = open_cube(cube)
    test = as_text(ds["split"].values) == "test"
    frac = ds["class_fraction"].values[test].mean(axis=0)
    return float(100 * frac.max() / frac.size) if frac.size else float("nan")


def _insar_runs(args, out: Path, client) -> list:
    """Synthetic interferograms (Mogi sources, atmosphere, ramps, decorrelation) as a cube, asked
    the InSAR-VLM-Bench questions by a tiny random VLM (and by the same VLM blind), and one encoder
    (--gfm) on the same board: answering through linear heads on its embeddings (phase and coherence
    by the cross-sensor band rule), probed for the embedding report and, when it is a pretrained
    (frozen) encoder, segmenting the deformation masks (its localisation cell: mask -> box IoU).
    Every row is scored on the cube's test split, beside the chance row.
    """
    from ..convert.writer import convert
    from ..families import RunSpec
    from ..insar_synthetic import make_interferograms
    from ..models import model_spec

    raw = out / "raw" / "insar"
    if not raw.exists():
        make_interferograms(raw, n=args.interferograms, size=32, seed=1)
    cube = str(out / "cubes" / "insar.zarr")
    convert("insar", str(raw), cube, client=client, progress=not args.quiet)
    if not args.quiet:
        gfm = (
            f" and the encoder {args.gfm} answers them through linear heads (and is probed on the"
            " same pairs)"
            if args.gfm
            else ""
        )
        print(
            f"cryocube quickstart: {args.interferograms} synthetic interferograms; {args.vlm}"
            " answers the four InSAR-VLM-Bench questions, once more blind (a blank picture: the"
            f" blind baseline){gfm}, beside the chance baseline, all with RANDOM weights (a tiny"
            " random-config LLaVA, a random encoder; no downloads): random models measure the"
            " pipeline (rendering, batched generation, embedding, parsing, probing, scoring), not"
            " what a model can read from an interferogram. The board marks what an encoder cannot"
            " answer.",
            file=sys.stderr,
        )
    # the VLM, and the same VLM shown blank pictures (the blind baseline: what it scores without the
    # picture)
    runs = [
        RunSpec(args.vlm, cube, "vqa", overrides=(("max_new_tokens", 12),) + blind)
        for blind in ((), (("blind", True),))
    ]
    if not args.gfm:
        return runs
    # linear answer heads: the VLM's questions, metrics and test samples
    runs.append(RunSpec(args.gfm, cube, "heads"))
    runs.append(RunSpec(args.gfm, cube, "probe"))  # NeuCo-Bench's probes: the embedding report
    # localisation through the segmentation family (mask -> box IoU)
    if model_spec(args.gfm).pretrained:
        runs.append(RunSpec(args.gfm, cube, "frozen", overrides=(("input_size", 32),)))
        if not args.quiet:
            print(
                f"cryocube quickstart: {args.gfm} (frozen) + a decoder also segment the"
                " interferograms' deformation masks; the box of each predicted mask fills its"
                " 'Localisation IoU' cell.",
                file=sys.stderr,
            )
    return runs


def _quickstart(args) -> int:
    from .. import outputs
    from ..cluster import open_cluster
    from ..convert.writer import convert
    from ..families.recipes import load_recipe
    from ..models import model_spec
    from ..synthetic import RECIPES, make_raw
    from .evaluate import evaluate
    from .plan import runs_from_grid

    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.interferograms < 0 or (args.gfm and 0 < args.interferograms < QUICKSTART_MIN_PAIRS):
        raise UserError(
            f"--interferograms {args.interferograms}: the probe of --gfm {args.gfm} needs at least "
            f"{QUICKSTART_MIN_PAIRS} labelled pairs (R² on a 10 % test split); pass "
            f"{QUICKSTART_MIN_PAIRS} or more, --gfm '' to leave the encoder out, or 0 to leave the "
            "interferograms out"
        )
    if not (datasets and models) and args.interferograms == 0:
        raise UserError(
            "quickstart has nothing to run: --datasets and --models are empty and --interferograms"
            " is 0"
        )
    outputs.claim(args.out, "quickstart", "quickstart")
    out = Path(args.out)
    recipe = load_recipe(
        None,
        [
            f"epochs={args.epochs}",
            "decoder_channels=64",
            "input_size=64",
            "val_every=2",
            "batch_size=8",
            "crops_per_sample=2",
            "normalization=cube",
        ],
    )
    pretrained = [m for m in models if model_spec(m).pretrained]
    if args.gfm and args.interferograms:
        model_spec(args.gfm)  # an unknown id is refused before the cluster starts
    if datasets and not args.quiet:
        print(
            f"cryocube quickstart: sample data, {args.epochs} epochs ({10 * args.epochs} for"
            " few-shot runs), 64 px crops. The pretrained models"
            f" ({', '.join(pretrained) or 'none'}) run with RANDOM weights here (no downloads): the"
            " numbers measure the pipeline on learnable synthetic data, not the models.",
            file=sys.stderr,
        )
    with open_cluster(
        args.cluster,
        n_workers=args.workers,
        threads_per_worker=args.threads_per_worker,
        memory_limit=args.memory_limit,
        quiet=args.quiet,
    ) as client:
        cubes = []
        for d in datasets:
            raw = out / "raw" / d
            if not raw.exists():
                make_raw(
                    d, raw, n=QUICKSTART_SCENES if RECIPES[d].scenes else QUICKSTART_TILES, seed=1
                )
            cube = str(out / "cubes" / f"{d}.zarr")
            convert(d, str(raw), cube, client=client, tile_size=64, progress=not args.quiet)
            cubes.append(cube)
        runs = []
        if cubes and models:  # `--datasets ''` runs only the interferogram board
            runs = runs_from_grid(models, cubes, ["frozen"], [None], [0])
            # a 10 % subset has a tenth of the steps per epoch: few-shot runs get ten times the
            # epochs, so every run
            # takes about as many optimisation steps (on the sample data 6 epochs of 5 tiles would
            # learn nothing)
            fewshot_epochs = (("epochs", args.epochs * 10),)
            runs += [
                replace(r, overrides=fewshot_epochs)
                for r in runs_from_grid(pretrained or models, cubes, ["fewshot"], [None], [0])
            ]
        if args.interferograms > 0:
            runs += _insar_runs(args, out, client)
        res = evaluate(
            runs,
            str(out / "results"),
            recipe,
            client=client,
            progress=not args.quiet,
            allow_random_weights=True,
        )
    print_records(res.records, res.skipped)
    for d, c in zip(datasets, cubes):
        print(
            f"{d}: predicting every pixel as the most frequent class scores mIoU"
            f" {chance_miou(c):.2f} (chance level)"
        )
    from ..pages import build_report
    from ..report.tables import to_markdown

    rep = build_report([str(out / "results")], str(out / "report"))
    for name, table in rep.tables.items():
        if name.endswith("/leaderboard") or name.startswith("vqa/leaderboard_"):
            print("\n" + to_markdown(table))
    print(f"\nreport: {rep.html}")
    return 0
