"""Reports: ranks, averages, seeds, missing cells, de-duplication, failures, published table,
CLI."""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import tempfile
from pathlib import Path

import pytest

from cryocube.errors import UserError
from cryocube.pages import build_report
from cryocube.pages import cli as report_cli
from cryocube.pages.analysis import leaderboard_table, robustness_table
from cryocube.report import (
    PUBLISHED_CSV,
    best_two,
    check_consistency,
    competition_ranks,
    load_leaderboard_csv,
    load_results,
    published_leaderboard,
    stability_q,
)
from cryocube.report.leaderboard import leaderboard_from_runs
from cryocube.report.tables import to_csv, to_json, to_latex, to_markdown


def rec(
    model,
    dataset,
    miou,
    *,
    seed=0,
    protocol="frozen",
    fraction=1.0,
    created="2026-03-01T10:00:00",
    status="ok",
    name=None,
    iou=None,
    **extra,
):
    r = {
        "run_id": f"{model}-{dataset}-{protocol}-{fraction}-{seed}",
        "model": model,
        "dataset": dataset,
        "protocol": protocol,
        "fraction": fraction,
        "seed": seed,
        "status": status,
        "error": None,
        "metrics": {
            "mIoU": miou,
            "mF1": miou,
            "oAcc": 90.0,
            "mAcc": 80.0,
            "IoU": iou or {"Background": miou + 5, "Target": miou - 5},
        },
        "val_curve": [{"epoch": 0, "mIoU": miou - 1}],
        "best_epoch": 0,
        "timings": {"features_s": 1.0, "train_s": 2.0, "test_s": 0.5, "total_s": 3600.0},
        "samples_per_s": 10.0,
        "peak_memory_mb": 500.0,
        "device": "cpu",
        "n_workers": 1,
        "params": {"encoder": 1_000_000, "decoder": 500_000},
        "gflops": 10.0,
        "versions": {"torch": "2.14.1"},
        "cube": {"url": f"/cubes/{dataset}.zarr", "checksum": "abc"},
        "config": {},
        "subset": None,
        "created": created,
    }
    if name is not None:
        r["model_name"] = name
    if status != "ok":
        r["error"] = "Traceback ...\nRuntimeError: CUDA out of memory"
        r["metrics"] = {}
    r.update(extra)
    return r


