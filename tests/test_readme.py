"""The README's embedding commands run as written: the lines are read out of README.md (so a README edit that
no longer runs fails here), on small generated data in the published layouts, through the real CLI."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from cryocube.convert.writer import convert
from cryocube.synthetic import make_raw, make_samples

README = Path(__file__).resolve().parents[1] / "README.md"
ENV = dict(os.environ, PYTHONPATH=str(README.parent))
# what a machine without checkpoints or a big CPU adds to the lines (nothing else is changed)
CLUSTER = ("convert", "embed", "probe", "evaluate")
SMALL = ["epochs=1", "input_size=32", "decoder_channels=16", "batch_size=4", "crops_per_sample=1", "val_every=1",
         "normalization=cube"]


def readme_lines(heading: str) -> list[list[str]]:
    """The `cryocube ...` lines of the first code block under `heading`: comments and [optional] parts dropped."""
    text = README.read_text()
    section = text.split(heading, 1)[1]
    block = section.split("```", 2)[1]
    out = []
    for line in block.replace("\\\n", " ").splitlines():  # a line continued with \ is one command
        line = line.split("#", 1)[0]
        line = re.sub(r"\[[^\]]*\]", "", line).strip()
        if line.startswith("cryocube "):
            out.append(shlex.split(line)[1:])
    return out


def test_the_readme_embedding_commands_run_as_written(tmp_path, client):
    lines = readme_lines("### Embeddings")
    assert [a[0] for a in lines].count("probe") >= 2 and any(a[0] == "evaluate" and "probe" in a[a.index("--protocol") + 1]
                                                            for a in lines)
    # what the README assumes exists: the challenge's download, and a converted GLD cube (its `convert` line)
    make_samples("ssl4eo-downstream", tmp_path / "SSL4EO-S12-downstream", n=24, size=8, seed=4)
    make_raw("gld", tmp_path / "raw-gld", n={"train": 8, "val": 4, "test": 4}, seed=2)
    convert("gld", str(tmp_path / "raw-gld"), str(tmp_path / "cubes" / "gld.zarr"), client=client, tile_size=32,
            progress=False)
    for argv in lines:
        # a LocalCluster started here: its workers share this folder, so the README's relative paths hold for them
        extra = ["--cluster", "local", "--workers", "1", "--quiet"] if argv[0] in CLUSTER else []
        if argv[0] in ("embed", "evaluate"):
            extra += ["--allow-random-weights"]
        if argv[0] == "evaluate":
            extra += [x for s in SMALL for x in ("--set", s)]
        # its own process in that folder, as a user types it (here a default Client of the test session would
        # compute lazy reads on workers whose folder is another one)
        p = subprocess.run([sys.executable, "-m", "cryocube.cli", *argv, *extra], cwd=tmp_path, env=ENV,
                           capture_output=True, text=True, timeout=900)
        rc, out, err = p.returncode, p.stdout, p.stderr
        assert rc == 0, f"README line `cryocube {shlex.join(argv)}` failed ({rc}): {err[-2000:]}"
        if argv[0] == "probe":
            runs = list((tmp_path / argv[argv.index("--out") + 1] / "runs").glob("*/results_summary.json"))
            assert len(runs) == 1, runs  # one run's NeuCo-Bench files, in its own folder
            summary = json.loads(runs[0].read_text())
            assert "overall_q_score" in summary and "overall Q" in out
        if argv[0] == "evaluate":  # the printer shows each family's own metric
            rows = [r for r in out.splitlines() if " seed 0: " in r]
            assert any(" probe " in r and " Q " in r for r in rows), out
            assert any(" frozen " in r and " mIoU " in r for r in rows), out
            assert "FAILED" not in out, out


def test_the_readme_board_commands_run_as_written(tmp_path):
    """The board's lines (encoders through heads, a VLM's blind run) on a converted interferogram cube, then report:
    the board holds both encoders' head rows, the blind row, the chance row, and n in every filled cell."""
    from cryocube.insar_synthetic import make_interferograms

    lines = readme_lines("**The board (LEADERBOARD.md")
    assert [(a[0], a[a.index("--protocol") + 1]) for a in lines] == [("evaluate", "heads"), ("evaluate", "vqa")]
    assert "blind=true" in lines[1]
    make_interferograms(tmp_path / "ifgs", n=24, size=32, seed=3)  # what the README's `convert insar` line reads
    small = {"heads": ["input_size=32"], "vqa": ["block_samples=24", "gen_batch=8", "max_new_tokens=6"]}
    for argv in [["convert", "insar", "--raw", "ifgs/", "--out", "cubes/insar.zarr"], *lines,
                 ["report", "results", "--out", "report"]]:
        extra = ["--cluster", "local", "--workers", "1", "--quiet"] if argv[0] in CLUSTER else []
        if argv[0] == "evaluate":
            extra += ["--allow-random-weights"] + [x for s in small[argv[argv.index("--protocol") + 1]] for x in ("--set", s)]
        p = subprocess.run([sys.executable, "-m", "cryocube.cli", *argv, *extra], cwd=tmp_path, env=ENV,
                           capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, f"`cryocube {shlex.join(argv)}` failed ({p.returncode}): {p.stderr[-2000:]}"
    rows = [[c.strip() for c in x.strip().strip("|").split("|")]
            for x in (tmp_path / "report" / "LEADERBOARD.md").read_text().splitlines() if x.startswith("| ")]
    kinds = [r[1] for r in rows[1:]]
    assert kinds == ["baseline: chance", "baseline: blind", "GFM (linear head)", "GFM (linear head)"], kinds
    assert rows[2][0].endswith("(blind)")  # the README's blind line ran: no "blind: not run"
    assert all("n=" in c for r in rows[1:] for c in r[2:3])  # Coherence Acc: every row, n shown
