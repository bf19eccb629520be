"""`cryocube report`: leaderboards, robustness, plots and a self-contained HTML report."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import outputs, store
from ..errors import ReportError
from ..harness import add_out, add_storage
from ..report.tables import ALL_FORMATS, to_markdown


def _samples(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--samples takes comma-separated sample indices, got {text!r}"
        ) from None


def _pair(text: str) -> tuple[str, str]:
    parts = [s.strip() for s in text.split(",")]
    if len(parts) != 2 or not all(parts) or parts[0] == parts[1]:
        raise argparse.ArgumentTypeError(f"--compare takes two different models A,B, got {text!r}")
    return parts[0], parts[1]


def register(subparsers) -> None:
    """Adds `cryocube report` to the command line (cli.COMMAND_MODULES calls it)."""
    p = subparsers.add_parser(
        "report",
        help="leaderboards, robustness over seeds, plots and an HTML report from results.jsonl",
        description=__doc__,
    )
    p.add_argument(
        "results",
        nargs="*",
        metavar="RESULTS",
        help="results.jsonl files or directories holding them (searched recursively)",
    )
    add_out(p, "directory for the report files", metavar="DIR")
    p.add_argument(
        "--published",
        action="store_true",
        help="also render the Cryo-Bench published table through the same code, with averages and "
        "ranks recomputed from its per-dataset numbers and mismatches reported",
    )
    p.add_argument(
        "--published-table",
        metavar="CSV",
        help="render and check this leaderboard CSV instead (columns: model, one per dataset, "
        "optional avg_miou_published/avg_rank_published); implies --published",
    )
    p.add_argument(
        "--cube",
        action="append",
        default=[],
        metavar="URL",
        help="cube URL for qualitative panels (repeatable); predictions of a matching run are used"
        " when stored",
    )
    p.add_argument(
        "--samples",
        type=_samples,
        metavar="I,J,...",
        help="cube sample indices for the qualitative panels (default: the first 4 test samples)",
    )
    p.add_argument(
        "--protocol",
        action="append",
        metavar="NAME",
        help="only these protocols (repeatable): frozen, fewshot, finetune, cross_sensor",
    )
    p.add_argument(
        "--format",
        action="append",
        metavar="FMT",
        help="output formats, comma-separated or repeated"
        f" (default: all of {','.join(ALL_FORMATS)})",
    )
    p.add_argument("--title", default="cryocube report")
    p.add_argument(
        "--compare",
        action="append",
        type=_pair,
        default=[],
        metavar="A,B",
        help="compare two models (catalog id or display name) on the test tiles both ran on: the"
        " difference of mIoU with a paired bootstrap interval (repeatable; docs/statistics.md)",
    )
    p.add_argument(
        "--draws",
        type=int,
        metavar="N",
        help="bootstrap draws per interval (default 2000); the resampling is seeded",
    )
    p.add_argument(
        "--profiles",
        metavar="DIR",
        help="measured compute profiles for the cost table (default: $CRYOCUBE_PROFILES, else "
        "~/.cache/cryocube/profiles, where `cryocube list models --profile` writes them)",
    )
    add_storage(
        p, "JSON fsspec options for remote results and cubes (or $CRYOCUBE_STORAGE_OPTIONS)"
    )
    p.set_defaults(func=run)


def run(args) -> int:
    """Builds the report, prints a line per leaderboard; exit 0 even when runs failed (listed)."""
    from .build import build_report  # matplotlib: loaded when the command runs, not for --help

    if args.profiles is not None and not Path(args.profiles).is_dir():
        # the cost table would quietly fall back to catalog figures
        raise ReportError(
            f"--profiles {args.profiles}: no such folder (`cryocube list models --profile` writes"
            " measured profiles to one); leave --profiles out to read $CRYOCUBE_PROFILES or the"
            " default cache"
        )
    for url in [*(args.results or []), *args.cube]:
        store.register_options(url, args.storage_options)
    # a report may sit inside a results folder (it holds no records to be read back); never the
    # reverse, since a report is replaced whole
    outputs.check_inputs(args.out, [("RESULTS", r) for r in args.results or []], inside_ok=True)
    rep = build_report(
        args.results or None,
        args.out,
        protocols=args.protocol,
        formats=args.format,
        cube_urls=args.cube,
        samples=args.samples,
        published=args.published_table or args.published,
        title=args.title,
        profiles=args.profiles,
        compare=args.compare,
        draws=args.draws,
    )
    for t in rep.printed:  # every cell with its interval, across datasets, paired comparisons
        print(to_markdown(t))
    for key, lb in rep.leaderboards.items():
        print(f"{key}: {len(lb.rows)} models x {len(lb.datasets)} datasets")
    if rep.results is not None and rep.results.failures:
        print(f"failed runs: {len(rep.results.failures)} (listed in {rep.out / 'failures.md'})")
    for m in rep.mismatches:
        print(f"published table mismatch: {m}")
    print(f"wrote {len(rep.files)} files to {rep.out}" + (f"; open {rep.html}" if rep.html else ""))
    return 0
