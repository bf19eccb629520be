"""`cryocube quickstart`: sample data converted, evaluated by a few random-weight models, shown."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from ..errors import UserError
from ..harness import add_cluster, add_out, add_quiet, claim, cluster_for
from ..mapping import names
from .cli import print_records

# the embedding probe's R² needs 2 test rows of a 10 % split (families/embedding/probe.py)
QUICKSTART_MIN_PAIRS = 11
# a 10 % few-shot subset is then ~5 tiles, one per stratum or more
QUICKSTART_TILES = {"train": 48, "val": 8, "test": 8}
QUICKSTART_SCENES = {"train": 6, "val": 1, "test": 1}
RECIPE = (
    "decoder_channels=64",
    "input_size=64",
    "val_every=2",
    "batch_size=8",
    "crops_per_sample=2",
    "normalization=cube",
)


def register(sub) -> None:
    """Adds `quickstart` to the `cryocube` command (cli.COMMAND_MODULES calls it)."""
    q = sub.add_parser(
        "quickstart",
        help="generate sample datasets, convert, evaluate a few models, print the leaderboard",
    )
    add_out(q, None, required=False, default="quickstart-out")
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
    add_quiet(q, None)
    add_cluster(q)
    q.set_defaults(func=_quickstart)


def _say(text: str, args) -> None:
    if not args.quiet:
        print(f"cryocube quickstart: {text}", file=sys.stderr)


def chance_miou(cube: str) -> float:
    """mIoU of calling every pixel the test split's most frequent class (what a model must beat)."""
    from ..cube import as_text, open_cube

    ds = open_cube(cube)
    test = as_text(ds["split"].values) == "test"
    frac = ds["class_fraction"].values[test].mean(axis=0)
    return float(100 * frac.max() / frac.size) if frac.size else float("nan")


def _check(args) -> tuple[list[str], list[str]]:
    """(datasets, models) once the counts pass and --out is claimed."""
    datasets, models = names(args.datasets), names(args.models)
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
    claim(args, "quickstart")
    return datasets, models


def _sample_runs(args, out: Path, datasets, models, pretrained, client) -> tuple[list, list]:
    """(cubes, runs): sample cubes, each model frozen, the pretrained (else all) few-shot too."""
    from ..convert.writer import convert
    from ..synthetic import RECIPES, make_raw
    from .plan import runs_from_grid

    cubes = []
    for d in datasets:
        raw = out / "raw" / d
        if not raw.exists():
            n = QUICKSTART_SCENES if RECIPES[d].scenes else QUICKSTART_TILES
            make_raw(d, raw, n=n, seed=1)
        cube = str(out / "cubes" / f"{d}.zarr")
        convert(d, str(raw), cube, client=client, tile_size=64, progress=not args.quiet)
        cubes.append(cube)
    if not (cubes and models):  # `--datasets ''` runs only the interferogram board
        return cubes, []
    runs = runs_from_grid(models, cubes, ["frozen"], [None], [0])
    # a 10 % subset has a tenth of the steps per epoch: few-shot runs get ten times the epochs, so
    # every run takes about as many optimisation steps (6 epochs of 5 tiles would learn nothing)
    fewshot_epochs = (("epochs", args.epochs * 10),)
    runs += [
        replace(r, overrides=fewshot_epochs)
        for r in runs_from_grid(pretrained or models, cubes, ["fewshot"], [None], [0])
    ]
    return cubes, runs


def _insar_runs(args, out: Path, client) -> list:
    """Synthetic interferograms asked InSAR-VLM-Bench's questions by a VLM (and blind) and --gfm."""
    from ..convert.writer import convert
    from ..families import RunSpec
    from ..insar_synthetic import make_interferograms
    from ..models import model_spec

    raw = out / "raw" / "insar"
    if not raw.exists():
        make_interferograms(raw, n=args.interferograms, size=32, seed=1)
    cube = str(out / "cubes" / "insar.zarr")
    convert("insar", str(raw), cube, client=client, progress=not args.quiet)
    gfm = (
        f" and the encoder {args.gfm} answers them through linear heads (and is probed on the"
        " same pairs)"
        if args.gfm
        else ""
    )
    _say(
        f"{args.interferograms} synthetic interferograms; {args.vlm}"
        " answers the four InSAR-VLM-Bench questions, once more blind (a blank picture: the"
        f" blind baseline){gfm}, beside the chance baseline, all with RANDOM weights (a tiny"
        " random-config LLaVA, a random encoder; no downloads): random models measure the"
        " pipeline (rendering, batched generation, embedding, parsing, probing, scoring), not"
        " what a model can read from an interferogram. The board marks what an encoder cannot"
        " answer.",
        args,
    )
    # the VLM, and the same VLM shown blank pictures (what it scores without the picture)
    runs = [
        RunSpec(args.vlm, cube, "vqa", overrides=(("max_new_tokens", 12),) + blind)
        for blind in ((), (("blind", True),))
    ]
    if not args.gfm:
        return runs
    runs.append(RunSpec(args.gfm, cube, "heads"))  # linear answer heads: the VLM's questions
    runs.append(RunSpec(args.gfm, cube, "probe"))  # NeuCo-Bench's probes: the embedding report
    if model_spec(args.gfm).pretrained:  # localisation through the segmentation family
        runs.append(RunSpec(args.gfm, cube, "frozen", overrides=(("input_size", 32),)))
        _say(
            f"{args.gfm} (frozen) + a decoder also segment the interferograms' deformation masks;"
            " the box of each predicted mask fills its 'Localisation IoU' cell.",
            args,
        )
    return runs


def _quickstart(args) -> int:
    from ..families.recipes import load_recipe
    from ..models import model_spec
    from ..pages import build_report
    from ..report.tables import to_markdown
    from .evaluate import evaluate

    datasets, models = _check(args)
    out = Path(args.out)
    recipe = load_recipe(None, [f"epochs={args.epochs}", *RECIPE])
    pretrained = [m for m in models if model_spec(m).pretrained]
    if args.gfm and args.interferograms:
        model_spec(args.gfm)  # an unknown id is refused before the cluster starts
    if datasets:
        _say(
            f"sample data, {args.epochs} epochs ({10 * args.epochs} for few-shot runs), 64 px"
            f" crops. The pretrained models ({', '.join(pretrained) or 'none'}) run with RANDOM"
            " weights here (no downloads): the numbers measure the pipeline on learnable"
            " synthetic data, not the models.",
            args,
        )
    with cluster_for(args) as client:
        cubes, runs = _sample_runs(args, out, datasets, models, pretrained, client)
        if args.interferograms > 0:
            runs += _insar_runs(args, out, client)
        results = str(out / "results")
        res = evaluate(
            runs, results, recipe, client=client, progress=not args.quiet, allow_random_weights=True
        )
    print_records(res.records, res.skipped)
    for d, c in zip(datasets, cubes):
        print(
            f"{d}: predicting every pixel as the most frequent class scores mIoU"
            f" {chance_miou(c):.2f} (chance level)"
        )
    rep = build_report([results], str(out / "report"))
    for name, table in rep.tables.items():
        if name.endswith("/leaderboard") or name.startswith("vqa/leaderboard_"):
            print("\n" + to_markdown(table))
    print(f"\nreport: {rep.html}")
    return 0
