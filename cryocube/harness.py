"""What every `cryocube` command shares, written once: its option groups, the cluster it opens and
the `--out` it claims."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import outputs
from .cluster import open_cluster, planned_threads
from .errors import UserError
from .mapping import names
from .store import options_arg, register_options


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


# -- option groups -----------------------------------------------------------------------------
def add_out(p, help: str, required: bool = True, **kw) -> None:
    """The output every writing command claims (`claim`)."""
    p.add_argument("--out", required=required, help=help, **kw)


def add_storage(p, help: str = "JSON fsspec options for remote URLs") -> None:
    """fsspec options for the command's remote URLs (`claim` registers them for --out)."""
    p.add_argument("--storage-options", type=options_arg, default=None, help=help)


def add_quiet(p, help: str = "no progress output") -> None:
    """--quiet: no progress lines (results are still printed)."""
    p.add_argument("--quiet", action="store_true", help=help)


def add_cluster(p) -> None:
    """The cluster options of every command that runs Dask work (`cluster_for` reads them)."""
    p.add_argument(
        "--cluster",
        default="local",
        help="local | cuda | k8s | gateway | tcp://host:port | scheduler-file:PATH",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes (local/cuda) or workers to scale to",
    )
    p.add_argument("--threads-per-worker", type=int, default=None)
    p.add_argument(
        "--memory-limit",
        default=None,
        help="per worker, e.g. 4GB (local, cuda: the machine's memory shared by the workers)",
    )


def add_weights(p, random_help: str = "run pretrained models without a checkpoint") -> None:
    """Where checkpoints are, and whether a pretrained model may run without one."""
    p.add_argument(
        "--weights",
        default=None,
        metavar="DIR",
        help="folder of checkpoints (default: where `cryocube weights fetch` puts them)",
    )
    p.add_argument("--allow-random-weights", action="store_true", help=random_help)


def add_set(p, help: str = "override one recipe field") -> None:
    """--set KEY=VALUE, repeatable: one field of the command's recipe."""
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=help)


def add_recipe(p, config_help: str, set_help: str = "override one recipe field") -> None:
    """--config, --set and --epochs (`recipe_sets` reads the last two)."""
    p.add_argument("--config", help=config_help)
    add_set(p, set_help)
    p.add_argument("--epochs", type=int, help="shorthand for --set epochs=N")


def add_grid(p, required: bool, models_help: str, fraction_help: str) -> None:
    """The runs' grid: cubes (or dataset ids), models, protocols and label fractions."""
    p.add_argument(
        "--cubes",
        required=required,
        help="comma-separated cube paths/URLs, or catalog dataset ids with --data-root",
    )
    p.add_argument("--data-root", help="folder/URL holding <dataset>.zarr cubes")
    p.add_argument("--models", required=required, help=models_help)
    p.add_argument(
        "--protocol",
        default="frozen",
        help="comma-separated protocols (see `cryocube list protocols`)",
    )
    p.add_argument("--fraction", type=fractions_arg, default=None, help=fraction_help)


# -- what the options ask for ------------------------------------------------------------------
def recipe_sets(args) -> list[str]:
    """--set, with --epochs as one more `epochs=N`."""
    return list(args.set) + ([f"epochs={args.epochs}"] if args.epochs is not None else [])


def resolve_cubes(cubes: str, data_root: str | None) -> list[str]:
    """--cubes, a catalog dataset id (and no local path) read as <data-root>/<id>.zarr."""
    from .catalog import dataset_ids

    out = []
    for c in names(cubes):
        if c in dataset_ids() and not Path(c).exists():
            if not data_root:
                raise UserError(
                    f"{c!r} is a dataset id: pass --data-root holding {c}.zarr, or a cube path/URL"
                )
            out.append(f"{data_root.rstrip('/')}/{c}.zarr")
        else:
            out.append(c)
    return out


def threads_for(args, parallel: int | None = None) -> int | None:
    """The torch threads `cluster_for(args, parallel)` gives each worker, where known beforehand."""
    return planned_threads(args.cluster, args.workers, args.threads_per_worker, parallel=parallel)


def cluster_for(args, parallel: int | None = None, quiet: bool | None = None):
    """The cluster of the --cluster options (a context manager yielding a Client), sized to a plan
    of `parallel` runs."""
    return open_cluster(
        args.cluster,
        n_workers=args.workers,
        threads_per_worker=args.threads_per_worker,
        memory_limit=args.memory_limit,
        quiet=args.quiet if quiet is None else quiet,
        parallel=parallel,
    )


def claim(args, kind: str, inputs=(), url: str | None = None, **kw) -> outputs.Found:
    """The command's output (`url`, default --out) passes the output contract before anything is
    written, its --storage-options registered."""
    url = args.out if url is None else url
    register_options(url, getattr(args, "storage_options", None))
    return outputs.claim(url, kind, args.command, inputs=inputs, **kw)


def warn(text: str) -> None:
    """A warning line of the command's (not a Python warning: the user asked for it)."""
    print(f"cryocube: WARNING: {text}", file=sys.stderr)


def text_table(rows: list[tuple[str, ...]]) -> str:
    """Rows (header first) in aligned columns, the last left unpadded (`list`, `weights list`)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows
    )
