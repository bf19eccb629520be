"""`cryocube tune`: a hyper-parameter study per (model, cube, protocol) on the cluster (see
engine/tune.py)."""

from __future__ import annotations

from ..errors import UserError


def register(sub) -> None:
    """Adds `cryocube tune` (cli.COMMAND_MODULES calls it); flags shared with evaluate mean the same
    there."""
    from ..cluster import add_cluster_args
    from ..store import options_arg
    from .cli import fractions_arg
    from .tune import PRUNERS, SAMPLERS

    p = sub.add_parser(
        "tune", help="hyper-parameter study (Optuna) over evaluate runs; resumable from its journal"
    )
    p.add_argument(
        "--cubes",
        required=True,
        help="comma-separated cube paths/URLs, or catalog dataset ids with --data-root",
    )
    p.add_argument("--data-root", help="folder/URL holding <dataset>.zarr cubes")
    p.add_argument(
        "--models",
        required=True,
        help="comma-separated model ids; one study per model, cube and protocol",
    )
    p.add_argument(
        "--protocol",
        default="frozen",
        help="comma-separated protocols (frozen, fewshot, finetune, ...)",
    )
    p.add_argument(
        "--fraction",
        type=fractions_arg,
        default=None,
        help="share of training labels (default: the protocol's)",
    )
    p.add_argument(
        "--space",
        action="append",
        default=[],
        metavar="NAME=RANGE",
        help=(
            "a recipe field to tune: lr=1e-5:1e-2:log, weight_decay=0.01:0.1,"
            " decoder_channels=128,256,512"
        ),
    )
    p.add_argument(
        "--trials",
        type=int,
        required=True,
        help="trials per study (a rerun adds only the missing ones)",
    )
    p.add_argument("--sampler", default="tpe", choices=SAMPLERS)
    p.add_argument(
        "--pruner",
        default="median",
        choices=PRUNERS,
        help=(
            "median/hyperband: each batch trains first at 1/3 of the epochs, survivors at full"
            " length"
        ),
    )
    p.add_argument(
        "--batch",
        type=int,
        default=None,
        help=(
            "trials asked and evaluated together (they share extraction and passes; default"
            " min(trials, 8))"
        ),
    )
    p.add_argument("--seed", type=int, default=0, help="the runs' seed and the sampler's")
    p.add_argument("--config", help="YAML of recipe fields, optionally with a space: section")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one recipe field (the default recipe)",
    )
    p.add_argument("--epochs", type=int, help="shorthand for --set epochs=N")
    p.add_argument("--weights", default=None, metavar="DIR", help="folder of checkpoints")
    p.add_argument(
        "--allow-random-weights",
        action="store_true",
        help="run pretrained models without a checkpoint",
    )
    p.add_argument(
        "--out",
        required=True,
        help="local results folder (results.jsonl, runs/, features/, study.journal)",
    )
    p.add_argument(
        "--storage-options",
        type=options_arg,
        default=None,
        help="JSON fsspec options for remote cubes",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    add_cluster_args(p)
    p.set_defaults(func=_tune)


def _tune(args) -> int:
    from dataclasses import replace

    from .. import outputs, store
    from ..cluster import open_cluster
    from ..families import PlanContext
    from .cli import _warn_random, resolve_cubes
    from .plan import plan_runs, runs_from_grid
    from .tune import (
        load_tune_config,
        make_pruner,
        make_sampler,
        parse_space,
        refuse_untunable,
        tune,
    )

    if args.trials < 1:  # counts are checked first: before any cube is read or cluster started
        raise UserError(f"--trials must be >= 1, got {args.trials}")
    if args.batch is not None and args.batch < 1:
        raise UserError(f"--batch must be >= 1, got {args.batch}")
    if args.epochs is not None and args.epochs < 1:
        raise UserError(f"--epochs must be >= 1, got {args.epochs}")
    # before its space is read
    refuse_untunable([p.strip() for p in args.protocol.split(",") if p.strip()])
    sets = list(args.set) + ([f"epochs={args.epochs}"] if args.epochs is not None else [])
    recipe, yaml_space = load_tune_config(args.config, sets)
    space = parse_space(args.space, yaml_space, recipe)
    make_sampler(args.sampler, space, args.seed)
    make_pruner(args.pruner, args.trials)
    if args.fraction and len(args.fraction) > 1:
        raise UserError(
            "tune takes one --fraction per study (a label-fraction curve is `evaluate --fraction`)"
        )
    protocols = [p.strip() for p in args.protocol.split(",") if p.strip()]
    bases = runs_from_grid(
        [m.strip() for m in args.models.split(",") if m.strip()],
        resolve_cubes(args.cubes, args.data_root),
        protocols,
        args.fraction or [None],
        [args.seed],
    )
    for url in {b.cube for b in bases}:
        store.register_options(url, args.storage_options)
    outputs.claim(
        args.out,
        "study",
        "tune",
        inputs=[("--cubes", c) for c in sorted({b.cube for b in bases})],
        write_marker=False,
    )
    # plan the default runs and every end of the space here: user errors surface before a cluster
    # starts
    ctx = PlanContext(
        out=args.out, weights_dir=args.weights, allow_random_weights=args.allow_random_weights
    )
    planned = plan_runs(bases, recipe, ctx)
    for prm in space:
        for v in prm.choices or (prm.low, prm.high):
            plan_runs([replace(b, overrides=((prm.name, v),)) for b in bases], recipe, ctx)
    _warn_random(planned, args.quiet)
    outputs.mark(args.out, "study", "tune")  # every check passed: the first thing written
    with open_cluster(
        args.cluster,
        n_workers=args.workers,
        threads_per_worker=args.threads_per_worker,
        memory_limit=args.memory_limit,
        quiet=args.quiet,
    ) as client:
        results = tune(
            bases,
            space,
            args.out,
            recipe,
            trials=args.trials,
            sampler=args.sampler,
            pruner=args.pruner,
            batch=args.batch,
            client=client,
            progress=not args.quiet,
            weights_dir=args.weights,
            allow_random_weights=args.allow_random_weights,
            seed=args.seed,
        )
    for r in results:
        b, d = r.best, r.baseline
        s = b["sweep"]
        m = b.get("primary_metric", "mIoU")
        states = ", ".join(f"{v} {k}" for k, v in s["n_trials"].items())
        print(
            f"study {r.study} ({states}; {r.asked} asked now): best trial {s['trial']}"
            f" {s['params']} val {s['metric']} {s['value']:.2f}"
        )
        base = (d.get("metrics") or {}).get(m)
        how = (
            f"trial {r.baseline_trial}"
            if r.baseline_trial is not None
            else "a separate run: the default lies outside the space or did not complete"
        )
        print(
            f"  test {m}: tuned {b['metrics'][m]:.2f}, default recipe {base:.2f} ({how})"
            if base is not None
            else f"  test {m}: tuned {b['metrics'][m]:.2f}, default recipe failed ({how})"
        )
        if s.get("importance"):
            print("  importance: " + ", ".join(f"{k} {v:.2f}" for k, v in s["importance"].items()))
    return 0
