"""The `cryocube` command. Each concept module registers its own sub-commands.

A module listed in COMMAND_MODULES exposes `register(subparsers)`, which adds its parsers and sets
`func` (called with the parsed args; returns an exit code or None). User errors print one line and
exit 2; warnings print one line each; a closed pipe (`| head`) ends the command quietly.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings

COMMAND_MODULES = [
    "cryocube.convert.cli",  # convert, download
    "cryocube.inspect",  # inspect, list
    "cryocube.models.cli",  # weights
    "cryocube.engine.cli",  # evaluate, quickstart
    "cryocube.engine.tune_cli",  # tune
    "cryocube.families.embedding.cli",  # embed, probe
    "cryocube.pages.cli",  # report
]


def build_parser() -> argparse.ArgumentParser:
    """Every command module's sub-commands on one parser; the tests walk it to check the README and
    the error paths."""
    from . import __version__

    parser = argparse.ArgumentParser(prog="cryocube", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"cryocube {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> str:
    return f"cryocube: warning: {message}\n"


def _quiet_on_interrupt():
    """Ctrl-C reaches the workers too (one process group): before the scheduler logs their loss,
    silence the cluster's logs, then interrupt as Python does; main says it in one line."""
    import signal
    import threading

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


def main(argv: list[str] | None = None) -> int:
    """The `cryocube` entry point. Exit code: the command's; 2 for a user's error (one line, no
    traceback), 1 for a timeout, 130 on Ctrl-C, 141 on a closed pipe."""
    from .errors import UserError
    from .families.base import EngineRuns

    args = build_parser().parse_args(argv)
    shown, warnings.formatwarning = warnings.formatwarning, _one_line_warning
    restore = _quiet_on_interrupt()
    try:
        rc = args.func(args)
        if isinstance(rc, EngineRuns):  # a family's command planned runs: the engine runs them
            from .engine.cli import run_handed

            rc = run_handed(rc, args)
        sys.stdout.flush()
    except UserError as e:
        print(f"cryocube {args.command}: error: {e}", file=sys.stderr)
        return 2
    except TimeoutError as e:  # a wait that ended: say what it waited for and what to change
        from .cluster.timeouts import explain_timeout

        print(f"cryocube {args.command}: failed: {explain_timeout(e)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader went away (`cryocube inspect X | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    # a full disk is the user's to fix: one sentence naming what was being written
    except OSError as e:
        from .outputs import disk_full_message

        msg = disk_full_message(e, getattr(args, "out", None))
        if msg is None:
            raise
        print(f"cryocube {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"cryocube {args.command}: interrupted; rerunning the same command resumes",
            file=sys.stderr,
        )
        return 130
    # a connection failure is the user's network or endpoint, not a bug: one sentence
    except Exception as e:
        from .errors import network_message

        msg = network_message(e)
        if msg is None:
            raise
        print(f"cryocube {args.command}: error: {msg}", file=sys.stderr)
        return 2
    finally:
        warnings.formatwarning = shown
        restore()
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
