"""The read-only commands: `cryocube list` and `cryocube inspect`."""

from __future__ import annotations

from . import catalog
from .errors import UserError
from .harness import add_quiet, add_storage, text_table
from .mapping import names


def register(sub) -> None:
    """Adds `cryocube inspect` and `cryocube list` to the parser (cli.COMMAND_MODULES calls it)."""
    p = sub.add_parser(
        "inspect",
        help="summarise a cube (--verify: check every chunk), or print a band-matching table",
    )
    p.add_argument("url", nargs="?", help="cube path or URL")
    p.add_argument(
        "--bands",
        nargs=2,
        metavar=("MODEL", "DATASET"),
        help="band-matching table of MODEL on DATASET (catalog id or cube URL)",
    )
    p.add_argument(
        "--cross-sensor",
        action="store_true",
        help="with --bands: the cross-sensor rule (SAR/grey into RGB)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="read every sample and check it against the digests written at conversion",
    )
    add_storage(p)
    add_quiet(p, None)
    p.set_defaults(func=_inspect)

    ls = sub.add_parser("list", help="what exists: " + ", ".join(LISTS))
    ls.add_argument("what", choices=LISTS)
    g = ls.add_argument_group(
        "models --profile",
        "measure parameters, GFLOPs, samples/s and peak memory here (cached per device)",
    )
    g.add_argument(
        "--profile",
        action="store_true",
        help="with `models`: the measured compute profile of every (or each --models) config",
    )
    g.add_argument("--models", default=None, help="comma-separated model ids (default: all)")
    g.add_argument(
        "--input-size",
        type=int,
        default=None,
        help="input side in pixels (default: the catalog's, or the published figures' setup)",
    )
    g.add_argument("--batch", type=int, default=1, help="samples per timed forward (default 1)")
    g.add_argument(
        "--precision",
        default="auto",
        help="auto (bf16 where the device has fast bf16, else fp32) | bf16 | fp16 | fp32",
    )
    g.add_argument(
        "--device", default=None, help="cpu or cuda[:N] (default: cuda when visible, else cpu)"
    )
    g.add_argument(
        "--iters",
        type=int,
        default=3,
        help="timed forwards per config, median taken (default 3; fewer past 20 s)",
    )
    g.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's; on a busy shared machine 1 is much faster: "
        "OpenMP barriers stall on busy cores)",
    )
    g.add_argument(
        "--refresh", action="store_true", help="measure again even where the cache has the config"
    )
    add_quiet(g, "no progress lines")
    # the measuring options and their defaults: given without --profile, they are refused
    measure = {a.dest: a.default for a in g._group_actions if a.dest not in ("profile", "quiet")}
    ls.set_defaults(func=_list, measure=measure)


def _inspect(args) -> int:
    from . import cube, store

    if args.bands:
        from .models.cli import bands_table

        model, dataset = args.bands
        print(bands_table(model, dataset, "cross_sensor" if args.cross_sensor else "named"))
        return 0
    if not args.url:
        raise UserError("inspect needs a cube URL or --bands MODEL DATASET")
    store.register_options(args.url, args.storage_options)
    if args.verify:
        rep = cube.verify(args.url, progress=not args.quiet)
        for d in rep.damaged[:50]:
            print(f"DAMAGED sample {d['sample']} ({d['source']}): {d['what']}")
        if len(rep.damaged) > 50:
            print(f"... and {len(rep.damaged) - 50} more")
        state = "ok" if rep.ok else "DAMAGED"
        print(
            f"{args.url}: {rep.n_samples} samples read, {len(rep.damaged)} damaged, checksum "
            f"{'matches' if rep.checksum_ok else 'DOES NOT match'} the marker: {state}"
            + ("" if rep.digests else " (schema without per-sample digests: checked per block)")
        )
        return 0 if rep.ok else 1
    print(cube.summary(args.url))
    return 0


