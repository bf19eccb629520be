"""The commands of the README and the docs pages run as written: the lines are read out of the page
where they live (so an edit that no longer runs fails here), on small generated data in the
published layouts, through the real CLI. Every command line of every page parses with the real
parser; the embedding page's lines run end to end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from cryocube.convert.writer import convert
from cryocube.synthetic import make_raw, make_samples

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
# what a machine without checkpoints or a big CPU adds to the lines (nothing else is changed)
CLUSTER = ("convert", "embed", "probe", "evaluate")
SMALL = [
    "epochs=1",
    "input_size=32",
    "decoder_channels=16",
    "batch_size=4",
    "crops_per_sample=1",
    "val_every=1",
    "normalization=cube",
]


def command_lines(block: str) -> list[list[str]]:
    """The `cryocube ...` lines of one code block: comments and [optional] parts dropped, `\\`
    continuations joined."""
    out, cont = [], ""
    for line in block.splitlines():
        line = cont + re.sub(r"\[[^\]]*\]", "", line.split("#", 1)[0]).strip()
        if line.endswith("\\"):  # the command goes on on the next line
            cont = line[:-1]
            continue
        cont = ""
        if line.startswith("cryocube "):
            out.append(shlex.split(line)[1:])
    return out


def page_lines(page: str, heading: str) -> list[list[str]]:
    """The `cryocube ...` lines of the first code block under the line that starts with `heading` in
    `page` (a path from the repository root, e.g. "docs/embeddings.md")."""
    text = (ROOT / page).read_text()
    found = re.search(rf"^{re.escape(heading)}", text, flags=re.M)
    assert found, f"{page} has no heading {heading!r}"
    return command_lines(text[found.end() :].split("```", 2)[1])


def alternatives(argv: list[str]) -> list[list[str]]:
    """`list tasks|adapters` means one of them: one argv per alternative (a value with `=` keeps its
    `|`)."""
    out = [[]]
    for a in argv:
        opts = a.split("|") if "|" in a and "=" not in a else [a]
        out = [o + [x] for o in out for x in opts]
    return out


def test_every_command_line_of_the_readme_and_the_docs_parses():
    from cryocube.cli import build_parser

    parser = build_parser()
    seen = 0
    for page in PAGES:
        blocks = (ROOT / page).read_text().split("```")[1::2]
        for argv in (
            alt for b in blocks for line in command_lines(b) for alt in alternatives(line)
        ):
            try:
                args = parser.parse_args(argv)
            except SystemExit:
                raise AssertionError(
                    f"{page}: `cryocube {shlex.join(argv)}` does not parse"
                ) from None
            assert callable(args.func), argv
            seen += 1
    assert seen >= 40, seen  # the README's examples and the pages' blocks were read, not skipped


def test_the_readme_has_one_example_per_command_and_its_names_exist(capsys):
    from cryocube.cli import build_parser, main

    lines = page_lines("README.md", "## One example per command")
    commands = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices
    assert sorted({a[0] for a in lines}) == sorted(commands), (
        "a command without its README example, or the reverse"
    )
    # run the README's `list` line: every model its examples name is one the catalog has
    listing = next(a for a in lines if a[0] == "list")
    assert main(listing) == 0
    listed = {ln.split()[0] for ln in capsys.readouterr().out.splitlines()[1:] if ln.strip()}
    named = {
        a[2] if a[0] == "weights" else a[1]
        for a in lines
        if a[0] == "embed" or a[:2] == ["weights", "fetch"]
    }
    named |= {
        m
        for a in lines
        if "--models" in a
        for m in a[a.index("--models") + 1].split(",")
        if ":" not in m
    }
    assert named and named <= listed, named - listed


def test_the_embedding_page_commands_run_as_written(tmp_path, client):
    lines = page_lines("docs/embeddings.md", "# Embeddings")
    assert [a[0] for a in lines].count("probe") >= 2 and any(
        a[0] == "evaluate" and "probe" in a[a.index("--protocol") + 1] for a in lines
    )
    # what the page assumes exists: the challenge's download, and a converted GLD cube (its
    # `convert` line)
    make_samples("ssl4eo-downstream", tmp_path / "SSL4EO-S12-downstream", n=24, size=8, seed=4)
    make_raw("gld", tmp_path / "raw-gld", n={"train": 8, "val": 4, "test": 4}, seed=2)
    convert(
        "gld",
        str(tmp_path / "raw-gld"),
        str(tmp_path / "cubes" / "gld.zarr"),
        client=client,
        tile_size=32,
        progress=False,
    )
    for argv in lines:
        # a LocalCluster started here: its workers share this folder, so the page's relative paths
        # hold for them
        extra = ["--cluster", "local", "--workers", "1", "--quiet"] if argv[0] in CLUSTER else []
        if argv[0] in ("embed", "evaluate"):
            extra += ["--allow-random-weights"]
        if argv[0] == "evaluate":
            extra += [x for s in SMALL for x in ("--set", s)]
        # its own process in that folder, as a user types it (here a default Client of the test
        # session would
        # compute lazy reads on workers whose folder is another one)
        p = subprocess.run(
            [sys.executable, "-m", "cryocube.cli", *argv, *extra],
            cwd=tmp_path,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=900,
        )
        rc, out, err = p.returncode, p.stdout, p.stderr
        assert rc == 0, (
            f"docs/embeddings.md line `cryocube {shlex.join(argv)}` failed ({rc}): {err[-2000:]}"
        )
        if argv[0] == "probe":
            runs = list(
                (tmp_path / argv[argv.index("--out") + 1] / "runs").glob("*/results_summary.json")
            )
            assert len(runs) == 1, runs  # one run's NeuCo-Bench files, in its own folder
            summary = json.loads(runs[0].read_text())
            assert "overall_q_score" in summary and "overall Q" in out
        if argv[0] == "evaluate":  # the printer shows each family's own metric
            rows = [r for r in out.splitlines() if " seed 0: " in r]
            assert any(" probe " in r and " Q " in r for r in rows), out
            assert any(" frozen " in r and " mIoU " in r for r in rows), out
            assert "FAILED" not in out, out


def test_the_vlm_page_board_commands_run_as_written(tmp_path):
    """The board's lines (encoders through heads, a VLM's blind run) on a converted interferogram
    cube, then report: the board holds both encoders' head rows, the blind row, the chance row, and
    n in every filled cell.
    """
    from cryocube.insar_synthetic import make_interferograms

    lines = page_lines("docs/vlm.md", "**The board (LEADERBOARD.md")
    assert [(a[0], a[a.index("--protocol") + 1]) for a in lines] == [
        ("evaluate", "heads"),
        ("evaluate", "vqa"),
    ]
    assert "blind=true" in lines[1]
    # what the README's `convert insar` line reads
    make_interferograms(tmp_path / "ifgs", n=24, size=32, seed=3)
    small = {
        "heads": ["input_size=32"],
        "vqa": ["block_samples=24", "gen_batch=8", "max_new_tokens=6"],
    }
    for argv in [
        ["convert", "insar", "--raw", "ifgs/", "--out", "cubes/insar.zarr"],
        *lines,
        ["report", "results", "--out", "report"],
    ]:
        extra = ["--cluster", "local", "--workers", "1", "--quiet"] if argv[0] in CLUSTER else []
        if argv[0] == "evaluate":
            extra += ["--allow-random-weights"] + [
                x for s in small[argv[argv.index("--protocol") + 1]] for x in ("--set", s)
            ]
        p = subprocess.run(
            [sys.executable, "-m", "cryocube.cli", *argv, *extra],
            cwd=tmp_path,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert p.returncode == 0, (
            f"`cryocube {shlex.join(argv)}` failed ({p.returncode}): {p.stderr[-2000:]}"
        )
    rows = [
        [c.strip() for c in x.strip().strip("|").split("|")]
        for x in (tmp_path / "report" / "LEADERBOARD.md").read_text().splitlines()
        if x.startswith("| ")
    ]
    kinds = [r[1] for r in rows[1:]]
    assert kinds == [
        "baseline: chance",
        "baseline: blind",
        "GFM (linear head)",
        "GFM (linear head)",
    ], kinds
    assert rows[2][0].endswith("(blind)")  # the page's blind line ran: no "blind: not run"
    assert all("n=" in c for r in rows[1:] for c in r[2:3])  # Coherence Acc: every row, n shown