def write(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# --- ranking primitives
# ------------------------------------------------------------------------------


def test_competition_ranks_ties_share_best_rank_and_skip():
    assert competition_ranks({"a": 90.0, "b": 90.0, "c": 80.0, "d": 70.0}) == {
        "a": 1,
        "b": 1,
        "c": 3,
        "d": 4,
    }
    assert competition_ranks({"a": 3.0, "b": 1.0, "c": 1.0}, higher_is_better=False) == {
        "a": 3,
        "b": 1,
        "c": 1,
    }
    # compared at the displayed precision: 80.004 and 80.001 print as 80.00 and tie
    assert competition_ranks({"a": 80.004, "b": 80.001, "c": 80.02}, decimals=2) == {
        "a": 2,
        "b": 2,
        "c": 1,
    }
    assert competition_ranks({"a": 80.004, "b": 80.001}) == {"a": 1, "b": 2}
    assert competition_ranks({"a": 1.0, "b": None, "c": float("nan")}) == {"a": 1}


def test_best_two_marks_ties_and_next_distinct_value():
    assert best_two({"a": 5.0, "b": 5.0, "c": 4.0, "d": 3.0}) == {"a": 1, "b": 1, "c": 2}
    assert best_two({"a": 2.0, "b": 1.0, "c": 3.0}, higher_is_better=False) == {"b": 1, "a": 2}


def test_stability_q_follows_neuco_bench():
    assert stability_q([70.0]) is None
    assert stability_q([100.0, 100.0]) == pytest.approx(100.0)
    v = [70.0, 72.0, 74.0]
    assert stability_q(v) == pytest.approx(2 * 0.72 / (0.02 + statistics.pstdev(v) / 100))


# --- hand-made leaderboard with ties and a missing cell
# ---------------------------------------------


@pytest.fixture
def handmade(tmp_path):
    recs = [
        # A and B tie on glid; C is missing on sicd
        rec("model_a", "glid", 90.0, name="A"),
        rec("model_a", "gld", 70.0, name="A"),
        rec("model_a", "sicd", 30.0, name="A"),
        rec("model_b", "glid", 90.0, name="B"),
        rec("model_b", "gld", 75.0, name="B"),
        rec("model_b", "sicd", 20.0, name="B"),
        rec("model_c", "glid", 95.0, name="C"),
        rec("model_c", "gld", 80.0, name="C"),
        rec("model_d", "glid", 50.0, name="D"),
        rec("model_d", "sicd", 25.0, name="D", status="error"),
    ]
    return load_results(write(tmp_path / "run" / "results.jsonl", recs))


def test_handmade_ranks_and_averages(handmade):
    lb = leaderboard_from_runs(
        handmade.runs, key="frozen", title="T", protocol="frozen", fraction=1.0
    )
    assert lb.datasets == ["glid", "gld", "sicd"]  # paper order
    rows = {r.name: r for r in lb.rows}
    assert {m: rows[m].cells["glid"].rank for m in "ABCD"} == {"A": 2, "B": 2, "C": 1, "D": 4}
    assert {m: rows[m].cells["gld"].rank for m in "ABC"} == {"A": 3, "B": 2, "C": 1}
    assert {m: rows[m].cells["sicd"].rank for m in "AB"} == {"A": 1, "B": 2}
    # failed run is not a score
    assert "sicd" not in rows["C"].cells and "sicd" not in rows["D"].cells
    assert rows["A"].avg == pytest.approx(190 / 3) and rows["A"].n_avg == 3
    assert rows["C"].avg == pytest.approx(87.5) and rows["C"].n_avg == 2
    assert rows["A"].avg_rank == pytest.approx(2.0) and rows["B"].avg_rank == pytest.approx(2.0)
    assert rows["C"].avg_rank == pytest.approx(1.0) and rows["D"].avg_rank == pytest.approx(4.0)

    t = leaderboard_table(lb)
    i = {r[0]: k for k, r in enumerate(t.rows)}
    avg = t.col("avg_mIoU")
    assert t.texts[i["C"]][avg] == "87.50 (2/3)"  # the average says over how many datasets
    assert t.texts[i["A"]][avg] == "63.33"
    assert t.texts[i["C"]][t.col("sicd")] == "–"  # missing cell shown as missing
    assert t.rows[i["C"]][t.col("sicd")] is None
    # glid: C best, A and B tie for second; C's incomplete average is never marked best
    assert (
        t.marks[(i["C"], "glid")] == 1
        and t.marks[(i["A"], "glid")] == 2
        and t.marks[(i["B"], "glid")] == 2
    )
    assert (i["C"], "avg_mIoU") not in t.marks and t.marks[(i["A"], "avg_mIoU")] == 1
    assert t.marks[(i["A"], "avg_rank")] == 1 and t.marks[(i["B"], "avg_rank")] == 1

    md = to_markdown(t)
    assert "| C | **95.00** | **80.00** | – | 87.50 (2/3) | 1.00 (2/3) |" in md
    assert "<u>90.00</u>" in md
    data = json.loads(to_json(t))
    assert data["rows"][i["C"]]["sicd"] is None and data["rows"][i["C"]]["n_datasets"] == 2
    rows_csv = list(csv.DictReader(to_csv(t).splitlines()))
    assert rows_csv[i["C"]]["sicd"] == "" and float(rows_csv[i["A"]]["avg_mIoU"]) == pytest.approx(
        63.3333, abs=1e-3
    )
    tex = to_latex(t)
    assert r"\textbf{95.00}" in tex and r"\underline{90.00}" in tex and "87.50 (2/3)" in tex


def test_dedupe_takes_latest_by_created_and_lists_failures(tmp_path):
    recs = [
        rec("dofa", "glid", 80.0, created="2026-03-02T00:00:00"),  # later, but earlier in the file
        rec("dofa", "glid", 10.0, created="2026-03-01T00:00:00"),
        rec("dofa", "gld", 50.0, created="2026-03-01T00:00:00"),
        rec("dofa", "gld", 0.0, created="2026-03-03T00:00:00", status="error"),  # latest run failed
        rec("unet", "glid", 70.0, unknown_future_key={"x": 1}),  # extra keys tolerated
        rec("unet", "gld", 60.0, metrics={"mF1": 1.0}),  # "ok" without mIoU: a failure, not a zero
    ]
    res = load_results(write(tmp_path / "results.jsonl", recs))
    assert {(r.model, r.dataset): r.miou for r in res.runs} == {
        ("dofa", "glid"): 80.0,
        ("unet", "glid"): 70.0,
    }
    assert sorted((r.model, r.dataset) for r in res.failures) == [("dofa", "gld"), ("unet", "gld")]
    assert len(res.replaced) == 2
    # fallback names without model_name
    assert {r.model_name for r in res.runs} == {"DOFA", "U-Net"}

    rep = build_report(tmp_path, tmp_path / "out", formats=["md", "json"])
    fail = json.loads((tmp_path / "out" / "failures.json").read_text())
    assert {(r["model"], r["dataset"]) for r in fail["rows"]} == {("dofa", "gld"), ("unet", "gld")}
    assert "CUDA out of memory" in (tmp_path / "out" / "failures.md").read_text()
    lb = rep.leaderboards["frozen"]
    assert lb.row("DOFA").cells.keys() == {"glid"}  # the failure is not averaged
    assert lb.row("DOFA").avg == 80.0


def test_bad_records_name_file_and_line(tmp_path):
    p = tmp_path / "results.jsonl"
    p.write_text(json.dumps(rec("dofa", "glid", 1.0)) + "\n{not json\n")
    with pytest.raises(UserError, match=r"results.jsonl:2: not valid JSON"):
        load_results(p)
    p.write_text(json.dumps({"model": "dofa", "dataset": "glid"}) + "\n")
    with pytest.raises(UserError, match=r"results.jsonl:1: record lacks protocol, seed, status"):
        load_results(p)
    with pytest.raises(UserError, match="no such results file"):
        load_results(tmp_path / "nope")


# --- seeds
# -----------------------------------------------------------------------------------------


def test_seed_robustness_mean_std_q_and_flippable_ranking(tmp_path):
    # X and Y swap places between seeds on both datasets; Z is clearly last and stable
    vals = {
        "X": {0: (80, 60), 1: (70, 50)},
        "Y": {0: (75, 55), 1: (78, 58)},
        "Z": {0: (40, 20), 1: (40, 20)},
    }
    recs = [
        rec(m.lower(), ds, v[k], seed=s, name=m)
        for m, by in vals.items()
        for s, v in by.items()
        for k, ds in enumerate(("glid", "gld"))
    ]
    res = load_results(write(tmp_path / "results.jsonl", recs))
    lb = leaderboard_from_runs(res.runs, key="frozen", title="T", protocol="frozen", fraction=1.0)
    x = lb.row("X").cells["glid"]
    assert x.mean == 75.0 and x.std == pytest.approx(statistics.stdev([80, 70])) and x.n == 2
    assert x.stability == pytest.approx(2 * 0.75 / (0.02 + 0.05))
    assert x.rank == 2 and x.rank_range == (1, 2)  # Y's mean is 76.5, but seeds can flip it
    assert lb.row("Z").cells["glid"].rank_range == (3, 3)
    assert lb.row("X").place_range == (1, 2) and lb.row("Z").place_range == (3, 3)
    assert any("differs between seeds" in n for n in lb.notes)
    t = robustness_table(lb)
    i = [r[0] for r in t.rows].index("X")
    assert t.texts[i][t.col("glid_mean")] == "75.00 ± 7.07 (2)"
    assert t.texts[i][t.col("glid_rank")] == "2 (1–2)"
    assert t.rows[i][t.col("seed_flip")] is True
    assert t.rows[[r[0] for r in t.rows].index("Z")][t.col("seed_flip")] is False


def test_retention_gain_cost_and_published_comparison(tmp_path):
    recs = [
        rec("dofa", "glid", 90.0),
        rec("dofa", "gld", 80.0),
        rec("dofa", "glid", 81.0, protocol="fewshot", fraction=0.1),
        rec("dofa", "gld", 76.0, protocol="fewshot", fraction=0.1),
        rec("dofa", "glid", 99.0, protocol="finetune"),
        rec("unet", "glid", 91.58, device="cuda", timings={"total_s": 7200.0}),
        rec("unet", "glid", 50.0, protocol="fewshot", fraction=0.1),
    ]
    rep = build_report(
        write(tmp_path / "r" / "results.jsonl", recs), tmp_path / "out", formats=["json", "csv"]
    )
    assert set(rep.leaderboards) == {"frozen", "fewshot", "finetune"}

    ret = rep.tables["compare/fewshot_retention"]
    i = ret.column_values("model").index("DOFA")
    assert ret.rows[i][ret.col("glid")] == pytest.approx(90.0)
    assert ret.rows[i][ret.col("retention")] == pytest.approx(100 * 78.5 / 85.0)
    assert ret.rows[i][ret.col("n_datasets")] == 2
    gain = rep.tables["compare/finetune_gain"]
    i = gain.column_values("model").index("DOFA")
    assert gain.rows[i][gain.col("glid_gain")] == pytest.approx(9.0)
    assert gain.rows[i][gain.col("glid_rel_pct")] == pytest.approx(10.0)

    lbt = rep.tables["frozen/leaderboard"]
    i = lbt.column_values("model").index("U-Net")
    assert (
        lbt.rows[i][lbt.col("gpu_hours")] == pytest.approx(2.0)
        and lbt.rows[i][lbt.col("cpu_hours")] == 0.0
    )
    assert lbt.rows[i][lbt.col("params_M")] == pytest.approx(1.5)

    cmp_ = rep.tables["frozen/published_comparison"]
    i = cmp_.column_values("model").index("DOFA")
    assert cmp_.rows[i][cmp_.col("glid_paper")] == 92.61
    assert cmp_.rows[i][cmp_.col("glid_delta")] == pytest.approx(90.0 - 92.61)
    assert cmp_.rows[i][cmp_.col("avg_paper")] == pytest.approx((92.61 + 80.44) / 2)
    assert cmp_.rows[i][cmp_.col("rank_paper")] == 6.20
    j = cmp_.column_values("model").index("U-Net")
    assert (
        cmp_.rows[j][cmp_.col("glid_delta")] == pytest.approx(0.0)
        and cmp_.rows[j][cmp_.col("n_datasets")] == 1
    )
    pc = rep.tables["frozen/per_class_iou_glid"]
    assert [c.key for c in pc.columns][1:] == ["Background", "Target"]
    assert (tmp_path / "out" / "frozen" / "per_class_iou_glid.csv").exists()


def test_one_display_name_never_mixes_variants(tmp_path):
    recs = [
        rec("croma_optical", "glid", 70.0, seed=0),
        rec("croma_optical", "glid", 72.0, seed=1),
        rec("croma_sar", "glid", 10.0, seed=0),
    ]
    res = load_results(write(tmp_path / "results.jsonl", recs))
    lb = leaderboard_from_runs(res.runs, key="frozen", title="T", protocol="frozen", fraction=1.0)
    c = lb.row("CROMA").cells["glid"]
    assert c.values == (70.0, 72.0) and c.model_ids == ("croma_optical",)
    assert any("croma_sar" in n for n in lb.notes)


# --- the published table
# ---------------------------------------------------------------------------


def test_published_table_reproduces_its_averages_and_ranks_and_flags_ramen():
    lb = published_leaderboard()
    assert [r.name for r in lb.rows][:3] == ["CROMA", "DOFA", "GFM-Swin"] and len(lb.rows) == 16
    assert [d for d in lb.datasets] == ["glid", "gld", "sicd", "caffe", "gsdd"]
    mism = check_consistency(lb)
    # every printed average and rank agrees except RAMEN's average (printed 57.17, numbers give
    # 53.60)
    assert [(m.model, m.field) for m in mism] == [("RAMEN", "avg_mIoU")]
    assert mism[0].published == 57.17 and mism[0].recomputed == pytest.approx(53.604)
    for r in lb.rows:
        assert r.avg_rank == pytest.approx(r.published_rank, abs=0.005)
    assert lb.row("TerraMind").cells["sicd"].rank == 1 and lb.row("U-Net").cells["caffe"].rank == 1
    t = leaderboard_table(lb, mismatches=mism)
    i = t.column_values("model").index("RAMEN")
    assert t.texts[i][t.col("avg_mIoU_published")] == "57.17 †"
    assert t.texts[i][t.col("avg_mIoU")] == "53.60"
    u = t.column_values("model").index("U-Net")
    assert t.marks[(u, "avg_mIoU")] == 1 and t.marks[(u, "avg_rank")] == 1
    assert t.marks[(t.column_values("model").index("TerraMind"), "avg_rank")] == 2


def test_bundled_csv_is_the_reference_table():
    rows = list(csv.DictReader(PUBLISHED_CSV.open()))
    assert (
        rows[0]["model"] == "CROMA"
        and rows[0]["GLID"] == "78.52"
        and rows[-1]["avg_rank_published"] == "8.00"
    )


def test_imported_table_with_wrong_rank_and_missing_cell(tmp_path):
    p = tmp_path / "imported.csv"
    p.write_text(
        "model,GLID,GLD,CaFFe,avg_miou_published,avg_rank_published\n"
        "P,80,70,60,70.00,1.33\n"  # ranks 1,2,1 -> 1.33: consistent
        "Q,70,75,50,65.00,1.00\n"  # ranks 2,1,2 -> 1.67: printed rank is wrong
        "R,60,,40,50.00,3.00\n"
    )  # missing GLD: average over 2 datasets is 50, rank 3
    lb = load_leaderboard_csv(p)
    assert lb.datasets == ["glid", "gld", "caffe"]
    assert lb.row("R").n_avg == 2 and "gld" not in lb.row("R").cells
    assert [(m.model, m.field) for m in check_consistency(lb)] == [("Q", "avg_rank")]
    rep = build_report(None, tmp_path / "out", published=p, formats=["md", "csv"])
    text = (tmp_path / "out" / "published" / "consistency.md").read_text()
    assert "1 mismatch(es): Q: published avg_rank 1.00, recomputed 1.667" in text
    lt = (tmp_path / "out" / "published" / "leaderboard.md").read_text()
    assert "| R | 60.00 | – | 40.00 | 50.00 (2/3) |" in lt
    assert rep.mismatches[0].model == "Q"


# --- CLI
# -------------------------------------------------------------------------------------------


def _parser():
    p = argparse.ArgumentParser(prog="cryocube")
    report_cli.register(p.add_subparsers(dest="command"))
    return p


def test_cli_report_writes_all_formats(tmp_path, capsys):
    write(
        tmp_path / "runs" / "results.jsonl",
        [
            rec("dofa", "glid", 90.0),
            rec("unet", "glid", 91.0),
            rec("unet", "gld", 1.0, status="error"),
        ],
    )
    args = _parser().parse_args(
        [
            "report",
            str(tmp_path / "runs"),
            "--out",
            str(tmp_path / "out"),
            "--published",
            "--format",
            "md,csv",
            "--format",
            "json,tex,html",
        ]
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "published table mismatch: RAMEN" in out and "failed runs: 1" in out
    for ext in ("md", "csv", "json", "tex"):
        assert (tmp_path / "out" / "frozen" / f"leaderboard.{ext}").stat().st_size > 0
        assert (tmp_path / "out" / "published" / f"consistency.{ext}").stat().st_size > 0
    assert (tmp_path / "out" / "report.html").stat().st_size > 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert "![" in md and "## Run metadata" in md


def test_cli_errors_are_user_errors(tmp_path):
    args = _parser().parse_args(["report", "--out", str(tmp_path / "o")])
    with pytest.raises(UserError, match="nothing to report"):
        args.func(args)
    write(tmp_path / "results.jsonl", [rec("dofa", "glid", 90.0)])
    args = _parser().parse_args(
        ["report", str(tmp_path), "--out", str(tmp_path / "o"), "--format", "docx"]
    )
    with pytest.raises(UserError, match="unknown format"):
        args.func(args)
    args = _parser().parse_args(
        ["report", str(tmp_path), "--out", str(tmp_path / "o"), "--protocol", "finetune"]
    )
    with pytest.raises(UserError, match="no successful runs of protocol"):
        args.func(args)


def test_rows_run_with_a_deviation_are_marked():
    """A record naming deviations in effect (docs/deviations.md) gets its own, marked row and a
    note; the same model run with follow_reference is an unmarked row."""
    recs = [
        rec(
            "ssl4eo_dino", "glid", 60.0, deviations={"in_effect": ["dino_qkv_bias"], "followed": []}
        ),
        rec(
            "ssl4eo_dino",
            "gld",
            61.0,
            seed=1,
            deviations={"in_effect": [], "followed": ["dino_qkv_bias"]},
        ),
        rec("ssl4eo_moco", "glid", 55.0),
    ]
    res = load_results(write(Path(tempfile.mkdtemp()) / "results.jsonl", recs))
    names = sorted({r.model_name for r in res.runs})
    assert names == ["S12-DINO", "S12-DINO (deviates: dino_qkv_bias)", "S12-MoCo"], names
    lb = leaderboard_from_runs(res.runs, key="frozen", title="T", protocol="frozen", fraction=1.0)
    t = leaderboard_table(lb)
    assert any("declared deviation" in n and "follow_reference" in n for n in t.notes)


def test_a_board_from_cells_refuses_a_cell_over_other_samples():
    """report/board.py lays out any family's cells: one column per (task, metric) in its unit; a
    cell over other samples than its column's is refused, naming the record and the model."""
    from cryocube.report.board import cells_table
    from cryocube.report.records import parse_record

    def run(model, value, samples="s1", unit="%"):
        cell = {
            "task": "t",
            "metric": "accuracy",
            "class": None,
            "unit": unit,
            "split": "test",
            "samples": samples,
            "n": 10,
            "value": value,
            "ci_low": value - 1,
            "ci_high": value + 1,
        }
        return parse_record(
            rec(
                model,
                "glid",
                0.0,
                family="toy",
                primary_metric="accuracy",
                metrics={"accuracy": value, "cells": [cell]},
            ),
            f"r.jsonl:{model}",
        )

    t = cells_table([run("b", 50.0), run("a", 70.0)], "board", "Board")
    assert [c.header for c in t.columns] == ["Model", "t accuracy (%)"]
    assert t.texts == [["a", "70.00 [69.00, 71.00] n=10"], ["b", "50.00 [49.00, 51.00] n=10"]]
    with pytest.raises(
        UserError, match=r"r.jsonl:b: the t accuracy cell of b has samples 's2', its column 's1'"
    ):
        cells_table([run("a", 70.0), run("b", 50.0, samples="s2")], "board", "Board")
    with pytest.raises(UserError, match="has unit 'count'"):
        cells_table([run("a", 70.0), run("b", 50.0, unit="count")], "board", "Board")