def _profile(args) -> int:
    """`list models --profile`: all options and configs checked (meta-device), then measured."""
    import torch

    from .models import profile as prof
    from .progress import say

    if args.threads is not None and args.threads < 1:
        raise UserError(f"threads must be at least 1, got {args.threads}")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    models = names(args.models) if args.models else None
    setups = prof.validate(models, args.input_size, args.batch, args.precision, device, args.iters)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    def row_done(r: dict) -> None:
        say(
            f"{r['model']} {r['input']}: {r['gflops']:.2f} GFLOPs, {r['samples_per_s']:.3f}"
            " samples/s" + (" (cached)" if r["cached"] else ""),
            not args.quiet,
        )

    p = prof.profile(
        setups, iters=args.iters, refresh=args.refresh, progress=not args.quiet, on_row=row_done
    )
    print(prof.table(p))
    print(f"{len(p.rows)} configs in {p.seconds:.1f} s ({len(p.rows) - p.cached} measured)")
    return 0


def _datasets() -> list[tuple[str, ...]]:
    rows = [("id", "name", "tile", "bands", "classes", "layouts (reader)")]
    for s in map(catalog.load_dataset, catalog.dataset_ids()):
        sizes = map(str, (s.tile_size, len(s.bands), s.num_classes))
        lays = ", ".join(f"{k} ({v.reader})" for k, v in s.layouts.items())
        rows.append((s.id, s.short_name, *sizes, lays))
    return rows


def _models() -> list[tuple[str, ...]]:
    from .models import list_models, model_spec

    rows = [("id", "name", "architecture", "input", "bands", "weights")]
    for s in map(model_spec, list_models()):
        size = str(s.input_size or "tile")
        bands = "dataset" if s.takes_dataset_bands else ",".join(s.slots)
        weights = "pretrained" if s.pretrained else "from scratch"
        rows.append((s.id, s.display_name, s.architecture, size, bands, weights))
    return rows


def _protocols() -> list[tuple[str, ...]]:
    rows = [("name", "family", "fraction", "encoder", "description")]
    for p in catalog.protocols().values():
        encoder = "trained" if p.trains_encoder else "frozen"
        rows.append((p.name, p.family, f"{p.fraction:g}", encoder, p.description))
    return rows


def _readers() -> list[tuple[str, ...]]:
    from .convert import readers

    return [("reader", "layout options")] + [
        (n, r.options_doc) for n, r in sorted(readers().items())
    ]


def _families() -> list[tuple[str, ...]]:
    from . import families

    return [("family", "primary metric")] + [
        (n, families.get(n).primary_metric) for n in families.names()
    ]


def _tasks() -> list[tuple[str, ...]]:
    from .questions.tasks import all_tasks

    rows = [("task", "cubes", "answer", "metrics", "source")]
    for t in all_tasks().values():
        answer = t.answer + (f" ({'/'.join(t.labels)})" if t.labels else "")
        metrics = ", ".join(m for m, _, _ in t.metrics)
        rows.append((t.name, t.cube_kind, answer, metrics, t.source))
    return rows


def _adapters() -> list[tuple[str, ...]]:
    from . import adapters

    rows = [("adapter", "random models (--allow-random-weights)", "what it loads")]
    for n in adapters.names():
        a = adapters.get(n)
        doc = (a.__doc__ or "").strip().splitlines()[0]
        rows.append((n, ", ".join(a.random_models()) or "-", doc))
    return rows


def _benchmarks() -> list[tuple[str, ...]]:
    return [("benchmark", "datasets")] + [
        (b, ", ".join(catalog.load_benchmark(b).datasets)) for b in catalog.ids("benchmarks")
    ]


# `cryocube list WHAT`: the rows of each table, header first
LISTS = {
    "datasets": _datasets,
    "models": _models,
    "protocols": _protocols,
    "readers": _readers,
    "families": _families,
    "benchmarks": _benchmarks,
    "tasks": _tasks,
    "adapters": _adapters,
}


def _list(args) -> int:
    if getattr(args, "profile", False):
        if args.what != "models":
            raise UserError(f"--profile measures models; `list {args.what}` takes no --profile")
        return _profile(args)
    given = [f"--{k.replace('_', '-')}" for k, v in args.measure.items() if getattr(args, k) != v]
    if given:
        raise UserError(f"{', '.join(given)} only apply to `cryocube list models --profile`")
    print(text_table(LISTS[args.what]()))
    return 0
