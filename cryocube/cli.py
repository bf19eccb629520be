"""The `cryocube` command. Each concept module registers its own sub-commands.

A module listed in COMMAND_MODULES exposes `register(subparsers)`, which adds its parsers and sets
`func` (called with the parsed args; returns an exit code or None).
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES = [
    "cryocube.convert.cli",  # convert, download
    "cryocube.cube",  # inspect
    "cryocube.models.cli",  # weights, (inspect --bands is handled by cryocube.cube)
    "cryocube.engine.cli",  # evaluate, quickstart
    "cryocube.report.cli",  # report
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cryocube", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"cryocube {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # module not written yet; any other missing import is a real error
                continue
            raise
        mod.register(sub)
    return parser


def _version() -> str:
    from . import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .errors import UserError

    try:
        rc = args.func(args)
    except UserError as e:
        print(f"cryocube {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"cryocube {args.command}: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
