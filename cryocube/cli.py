"""The `cryocube` command. Each concept module registers its own sub-commands.

A module of COMMAND_MODULES has `register(subparsers)`, which sets each parser's `func` (the parsed
args -> an exit code or None)."""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import signal
import sys
import threading
import warnings

from . import __version__
from .errors import UserError, network_message

COMMAND_MODULES = [
    "cryocube.convert.cli",  # convert, download
    "cryocube.listing",  # list, inspect
    "cryocube.models.cli",  # weights
    "cryocube.engine.cli",  # evaluate
    "cryocube.engine.quickstart",  # quickstart
    "cryocube.engine.tune_cli",  # tune
    "cryocube.embeddings.cli",  # embed, probe (no family imported at start-up)
    "cryocube.pages.cli",  # report
]


def build_parser() -> argparse.ArgumentParser:
    """Every command module's sub-commands on one parser."""
    parser = argparse.ArgumentParser(prog="cryocube", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"cryocube {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for p in commands(parser).values():  # an unknown option is refused by its command (`main`)
        p.set_defaults(command_parser=p)
    return parser


def commands(
    parser: argparse.ArgumentParser, words=()
) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """(command words) -> its parser, nested commands (`weights fetch`) included."""
    out = {}
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, p in a.choices.items():
                out.update(commands(p, (*words, name)) or {(*words, name): p})
    return out


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> str:
    return f"cryocube: warning: {message}\n"


def _quiet_on_interrupt():
    """Ctrl-C reaches the workers too (one process group): before the scheduler logs their loss,
    silence the cluster's logs, then interrupt as Python does; main says it in one line."""

    def handler(signum, frame):
        if "distributed" in sys.modules:
            from .cluster.worker_logs import quiet_shutdown

            quiet_shutdown()
        raise KeyboardInterrupt

    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ):
        signal.signal(signal.SIGINT, handler)
        return lambda: signal.signal(signal.SIGINT, signal.default_int_handler)
    return lambda: None


def _sentence(e: Exception, args) -> tuple[str, int] | None:
    """(one sentence, exit code) for an error that is the user's to fix; None for a bug."""
    if isinstance(e, UserError):
        return f"error: {e}", 2
    if isinstance(e, TimeoutError):  # say what it waited for and what to change
        from .cluster.timeouts import explain_timeout

        return f"failed: {explain_timeout(e)}", 1
    from .outputs import disk_full_message

    msg = disk_full_message(e, getattr(args, "out", None)) or network_message(e)
    return (f"error: {msg}", 2) if msg else None


def main(argv: list[str] | None = None) -> int:
    """The `cryocube` entry point. Exit code: the command's; 2 for a user's error (one line, no
    traceback), 1 for a timeout, 130 on Ctrl-C, 141 on a closed pipe."""
    from .families.base import EngineRuns

    args, unknown = build_parser().parse_known_args(argv)
    if unknown:
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    shown, warnings.formatwarning = warnings.formatwarning, _one_line_warning
    restore = _quiet_on_interrupt()
    try:
        rc = args.func(args)
        if isinstance(rc, EngineRuns):  # a family's command planned runs: the engine runs them
            from .engine.cli import run_handed

            rc = run_handed(rc, args)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (`cryocube inspect X | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print(
            f"cryocube {args.command}: interrupted; rerunning the same command resumes",
            file=sys.stderr,
        )
        return 130
    except Exception as e:
        said = _sentence(e, args)
        if said is None:
            raise
        print(f"cryocube {args.command}: {said[0]}", file=sys.stderr)
        return said[1]
    finally:
        warnings.formatwarning = shown
        restore()
    return int(rc or 0)


def run() -> None:
    """The `cryocube` program: `main`, then an exit that does not collect the module graphs of
    torch, timm and Dask object by object (1.2 -> 0.2 s of every command); atexit still runs."""
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    run()
