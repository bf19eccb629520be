"""The `cryocube` command end to end: inspect, evaluate on an existing scheduler (tcp://),
report."""

from __future__ import annotations

import json

from cryocube.cli import build_parser, main
from cryocube.convert.writer import convert
from cryocube.synthetic import make_raw


def test_every_command_is_registered():
    sub = build_parser()._subparsers._group_actions[0].choices
    assert {"convert", "download", "inspect", "evaluate", "quickstart", "report", "weights"} <= set(
        sub
    )


def test_inspect_evaluate_report(tmp_path, client, capsys):
    m = make_raw("gld", tmp_path / "raw", n={"train": 8, "val": 2, "test": 2}, seed=2)
    cube = str(tmp_path / "gld.zarr")
    convert(
        "gld", str(tmp_path / "raw"), cube, client=client, tile_size=m.tile_size, progress=False
    )

    assert main(["inspect", cube]) == 0
    out = capsys.readouterr().out
    assert "train=8" in out and "coherence" in out and "complete" in out

    assert main(["inspect", "--bands", "ssl4eo_moco", "gld"]) == 0
    assert "B2" in capsys.readouterr().out

    res = str(tmp_path / "results")
    rc = main(
        [
            "evaluate",
            "--cubes",
            "gld",
            "--data-root",
            str(tmp_path),
            "--models",
            "unet",
            "--out",
            res,
            "--set",
            "decoder_channels=16",
            "--epochs",
            "1",
            "--cluster",
            client.scheduler.address,
            "--quiet",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "gld" in printed and "mIoU" in printed
    rec = json.loads((tmp_path / "results" / "results.jsonl").read_text().splitlines()[0])
    assert rec["model"] == "unet" and rec["status"] == "ok" and rec["config"]["epochs"] == 1
    assert client.status == "running"  # an existing scheduler is never closed by the CLI

    assert main(["report", res, "--out", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "report.html").exists()


def test_bad_arguments_are_clear(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nothing.zarr")]) == 2
    assert "no cube here" in capsys.readouterr().err
    assert main(["evaluate", "--out", str(tmp_path), "--models", "unet", "--cubes", "glid"]) == 2
    assert "--data-root" in capsys.readouterr().err
    assert main(["convert", "not-a-dataset", "--raw", "x", "--out", "y"]) == 2
    assert "unknown dataset 'not-a-dataset'" in capsys.readouterr().err
