"""The board that compares: on a synthetic interferogram cube (coherence class and fringe count
learnable), the tiny random VLM, the same VLM shown blank pictures (blind baseline) and an encoder's
linear answer heads are scored on the same test samples as the chance baseline, on a real
LocalCluster; `report` lays their cells out, one metric in one unit per column, n in every cell, and
refuses a cell over other samples. Hephaestus's rendered RGB reaches an optical encoder; a
Cryo-Bench tile cube gets heads per class."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from cryocube.families import RunSpec

VLM_SETS = ["block_samples=20", "gen_batch=10", "max_new_tokens=6"]
HEAD_SETS = ["input_size=32", "normalization=cube"]


def _run(cube, out, client, model, protocol, sets):
    from cryocube.engine.evaluate import evaluate
    from cryocube.families.recipes import load_recipe

    (rec,) = evaluate(
        [RunSpec(model, cube, protocol)],
        str(out),
        load_recipe(None, list(sets)),
        client=client,
        progress=False,
        allow_random_weights=True,
    ).records
    assert rec["status"] == "ok", rec.get("error")
    return rec


def _rows(text: str) -> list[list[str]]:
    return [
        [c.strip() for c in x.strip().strip("|").split("|")]
        for x in text.splitlines()
        if x.startswith("| ")
    ]


CELL = r"-?\d+\.\d\d \[-?\d+\.\d\d, -?\d+\.\d\d\] n=\d+( \(.*\))?"


def _done_when(text: str, results: Path, blind: bool = True) -> dict[str, list[str]]:
    """Issue 25's Done-when on one LEADERBOARD.md: every column holds one metric in one unit (the
    records' cells of a column share metric, unit and sample hash; the header names the unit), every
    cell shows n or says why it is empty, the chance and blind rows are present. Returns the rows by
    model name."""
    from cryocube.families.vqa.report import CANNOT, NOT_ASKED, NOT_RUN

    rows = _rows(text)
    head, body = rows[0], rows[1:]
    assert head[:2] == ["Model", "Kind"] and head[-1] == "Unparsed"
    kinds = [r[1] for r in body]
    assert kinds[0] == "baseline: chance" and "baseline: blind" in kinds
    assert (body[1][0] != "blind") == blind  # a blind run's row, or "blind: not run"
    by_col: dict[tuple, set] = {}
    for line in results.read_text().splitlines():
        r = json.loads(line)
        for c in (r.get("metrics") or {}).get("cells", []) + (
            (r.get("metrics") or {}).get("baselines") or {}
        ).get("chance", []):
            if c["class"] is None:
                by_col.setdefault((c["task"], c["metric"]), set()).add((c["unit"], c["samples"]))
    assert all(len(v) == 1 for v in by_col.values()), by_col  # one unit, one sample set per column
    assert all(re.search(r"\(.+\)$", h) for h in head[2:-1]), head  # the header names its unit
    for row in body:
        for cell in row[2:-1]:
            assert re.fullmatch(CELL, cell) or cell in (
                CANNOT,
                NOT_ASKED,
                NOT_RUN,
                "cannot answer (chance)",
                "– (not in cube)",
            ), (row[0], cell)
    assert "refused" not in text
    return {r[0]: r for r in body}


@pytest.fixture(scope="module")
def board(tmp_path_factory, insar_cube, client):
    url = insar_cube(n=40, size=32, seed=0)[0]
    out = tmp_path_factory.mktemp("board") / "results"
    recs = {
        "head": _run(url, out, client, "vit_scratch", "heads", HEAD_SETS),
        "head2": _run(url, out, client, "ssl4eo_moco", "heads", HEAD_SETS),
        "vlm": _run(url, out, client, "transformers", "vqa", VLM_SETS),
        "blind": _run(url, out, client, "transformers", "vqa", VLM_SETS + ["blind=true"]),
    }
    return url, out, recs


def _cells(rec, key="cells"):
    cs = rec["metrics"][key] if key == "cells" else rec["metrics"]["baselines"]["chance"]
    return {(c["task"], c["metric"]): c for c in cs if c["class"] is None}


def test_every_family_scores_the_same_test_samples(board):
    from cryocube.cube import cube_info
    from cryocube.families.segmentation.sample_cubes import as_tiles
    from cryocube.families.split import cube_split, samples_hash

    url, _, recs = board
    split, ids, record = cube_split(url, cube_info(url).checksum)
    # the segmentation family draws the same split
    assert (as_tiles(cube_info(url))[0].splits == split).all()
    test_ids = [i for i, s in zip(ids, split) if s == "test"]
    head, vlm, blind = (_cells(recs[k]) for k in ("head", "vlm", "blind"))
    chance = _cells(recs["head"], "chance")
    # every run derives the same chance cells from the cube
    assert _cells(recs["vlm"], "chance") == chance
    for key in (("coherence_classification", "accuracy"), ("fringe_counting", "mae")):
        assert (
            head[key]["samples"]
            == vlm[key]["samples"]
            == blind[key]["samples"]
            == chance[key]["samples"]
            == samples_hash(test_ids)
        )
        assert head[key]["n"] == len(test_ids) and head[key]["split"] == "test"
    box = ("deformation_localization", "box_iou")
    assert head[box]["samples"] == vlm[box]["samples"] == chance[box]["samples"] and head[box][
        "n"
    ] < len(test_ids)
    assert head[box]["how"].startswith("box head")
    # text: no head
    assert ("noise_assessment", "token_f1") in vlm and ("noise_assessment", "token_f1") not in head
    # the VLM's all-samples figure stays, named as such, over more samples than the board's cell
    assert (
        recs["vlm"]["metrics"]["tasks"]["fringe_counting"]["n"]
        > vlm[("fringe_counting", "mae")]["n"]
    )
    # the blind baseline is its own run (the option is in the run id), shown blank pictures
    assert recs["blind"]["blind"] and recs["blind"]["run_id"] != recs["vlm"]["run_id"]
    assert recs["blind"]["identity"]["blind"] is True and "blind" not in recs["vlm"]["identity"]
    # the head's regularisation was chosen on the val split, and recorded
    h = recs["head"]["heads"]["coherence_classification"]
    assert h["chosen_on"] == f"val ({record['counts']['val']} samples)" and str(h["C"]) in h["val"]


def test_the_encoder_head_beats_chance_on_learnable_interferograms(board):
    _, _, recs = board
    head, chance = _cells(recs["head"]), _cells(recs["head"], "chance")
    acc = ("coherence_classification", "accuracy")
    mae = ("fringe_counting", "mae")
    assert head[acc]["value"] > chance[acc]["value"]
    assert head[mae]["value"] < chance[mae]["value"]


def test_leaderboard_one_metric_one_unit_per_column_n_in_every_cell(board, tmp_path):
    from cryocube.cli import main
    from cryocube.families.vqa.report import CANNOT

    _, out, recs = board
    assert main(["report", str(out), "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "LEADERBOARD.md").read_text()
    rows = _rows(text)
    assert rows[0] == [
        "Model",
        "Kind",
        "Coherence Acc (%)",
        "Localisation IoU (%)",
        "Localisation F1 (%)",
        "Fringe MAE (count)",
        "Noise F1 (%)",
        "Unparsed",
    ]
    by = {r[0]: r for r in rows[1:]}
    assert [r[1] for r in rows[1:]] == [
        "baseline: chance",
        "baseline: blind",
        "VLM",
        "GFM (linear head)",
        "GFM (linear head)",
    ]
    assert (
        _done_when(text, out / "results.jsonl")["tiny random llava (random init) (blind)"][1]
        == "baseline: blind"
    )
    vlm, head = by["tiny random llava (random init)"], by["ViT"]
    for row in rows[1:]:
        for cell in row[2:7]:
            assert re.fullmatch(
                r"-?\d+\.\d\d \[-?\d+\.\d\d, -?\d+\.\d\d\] n=\d+( \(.*\))?", cell
            ) or cell in (CANNOT, "cannot answer (chance)"), cell
    c = _cells(recs["head"])[("coherence_classification", "accuracy")]
    assert head[2] == f"{c['value']:.2f} [{c['ci_low']:.2f}, {c['ci_high']:.2f}] n={c['n']}"
    assert (
        head[3].endswith("(box head (linear on pooled features))") and head[4] == head[6] == CANNOT
    )
    assert by["chance"][4] == "cannot answer (chance)" and vlm[6].endswith(f"n={c['n']}")
    # probe F1 / R² stay in the embedding report
    assert "probe" not in " ".join(" ".join(r) for r in rows)
    assert "blind is a VLM shown a blank picture" in text and "refused" not in text


def test_report_refuses_a_cell_over_other_samples_or_units(board, tmp_path):
    from cryocube.cli import main

    _, out, recs = board
    for change, said in (
        (("samples", "0123456789ab"), "refused (other samples)"),
        (("unit", "fringes"), "refused (other unit)"),
    ):
        res = tmp_path / change[0]
        res.mkdir()
        lines = []
        for line in (out / "results.jsonl").read_text().splitlines():
            r = json.loads(line)
            if r.get("family") == "heads":
                for c in r["metrics"]["cells"]:
                    if (c["task"], c["metric"]) == ("fringe_counting", "mae"):
                        c[change[0]] = change[1]
            lines.append(json.dumps(r))
        (res / "results.jsonl").write_text("\n".join(lines) + "\n")
        assert main(["report", str(res), "--out", str(res / "report")]) == 0
        text = (res / "report" / "LEADERBOARD.md").read_text()
        head = next(r for r in _rows(text) if r[0] == "ViT")
        assert head[5] == said and head[2] != said  # only the planted cell is left out
        assert re.search(
            r"column 'Fringe MAE( \(count\))?': ViT's cell (is over other samples \(hash"
            r" 0123456789ab|in "
            r"'fringes', the column's unit is 'count').*left out",
            text,
        )


def test_blind_run_not_asked_tasks_and_blind_not_run(board, tmp_path, client):
    from cryocube.cli import main
    from cryocube.families.vqa.answer import blank_like
    from cryocube.families.vqa.report import NOT_ASKED, NOT_RUN

    pic = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    assert blank_like(pic).shape == pic.shape and len(np.unique(blank_like(pic))) == 1
    url, _, _ = board
    out = tmp_path / "results"
    _run(url, out, client, "transformers", "vqa", VLM_SETS + ["vqa_tasks=coherence_classification"])
    assert main(["report", str(out), "--out", str(tmp_path / "report")]) == 0
    rows = _rows((tmp_path / "report" / "LEADERBOARD.md").read_text())
    by = {r[0]: r for r in rows[1:]}
    assert by["blind"][1] == "baseline: blind" and set(by["blind"][2:7]) == {NOT_RUN}
    vlm = by["tiny random llava (random init)"]
    assert vlm[2].endswith("n=5") or "n=" in vlm[2]
    assert vlm[3:7] == [NOT_ASKED] * 4  # not "not in cube": the run was not asked them


def test_hephaestus_rendered_rgb_reaches_optical_encoders_on_one_board(tmp_path, client):
    from cryocube.cli import main
    from cryocube.convert.writer import convert
    from cryocube.families.vqa.report import CANNOT, NOT_RUN
    from cryocube.insar_synthetic import make_interferograms

    make_interferograms(tmp_path / "raw", n=12, size=32, seed=1, dataset="hephaestus")
    url = str(tmp_path / "heph.zarr")
    convert("hephaestus", str(tmp_path / "raw"), url, client=client, progress=False)
    out = tmp_path / "results"
    rec = _run(url, out, client, "vit_scratch", "heads", HEAD_SETS)
    assert (
        rec["band_mode"]
        == "rendered_rgb: B4<-insar_r, B3<-insar_g, B2<-insar_b; not fed: coherence_grey (a "
        "rendered grey layer (coherence): no slot of this encoder takes it)"
    )
    assert rec["embedding"]["band_rule"] == "rendered_rgb"
    own = {"deformation", "deformation_type", "low_coherence", "atmospheric_fringes", "intensity"}
    # its annotations, its box
    assert {c["task"] for c in rec["metrics"]["cells"]} == own | {"deformation_localization"}
    assert set(rec["tasks_left_out"]) == {"coherence_classification", "fringe_counting"}
    assert "caption" in rec["tasks_text"] and "caption" not in rec["tasks"]  # text: no head
    chance = {c["task"] for c in rec["metrics"]["baselines"]["chance"]}
    assert own <= chance and "caption" not in chance
    # an encoder with spectral slots
    moco = _run(url, out, client, "ssl4eo_moco", "heads", HEAD_SETS)
    fed = moco["band_mode"].split("; ")
    assert fed[0].startswith("rendered_rgb: ") and set(fed[0][14:].split(", ")) == {
        "B4<-insar_r",
        "B3<-insar_g",
        "B2<-insar_b",
    }
    assert fed[1].startswith("not fed: coherence_grey")
    vlm = _run(url, out, client, "transformers", "vqa", VLM_SETS)
    assert main(["report", str(out), "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "LEADERBOARD.md").read_text()
    assert "# Leaderboard (Hephaestus annotations; InSAR-VLM-Bench" in text
    by = _done_when(text, out / "results.jsonl", blind=False)
    head = _rows(text)[0]
    col = {h.split(" (")[0]: j for j, h in enumerate(head)}
    # both task files' columns, the dataset's own first, one metric per column
    assert head[2:8] == [
        "Deformation Acc (%)",
        "Deformation type Acc (%)",
        "Low coherence Acc (%)",
        "Atmospheric level MAE (level)",
        "Intensity Acc (%)",
        "Caption F1 (%)",
    ]
    assert {"Coherence Acc", "Localisation IoU", "Fringe MAE", "Noise F1"} <= set(col)
    assert [r[1] for r in by.values()] == [
        "baseline: chance",
        "baseline: blind",
        "VLM",
        "GFM (linear head)",
        "GFM (linear head)",
    ]
    box = next(c for c in vlm["metrics"]["cells"] if c["metric"] == "box_iou")
    vcell = {
        c["task"]: c
        for c in vlm["metrics"]["cells"]
        if c["class"] is None and c["metric"] == "accuracy"
    }
    hcell = {
        c["task"]: c
        for c in rec["metrics"]["cells"]
        if c["class"] is None and c["metric"] == "accuracy"
    }
    # the first phrasing, the heads' samples
    assert vcell["deformation"]["samples"] == hcell["deformation"]["samples"]
    from cryocube.cube import cube_info
    from cryocube.families.split import cube_split, samples_hash

    split, ids, _ = cube_split(url, cube_info(url).checksum)
    test_ids = [i for i, s in zip(ids, split) if s == "test"]
    ccell = {c["task"]: c for c in rec["metrics"]["baselines"]["chance"] if c["class"] is None}
    # asked in two phrasings: each test sample counts once
    for task in ("deformation", "deformation_type"):
        assert vcell[task]["n"] == hcell[task]["n"] == ccell[task]["n"] == len(test_ids)
        assert vcell[task]["samples"] == ccell[task]["samples"] == samples_hash(test_ids)
    assert len(vlm["metrics"]["tasks"]["deformation"]["phrasings"]) == 2
    for name in ("chance", "ViT", "S12-MoCo (random init)", "tiny random llava (random init)"):
        # the same test boxes
        assert by[name][col["Localisation IoU"]].split(" (")[0].endswith(f"n={box['n']}")
        assert by[name][col["Deformation Acc"]].endswith(f"n={hcell['deformation']['n']}")
    assert (
        by["ViT"][col["Caption F1"]] == CANNOT
        and by["chance"][col["Caption F1"]] == "cannot answer (chance)"
    )
    assert (
        by["blind"][2] == NOT_RUN
        and by["tiny random llava (random init)"][col["Coherence Acc"]] == "– (not in cube)"
    )
    # every row where the cube has no reference, chance's and blind's too (issue 38)
    for name in by:
        assert by[name][col["Coherence Acc"]] == by[name][col["Fringe MAE"]] == "– (not in cube)"
    # the blind run joins the same board, on the same samples
    _run(url, out, client, "transformers", "vqa", VLM_SETS + ["blind=true"])
    assert main(["report", str(out), "--out", str(tmp_path / "report2")]) == 0
    by = _done_when((tmp_path / "report2" / "LEADERBOARD.md").read_text(), out / "results.jsonl")
    assert by["tiny random llava (random init) (blind)"][col["Deformation Acc"]].endswith(
        f"n={hcell['deformation']['n']}"
    )


def test_bad_heads_and_blind_options_are_one_sentence(board, tmp_path, client):
    from cryocube.engine.evaluate import evaluate
    from cryocube.errors import UserError
    from cryocube.families.recipes import load_recipe
    from cryocube.recipe import RecipeError

    with pytest.raises(RecipeError, match="blind must be true or false"):
        load_recipe(None, ["blind=3"]).of("vqa")
    with pytest.raises(
        UserError, match=r"none of the tasks noise_assessment has an answer an encoder head gives"
    ):
        evaluate(
            [RunSpec("vit_scratch", board[0], "heads")],
            str(tmp_path),
            load_recipe(None, HEAD_SETS + ["vqa_tasks=noise_assessment"]),
            client=client,
            progress=False,
            allow_random_weights=True,
        )


def test_tile_cube_heads_per_class_beside_chance(tmp_path, client):
    from cryocube.cli import main
    from cryocube.convert.writer import convert
    from cryocube.synthetic import make_raw

    make_raw("gld", tmp_path / "raw", n={"train": 3, "val": 1, "test": 2}, seed=2)
    url = str(tmp_path / "gld.zarr")
    convert("gld", str(tmp_path / "raw"), url, client=client, tile_size=32, progress=False)
    rec = _run(url, tmp_path / "results", client, "vit_scratch", "heads", HEAD_SETS)
    cells = {(c["task"], c["metric"], c["class"]): c for c in rec["metrics"]["cells"]}
    chance = {
        (c["task"], c["metric"], c["class"]): c for c in rec["metrics"]["baselines"]["chance"]
    }
    for k in (
        ("class_presence", "accuracy", "glacial_lake"),
        ("class_fraction", "mae", "glacial_lake"),
    ):
        assert cells[k]["samples"] == chance[k]["samples"] and cells[k]["n"] == 8
    assert cells[("class_fraction", "mae", "glacial_lake")]["unit"] == "fraction of the tile"
    assert main(["report", str(tmp_path / "results"), "--out", str(tmp_path / "report")]) == 0
    rows = _rows((tmp_path / "report" / "LEADERBOARD.md").read_text())
    assert rows[0] == [
        "Model",
        "Kind",
        "Class",
        "Presence Acc (%)",
        "Fraction MAE (fraction of the tile)",
        "Unparsed",
    ]
    kinds = [(r[1], r[2]) for r in rows[1:]]
    assert ("baseline: chance", "glacial_lake") in kinds and (
        "GFM (linear head)",
        "glacial_lake",
    ) in kinds
    # one class: no "all" row
    assert ("baseline: blind", "all") in kinds and ("GFM (linear head)", "all") not in kinds
