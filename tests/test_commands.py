"""Every `cryocube` command through the harness (`cli.main`, in this process): `--help` prints its
usage and exits 0; an option it does not have, given with everything it requires, ends in one
`cryocube COMMAND: error:` sentence naming that option, exit 2, no traceback. The commands are read
from the parser, so a new command is covered without an edit here. Also: the option groups the
harness declares once mean the same in every command that has them."""

from __future__ import annotations

import argparse

import pytest

from cryocube import harness
from cryocube.cli import build_parser, commands, main

COMMANDS = commands(build_parser())


def _required(p: argparse.ArgumentParser) -> list[str]:
    """argv that gives `p` every argument it requires (a placeholder, or the first choice)."""
    argv: list[str] = []
    groups = [g for g in p._mutually_exclusive_groups if g.required]
    chosen = {id(g._group_actions[0]) for g in groups}
    for a in p._actions:
        value = str(next(iter(a.choices))) if a.choices else "1" if a.type is int else "x"
        if not a.option_strings and a.nargs not in ("?", "*"):
            argv.append(value)
        elif a.option_strings and (a.required or id(a) in chosen):
            argv += [a.option_strings[0]] + ([] if a.nargs == 0 else [value])
    return argv


def test_the_commands_are_all_found():
    assert {" ".join(c) for c in COMMANDS} >= {
        "convert",
        "download",
        "inspect",
        "list",
        "weights fetch",
        "evaluate",
        "quickstart",
        "tune",
        "embed",
        "probe",
        "report",
    }


@pytest.mark.parametrize("words", sorted(COMMANDS), ids=" ".join)
def test_help_exits_zero_with_the_commands_usage(words, capsys):
    with pytest.raises(SystemExit) as e:
        main([*words, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: cryocube {' '.join(words)}")


@pytest.mark.parametrize("words", sorted(COMMANDS), ids=" ".join)
def test_an_unknown_option_is_one_sentence(words, capsys):
    argv = [*words, *_required(COMMANDS[words]), "--no-such-option"]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("usage:", " "))]
    assert lines == [
        f"cryocube {' '.join(words)}: error: unrecognized arguments: --no-such-option"
    ], argv


@pytest.mark.parametrize(
    "flag, declare",
    [
        ("--cluster", harness.add_cluster),
        ("--out", lambda p: harness.add_out(p, "h")),
        ("--storage-options", harness.add_storage),
        ("--quiet", harness.add_quiet),
        ("--set", harness.add_set),
        ("--weights", harness.add_weights),
    ],
)
def test_a_shared_option_means_the_same_in_every_command(flag, declare):
    """Each shared option is declared by the harness: its type, default and action are the ones the
    harness gives, wherever a command has it (a command that declared its own copy would drift)."""
    ref = argparse.ArgumentParser()
    declare(ref)
    want = next(a for a in ref._actions if flag in a.option_strings)
    having = [w for w, p in COMMANDS.items() if any(flag in a.option_strings for a in p._actions)]
    assert having, flag
    for words in having:
        got = next(a for a in COMMANDS[words]._actions if flag in a.option_strings)
        # quickstart's --out has a default folder: every other property is the harness's
        keep = {"default"} if words == ("quickstart",) and flag == "--out" else set()
        props = ("type", "default", "nargs", "const", "choices")
        assert type(got) is type(want), (words, flag)
        assert {k: getattr(got, k) for k in props if k not in keep} == {
            k: getattr(want, k) for k in props if k not in keep
        }, (words, flag)


def test_the_cluster_is_opened_from_the_parsed_options():
    """`cluster_for` reads --cluster, --workers, ... of any command: a bad value is one sentence
    naming it, raised when the command opens its cluster."""
    from cryocube.errors import ClusterError

    args = build_parser().parse_args(["convert", "glid", "--raw", "r", "--out", "o"])
    args.cluster = "nosuch"
    with pytest.raises(ClusterError, match="unknown cluster 'nosuch'"):
        with harness.cluster_for(args):
            pass
    args.cluster, args.memory_limit = "local", "lots"
    with pytest.raises(ClusterError, match="--memory-limit 'lots' is not a size"):
        with harness.cluster_for(args):
            pass


def test_building_the_commands_imports_no_torch():
    """Every `cryocube` start builds the parser of every command: torch (seconds to import) waits
    until a command computes. A command module inside a family package would import the family."""
    import subprocess
    import sys

    code = "import sys, cryocube.cli as c; c.build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
