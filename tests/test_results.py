"""cryocube.open_results: run records as a pandas DataFrame (one row per run) and an xarray
Dataset on (model, dataset, protocol, seed) whose values are the report's, read from local folders
and from S3 alike; a folder without records, or with a damaged one, is one sentence."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from test_report import rec, write

from cryocube import open_results
from cryocube.errors import ResultsError, UserError
from cryocube.pages import build_report


def _records() -> list[dict]:
    return [
        rec("unet", "glid", 50.0, seed=0),
        rec("unet", "glid", 54.0, seed=1),
        rec("unet", "gld", 31.0, seed=0),
        rec("unet", "gld", 33.5, seed=1),
        rec("dofa", "glid", 40.0, seed=0),
        rec("dofa", "glid", 47.0, seed=1),
        rec("dofa", "gld", 20.0, seed=0),
        rec("dofa", "gld", 1.0, seed=1, status="error"),
        # a repeat of a run, later: it replaces the first record of (unet, glid, seed 0)
        rec("unet", "glid", 52.0, seed=0, created="2026-03-02T10:00:00"),
        rec("unet", "glid", 21.0, protocol="fewshot", fraction=0.1),
        rec("ssl4eo_moco", "glid", 45.0, weights={"random_init": True, "pretrained": True}),
    ]


@pytest.fixture
def results(tmp_path) -> Path:
    return write(tmp_path / "results" / "results.jsonl", _records()).parent


def test_one_row_per_run_with_identity_metrics_cost_and_status(results):
    df = open_results(results)
    # 11 lines, one repeated run: 10 runs, the failed one a row with its error and no values
    assert len(df) == 10 and df["run_id"].is_unique
    for col in ("model", "dataset", "protocol", "fraction", "seed", "family", "status", "mIoU"):
        assert col in df.columns
    assert {"total_s", "samples_per_s", "peak_memory_mb", "device", "precision"} <= set(df.columns)
    (failed,) = df[df["status"] == "error"].itertuples()
    assert failed.model == "dofa" and failed.seed == 1 and "out of memory" in failed.error
    assert math.isnan(failed.mIoU) and not failed.ranked
    latest = df[(df["model"] == "unet") & (df["dataset"] == "glid") & (df["protocol"] == "frozen")]
    assert sorted(latest["mIoU"]) == [52.0, 54.0]  # the later record of seed 0 won
    assert set(df["model_name"]) == {"U-Net", "DOFA", "S12-MoCo (random init)"}
    assert df.loc[df["model"] == "ssl4eo_moco", "random_init"].item()
    assert (df["family"] == "segmentation").all() and df["total_s"].eq(3600.0).all()
    # filtering and grouping as any DataFrame
    assert df[df["ranked"]].groupby("model_name")["mIoU"].count().to_dict() == {
        "DOFA": 3,
        "S12-MoCo (random init)": 1,
        "U-Net": 5,
    }


def test_xarray_values_are_the_reports_leaderboard(results, tmp_path):
    ds = open_results(results).cryocube.to_xarray()
    assert ds["mIoU"].dims == ("model", "dataset", "protocol", "seed")
    assert set(ds.data_vars) == {"mIoU", "mF1", "oAcc", "mAcc"}
    assert list(ds["model_id"].sel(model=["DOFA", "U-Net"]).values) == ["dofa", "unet"]
    assert float(ds["fraction"].sel(model="U-Net", dataset="glid", protocol="fewshot")) == 0.1
    # the failed run is missing, not a value
    assert math.isnan(float(ds["mIoU"].sel(model="DOFA", dataset="gld", protocol="frozen", seed=1)))

    rep = build_report(results, tmp_path / "report", formats=["json", "csv"])
    assert rep.tables  # the report read the same folder
    mean = ds["mIoU"].mean("seed")
    checked = 0
    for protocol, group in (("frozen", "frozen"), ("fewshot", "fewshot")):
        board = json.loads((tmp_path / "report" / group / "leaderboard.json").read_text())
        for row in board["rows"]:
            for dataset in ("glid", "gld"):
                want = row.get(dataset)
                got = float(mean.sel(model=row["model"], dataset=dataset, protocol=protocol))
                if want is None:
                    assert math.isnan(got), (row["model"], dataset)
                else:
                    assert got == pytest.approx(want, abs=1e-9), (row["model"], dataset)
                    checked += 1
    assert checked == 6  # U-Net x2, DOFA x2, S12-MoCo, U-Net few-shot


def test_several_fractions_of_a_protocol_add_a_fraction_dimension(tmp_path):
    recs = [rec("unet", "glid", 10.0 * f, protocol="fewshot", fraction=f) for f in (0.1, 0.5)]
    ds = open_results(write(tmp_path / "r" / "results.jsonl", recs)).cryocube.to_xarray()
    assert ds["mIoU"].dims == ("model", "dataset", "protocol", "fraction", "seed")
    assert float(ds["mIoU"].sel(fraction=0.5).squeeze()) == 5.0


def test_s3_reads_the_same_frame(results, s3_bucket):
    import s3fs

    bucket, opts = s3_bucket
    s3fs.S3FileSystem(**opts).put(str(results / "results.jsonl"), f"{bucket}/res/results.jsonl")
    remote = open_results(f"s3://{bucket}/res", storage_options=opts)
    local = open_results(results)
    cols = [c for c in local.columns if c not in ("source", "record")]
    pd.testing.assert_frame_equal(remote[cols], local[cols])
    assert remote["source"].str.startswith(f"s3://{bucket}/res/results.jsonl:").all()


def test_no_records_or_a_damaged_record_is_one_sentence(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"empty: no results.jsonl in this directory") as e:
        open_results(tmp_path / "empty")
    assert "\n" not in str(e.value)
    write(tmp_path / "blank" / "results.jsonl", [])
    with pytest.raises(ResultsError, match=r"blank: holds no run records"):
        open_results(tmp_path / "blank")
    bad = write(tmp_path / "bad" / "results.jsonl", [rec("unet", "glid", 50.0)])
    bad.write_text(bad.read_text() + '{"run_id": "x", "model": \n{}\n')
    with pytest.raises(ResultsError, match=r"results.jsonl:2: not valid JSON") as e:
        open_results(tmp_path / "bad")
    assert "\n" not in str(e.value)
    nofield = write(tmp_path / "nofield" / "results.jsonl", [{"run_id": "y", "status": "ok"}])
    with pytest.raises(ResultsError, match=r"results.jsonl:1") as e:
        open_results(nofield.parent)
    assert "\n" not in str(e.value)
    with pytest.raises(ResultsError, match="open_results returned"):
        pd.DataFrame({"a": [1]}).cryocube.to_xarray()


def test_board_cells_one_row_per_run_task_metric_and_class(tmp_path):
    def cell(task, metric, value, cls=None):
        return {
            "task": task,
            "metric": metric,
            "class": cls,
            "unit": "%",
            "split": "test",
            "samples": "s1",
            "n": 12,
            "value": value,
            "ci_low": value - 3,
            "ci_high": value + 3,
        }

    recs = [
        rec(
            m,
            "insar",
            0.0,
            family="toy",
            primary_metric="accuracy",
            metrics={
                "accuracy": v,
                "cells": [cell("fringes", "accuracy", v), cell("c", "f1", 7.0, "low")],
            },
        )
        for m, v in (("unet", 60.0), ("dofa", 40.0))
    ]
    df = open_results(write(tmp_path / "r" / "results.jsonl", recs))
    assert not df["ranked"].any() and df["accuracy"].tolist() == [40.0, 60.0]
    with pytest.raises(ResultsError, match="no run here is scored on mIoU"):
        df.cryocube.to_xarray()
    cells = df.cryocube.cells()
    assert len(cells) == 4
    overall = cells[cells["class"].isna()].set_index("model")
    assert overall.loc["unet", "value"] == 60.0 and overall.loc["dofa", "ci_high"] == 43.0
    assert (cells["n"] == 12).all() and set(cells["task"]) == {"fringes", "c"}
    # a subset of the rows gives its cells only
    assert set(df[df["model"] == "dofa"].cryocube.cells()["model"]) == {"dofa"}


def test_from_cryocube_import_convert_is_the_function():
    """`convert` shares its name with the subpackage its module lives in: importing the module
    binds the subpackage to that name, yet the notebook API gives the function, then and after."""
    import subprocess
    import sys

    code = (
        "from cryocube import convert\n"
        "from cryocube.convert.writer import convert as f\n"
        "assert convert is f, convert\n"
        "import cryocube.convert.samples, cryocube\n"
        "assert cryocube.convert is f\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
