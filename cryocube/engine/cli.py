"""`cryocube evaluate` and `cryocube quickstart`."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError


def register(sub) -> None:
    from ..convert.cli import add_cluster_args

    p = sub.add_parser("evaluate", help="evaluate models on cubes under the benchmark protocols (cached, resumable)")
    p.add_argument("--cubes", help="comma-separated cube paths/URLs, or catalog dataset ids with --data-root")
    p.add_argument("--data-root", help="folder/URL holding <dataset>.zarr cubes")
    p.add_argument("--models", help="comma-separated model ids (see `cryocube weights list`)")
    p.add_argument("--protocol", default="frozen", help="comma-separated: frozen, fewshot, finetune, cross_sensor")
    p.add_argument("--fraction", type=float, default=None, help="share of training labels (default: the protocol's)")
    p.add_argument("--seeds", type=int, default=1, help="number of seeds (0..N-1)")
    p.add_argument("--benchmark", help="plan the grid of catalogs/benchmarks/<name>.yaml (e.g. cryobench)")
    p.add_argument("--config", help="YAML file of recipe fields (epochs, lr, batch_size, ...)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one recipe field")
    p.add_argument("--epochs", type=int, help="shorthand for --set epochs=N")
    p.add_argument("--out", required=True, help="results folder/URL (results.jsonl, runs/, features/)")
    p.add_argument("--storage-options", type=json.loads, default=None)
    p.add_argument("--quiet", action="store_true")
    add_cluster_args(p)
    p.set_defaults(func=_evaluate)

    q = sub.add_parser("quickstart", help="generate sample datasets, convert, evaluate a few models, print the leaderboard")
    q.add_argument("--out", default="quickstart-out")
    q.add_argument("--datasets", default="glid,caffe")
    q.add_argument("--models", default="unet,vit_scratch,ssl4eo_moco")
    q.add_argument("--epochs", type=int, default=5)
    q.add_argument("--quiet", action="store_true")
    add_cluster_args(q)
    q.set_defaults(func=_quickstart)


def resolve_cubes(cubes: str, data_root: str | None) -> list[str]:
    from ..catalog import dataset_ids

    out = []
    for c in [c.strip() for c in cubes.split(",") if c.strip()]:
        if c in dataset_ids() and not Path(c).exists():
            if not data_root:
                raise UserError(f"{c!r} is a dataset id: pass --data-root holding {c}.zarr, or a cube path/URL")
            out.append(f"{data_root.rstrip('/')}/{c}.zarr")
        else:
            out.append(c)
    return out


def _evaluate(args) -> int:
    from .benchmark import runs_from_benchmark
    from .cluster import open_cluster
    from .evaluate import evaluate, runs_from_grid
    from .protocols import load_config

    sets = list(args.set) + ([f"epochs={args.epochs}"] if args.epochs else [])
    cfg = load_config(args.config, sets)
    if args.benchmark:
        runs = runs_from_benchmark(args.benchmark, args.data_root, seeds=args.seeds,
                                   models=args.models.split(",") if args.models else None,
                                   protocols=args.protocol.split(",") if args.protocol != "frozen" else None)
    else:
        if not args.cubes or not args.models:
            raise UserError("evaluate needs --cubes and --models (or --benchmark)")
        runs = runs_from_grid(args.models.split(","), resolve_cubes(args.cubes, args.data_root),
                              args.protocol.split(","), [args.fraction], list(range(args.seeds)))
    with open_cluster(args.cluster, n_workers=args.workers, threads_per_worker=args.threads_per_worker,
                      memory_limit=args.memory_limit) as client:
        res = evaluate(runs, args.out, cfg, client=client, progress=not args.quiet, storage_options=args.storage_options)
    _print_records(res.records, res.skipped)
    return 1 if any(r.get("status") != "ok" for r in res.records) else 0


def _print_records(records: list[dict], skipped: list[str]) -> None:
    for r in sorted(records, key=lambda r: (r["dataset"], r["protocol"], r["model"], r["seed"])):
        if r.get("status") == "ok":
            m = r["metrics"]
            print(f"{r['dataset']:<6} {r['protocol']:<12} {r['fraction']:<4g} {r['model']:<18} seed {r['seed']}: "
                  f"mIoU {m['mIoU']:6.2f}  mF1 {m['mF1']:6.2f}  oAcc {m['oAcc']:6.2f}  ({r['timings']['total_s']:.0f} s)")
        else:
            print(f"{r['dataset']:<6} {r['protocol']:<12} {r['model']:<18} seed {r['seed']}: FAILED {r['error']}")
    if skipped:
        print(f"{len(skipped)} runs already done (cached), not recomputed")


def _quickstart(args) -> int:
    from ..convert.writer import convert
    from ..testing import make_raw
    from .cluster import open_cluster
    from .evaluate import evaluate, runs_from_grid
    from .protocols import load_config

    out = Path(args.out)
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    cfg = load_config(None, [f"epochs={args.epochs}", "decoder_channels=64", "input_size=64", "val_every=2",
                             "batch_size=8", "crops_per_sample=2"])
    with open_cluster(args.cluster, n_workers=args.workers, threads_per_worker=args.threads_per_worker,
                      memory_limit=args.memory_limit) as client:
        cubes = []
        for d in datasets:
            raw = out / "raw" / d
            if not raw.exists():
                from ..testing import RECIPES

                scenes = RECIPES[d].scenes  # whole scenes (SICD, CaFFe) hold many tiles each
                make_raw(d, raw, n={"train": 6, "val": 2, "test": 2} if scenes else {"train": 32, "val": 8, "test": 8}, seed=1)
            cube = str(out / "cubes" / f"{d}.zarr")
            convert(d, str(raw), cube, client=client, tile_size=64, progress=not args.quiet)
            cubes.append(cube)
        runs = runs_from_grid(args.models.split(","), cubes, ["frozen"], [None], [0])
        runs += runs_from_grid([m for m in args.models.split(",") if m not in ("unet", "vit_scratch")] or args.models.split(","),
                               cubes, ["fewshot"], [None], [0])
        res = evaluate(runs, str(out / "results"), cfg, client=client, progress=not args.quiet)
    _print_records(res.records, res.skipped)
    from ..report import build_report
    from ..report.tables import to_markdown

    rep = build_report([str(out / "results")], str(out / "report"))
    for name, table in rep.tables.items():
        if name.endswith("/leaderboard"):
            print("\n" + to_markdown(table))
    print(f"\nreport: {rep.html}")
    return 0
