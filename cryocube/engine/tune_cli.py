"""`cryocube tune`: a hyper-parameter study per (model, cube, protocol); see engine/tune.py."""

from __future__ import annotations

from dataclasses import replace

from .. import harness, outputs
from ..errors import UserError
from ..mapping import names
from .cli import claim_for, grid_runs, warn_random, weights_of
from .tune import PRUNERS, SAMPLERS


def register(sub) -> None:
    """Adds `cryocube tune`; flags shared with evaluate mean the same there."""
    p = sub.add_parser(
        "tune", help="hyper-parameter study (Optuna) over evaluate runs; resumable from its journal"
    )
    harness.add_grid(
        p,
        required=True,
        models_help="comma-separated model ids; one study per model, cube and protocol",
        fraction_help="share of training labels (default: the protocol's)",
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
    harness.add_recipe(
        p,
        "YAML of recipe fields, optionally with a space: section",
        "override one recipe field (the default recipe)",
    )
    harness.add_weights(p)
    harness.add_out(p, "local results folder (results.jsonl, runs/, features/, study.journal)")
    harness.add_storage(p, "JSON fsspec options for remote cubes")
    harness.add_quiet(p)
    harness.add_cluster(p)
    p.set_defaults(func=_tune)


def _checked(args):
    """(bases, recipe, space) once every input passed, the default runs and every end of the space
    planned here: user errors surface before a cluster starts."""
    from .plan import plan_runs
    from .tune import load_tune_config, make_pruner, make_sampler, parse_space, refuse_untunable

    for flag, v in (("--trials", args.trials), ("--batch", args.batch), ("--epochs", args.epochs)):
        if v is not None and v < 1:  # before any cube is read
            raise UserError(f"{flag} must be >= 1, got {v}")
    protocols = names(args.protocol)
    refuse_untunable(protocols)  # before its space is read
    recipe, yaml_space = load_tune_config(args.config, harness.recipe_sets(args))
    space = parse_space(args.space, yaml_space, recipe)
    make_sampler(args.sampler, space, args.seed)
    make_pruner(args.pruner, args.trials)
    if args.fraction and len(args.fraction) > 1:
        raise UserError(
            "tune takes one --fraction per study (a label-fraction curve is `evaluate --fraction`)"
        )
    bases = grid_runs(args, protocols, [args.seed])
    ctx = claim_for(args, bases, "study")
    planned = plan_runs(bases, recipe, ctx)
    for prm in space:
        for v in prm.choices or (prm.low, prm.high):
            plan_runs([replace(b, overrides=((prm.name, v),)) for b in bases], recipe, ctx)
    warn_random(planned)
    return bases, recipe, space


def _tune(args) -> int:
    from .tune import tune

    bases, recipe, space = _checked(args)
    outputs.mark(args.out, "study", "tune")  # every check passed: the first thing written
    kw = {k: getattr(args, k) for k in ("trials", "sampler", "pruner", "batch", "seed")}
    kw |= weights_of(args) | {"progress": not args.quiet}
    with harness.cluster_for(args) as client:
        results = tune(bases, space, args.out, recipe, client=client, **kw)
    for r in results:
        _show_study(r)
    return 0


def _show_study(r) -> None:
    """The best trial against the default recipe, and each field's importance."""
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
    default = f"{base:.2f}" if base is not None else "failed"
    print(f"  test {m}: tuned {b['metrics'][m]:.2f}, default recipe {default} ({how})")
    if s.get("importance"):
        print("  importance: " + ", ".join(f"{k} {v:.2f}" for k, v in s["importance"].items()))
