"""Every `cryocube` command, given bad input, run as a real subprocess: a nonzero exit, one sentence
on stderr that names what is wrong, no traceback and no exception class outside the UserError root.
The commands are read from the CLI's own parser, so a new command fails the coverage test until it
has a bad-input case here.

Commands that take --cluster get an address where no scheduler listens: a check that came after the
cluster would say "no Dask scheduler answers" instead of naming the bad input, and fail the word
check."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import pkgutil
import re
import shutil
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import cryocube
from cryocube import errors
from cryocube.cli import build_parser
from cryocube.convert.writer import convert
from cryocube.synthetic import make_raw, make_samples

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
# errors.py's classes that never reach the user (a failed run's record carrier)
INTERNAL = {"RunFailed"}

# command -> [(argv, a word the sentence must hold[, environment])]; {t}: a folder of bad inputs,
# {u}: no scheduler
# a lab's own catalog folder, holding a model file that is not YAML
LAB = {"CRYOCUBE_CATALOGS": "{t}/lab"}
CASES: dict[str, list[tuple]] = {
    "convert": [
        ("convert not-a-dataset --raw {t}/raw --out {t}/o.zarr --cluster {u}", "not-a-dataset"),
        ("convert gld --raw {t}/samples --out {t}/o.zarr --cluster {u}", "{t}/samples"),
    ],
    "download": [
        ("download not-a-dataset --dest {t}/dl", "not-a-dataset"),
        ("download gld --dest {t}/dl --source nosuchsource", "nosuchsource"),
    ],
    "inspect": [
        ("inspect {t}/nothere.zarr", "{t}/nothere.zarr"),
        ("inspect {t}/badmeta.zarr --verify", "{t}/badmeta.zarr/zarr.json"),
        ("inspect --bands nosuchmodel gld", "nosuchmodel"),
    ],
    "list": [("list models --profile --models nosuchmodel", "nosuchmodel")],
    "weights fetch": [("weights fetch nosuchmodel --dest {t}/w", "nosuchmodel")],
    "weights list": [("weights list", "{t}/lab/models/broken.yaml", LAB)],
    "evaluate": [
        (
            "evaluate --cubes {t}/gld.zarr --models nosuchmodel --out {t}/r --cluster {u}",
            "nosuchmodel",
        ),
        (
            (
                "evaluate --cubes {t}/gld.zarr --models unet --out {t}/r --set epochs=abc"
                " --cluster {u}"
            ),
            "'abc'",
        ),
        (
            (
                "evaluate --cubes {t}/gld.zarr --models unet --out {t}/r --config {t}/bad.yaml"
                " --cluster {u}"
            ),
            "{t}/bad.yaml: not valid YAML (line 2",
        ),
        (
            "evaluate --cubes {t}/incomplete.zarr --models unet --out {t}/r --cluster {u}",
            "incomplete",
        ),
        (
            "evaluate --cubes {t}/badmeta.zarr --models unet --out {t}/r --cluster {u}",
            "{t}/badmeta.zarr",
        ),
    ],
    "quickstart": [("quickstart --out {t}/q --models nosuchmodel --cluster {u}", "nosuchmodel")],
    "tune": [
        (
            (
                "tune --cubes {t}/gld.zarr --models unet --trials 2 --out {t}/s --space lr=bad"
                " --cluster {u}"
            ),
            "'bad'",
        )
    ],
    "embed": [
        ("embed nosuchmodel --cube {t}/gld.zarr --out {t}/e.zarr --cluster {u}", "nosuchmodel"),
        ("embed mean --cube {t}/badmeta.zarr --out {t}/e.zarr --cluster {u}", "{t}/badmeta.zarr"),
    ],
    "probe": [
        (
            "probe {t}/nothere.zarr --labels {t}/samples/labels --out {t}/p --cluster {u}",
            "{t}/nothere.zarr",
        ),
        ("probe {t}/nothere.zarr --labels {t}/badlabels --out {t}/p --cluster {u}", "cloudy__cls"),
    ],
    "report": [
        ("report {t}/nothere --out {t}/rep", "{t}/nothere"),
        ("report {t}/badresults --out {t}/rep", "results.jsonl:1"),
        # a missing profiles folder is refused, not replaced by catalog figures (issue 38)
        ("report {t}/badresults --out {t}/rep --profiles {t}/no/such/folder", "{t}/no/such/folder"),
    ],
}


def commands() -> set[str]:
    """Every leaf command of the CLI ("evaluate", "weights fetch", ...), from its parser."""

    def walk(parser: argparse.ArgumentParser, prefix: str) -> set[str]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return {prefix}
        return {
            c for name, p in subs[0].choices.items() for c in walk(p, f"{prefix} {name}".strip())
        }

    return walk(build_parser(), "")


def user_error_names() -> set[str]:
    return {
        n for n, c in vars(errors).items() if inspect.isclass(c) and issubclass(c, errors.UserError)
    }


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def bad(tmp_path_factory, client):
    """A good small cube and its damaged copies: no completion marker, a truncated zarr.json, a
    deleted chunk."""
    t = tmp_path_factory.mktemp("bad")
    make_raw("gld", t / "raw", n={"train": 2, "val": 1, "test": 1}, seed=1)
    convert("gld", str(t / "raw"), str(t / "gld.zarr"), client=client, tile_size=32, progress=False)
    for name in ("incomplete", "badmeta", "damaged"):
        shutil.copytree(t / "gld.zarr", t / f"{name}.zarr")
    meta = json.loads((t / "incomplete.zarr" / "zarr.json").read_text())
    del meta["attributes"]["cryocube_complete"]
    (t / "incomplete.zarr" / "zarr.json").write_text(json.dumps(meta))
    text = (t / "badmeta.zarr" / "zarr.json").read_text()
    (t / "badmeta.zarr" / "zarr.json").write_text(text[: len(text) // 2])
    chunk = sorted(
        p
        for p in (t / "damaged.zarr" / "image").rglob("*")
        if p.is_file() and p.name != "zarr.json"
    )[0]
    chunk.unlink()
    make_samples("ssl4eo-downstream", t / "samples", n=24, size=8, seed=5)
    (t / "badlabels").mkdir()
    (t / "badlabels" / "cloudy__cls.csv").write_text("id,label\nx,1\n")
    (t / "lab" / "models").mkdir(parents=True)
    (t / "lab" / "models" / "broken.yaml").write_text("id: [broken\n  x: :\n")
    (t / "bad.yaml").write_text("epochs: [1\nlr: :\n")
    (t / "badresults").mkdir()
    (t / "badresults" / "results.jsonl").write_text('{"run_id": "unterminated\n')
    return t


def test_every_command_has_bad_input_cases():
    missing = commands() - set(CASES)
    assert not missing, f"add bad-input cases to CASES for: {sorted(missing)}"
    assert not set(CASES) - commands(), (
        f"CASES names commands the CLI does not have: {sorted(set(CASES) - commands())}"
    )


def _run(argv: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cryocube.cli", *argv],
        capture_output=True,
        text=True,
        env={**ENV, **(env or {})},
        timeout=600,
        cwd=ROOT,
    )


def _sentence_lines(err: str) -> list[str]:
    """stderr without argparse's usage block (printed above its own one-line error)."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if lines and lines[0].startswith("usage:"):
        lines = [ln for ln in lines[1:] if not ln.startswith(" ")]
    return lines


def test_bad_input_to_every_command_is_one_sentence_without_traceback(bad):
    """All cases at once (a few processes side by side): each one's failure is listed, not just the
    first."""
    u = f"tcp://127.0.0.1:{_unused_port()}"
    cases = [
        (
            cmd,
            argv.format(t=bad, u=u).split(),
            word.format(t=bad),
            {k: v.format(t=bad) for k, v in env[0].items()} if env else None,
        )
        for cmd, cs in CASES.items()
        for argv, word, *env in cs
    ]
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda c: _run(c[1], c[3]), cases))
    allowed = user_error_names()
    problems = []
    for (cmd, argv, word, _), p in zip(cases, done):
        lines = _sentence_lines(p.stderr)
        classes = (
            set(
                re.findall(r"\b([A-Z]\w*(?:Error|Exception|Exit|Interrupt))\b", p.stderr + p.stdout)
            )
            - allowed
        )
        why = []
        if p.returncode != 2:
            why.append(f"exit {p.returncode}, not 2")
        if "Traceback" in p.stderr + p.stdout:
            why.append("a traceback")
        if classes:
            why.append(f"exception classes outside the UserError root: {sorted(classes)}")
        if len(lines) != 1:
            why.append(f"{len(lines)} lines on stderr, not one sentence")
        elif not lines[0].startswith(f"cryocube {cmd.split()[0]}") or ": error: " not in lines[0]:
            why.append("not a `cryocube COMMAND: error:` sentence")
        elif word not in lines[0]:
            why.append(f"the sentence does not name {word!r}")
        if why:
            problems.append(f"cryocube {' '.join(argv)}: {'; '.join(why)}\n{p.stderr[-2000:]}")
    assert not problems, "\n\n".join(problems)


def test_a_damaged_cube_is_reported_by_verify_without_traceback(bad):
    """A chunk deleted from a cube: `inspect --verify` fails with the damaged sample named, not a
    read error."""
    p = _run(["inspect", str(bad / "damaged.zarr"), "--verify", "--quiet"])
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr and not p.stderr.strip(), p.stderr
    assert re.search(r"DAMAGED sample \d+ \(glnet_\d+\.tif\): image digest mismatch", p.stdout), (
        p.stdout
    )
    assert "1 damaged" in p.stdout, p.stdout


def test_every_error_class_lives_in_errors_under_the_user_error_root():
    """One module holds them all (the old import paths re-export them); only the internal carriers
    are outside the UserError root, and each class says in one line when it is raised."""
    outside, found = [], {}
    for m in pkgutil.walk_packages(cryocube.__path__, "cryocube."):
        mod = importlib.import_module(m.name)
        for name, c in vars(mod).items():
            if (
                inspect.isclass(c)
                and issubclass(c, BaseException)
                and c.__module__.startswith("cryocube")
            ):
                found[name] = c
                if c.__module__ != "cryocube.errors":
                    outside.append(f"{m.name}.{name}")
    assert not outside, f"error classes defined outside cryocube/errors.py: {outside}"
    mine = {
        n: c
        for n, c in vars(errors).items()
        if inspect.isclass(c) and issubclass(c, BaseException) and c.__module__ == "cryocube.errors"
    }
    assert set(mine) - INTERNAL == user_error_names(), sorted(
        set(mine) - INTERNAL - user_error_names()
    )
    assert {"DamagedCubeError", "WindowError", "NonFiniteLoss", "ConvertError"} <= set(found)
    for name, c in mine.items():
        doc = (c.__doc__ or "").strip()
        assert doc and "\n" not in doc, f"{name}: one docstring line saying when it is raised"
