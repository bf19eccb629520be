"""Deformation localisation by an encoder: the interferogram cube's per-pixel deformation mask
(derived by the box rule, or rasterised from human boxes and Hephaestus polygons), a frozen
random-weights encoder + decoder trained on it on a real LocalCluster, its predicted test masks
turned into boxes and scored by box IoU, and that number in the GFM row of LEADERBOARD.md."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cryocube.families import RunSpec
from cryocube.families.segmentation.localisation import box_scores, predicted_box

FAST = [
    "epochs=2",
    "decoder_channels=16",
    "input_size=32",
    "val_every=1",
    "crops_per_sample=2",
    "batch_size=4",
    "normalization=cube",
    "threads=1",
]


def _plan(tmp_path, dataset: str, **kw):
    from cryocube.catalog import load_dataset
    from cryocube.convert.base import open_reader
    from cryocube.insar_synthetic import make_interferograms

    m = make_interferograms(tmp_path / dataset, n=9, size=32, seed=3, dataset=dataset, **kw)
    spec = load_dataset(dataset)
    _, plan = open_reader(spec, next(iter(spec.layouts))).plan(str(tmp_path / dataset))
    return m, plan


def _box(mask):
    ys, xs = np.nonzero(mask == 1)
    return None if xs.size == 0 else (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)


# -- mask -> box -> IoU on hand-made masks
# ---------------------------------------------------------------


def test_mask_to_box_to_iou_by_hand():
    a = np.zeros((8, 8), np.int16)
    a[2:4, 1:5] = 1  # 2 x 4 block: box (1, 2, 5, 4)
    a[7, 7] = 1  # a lone pixel: dropped at min_pixels 2, kept at 1
    assert predicted_box(a, 8, 8, min_pixels=2) == (1.0, 2.0, 5.0, 4.0)
    # all kept pixels, not only the largest region
    assert predicted_box(a, 8, 8, min_pixels=1) == (1.0, 2.0, 8.0, 8.0)
    # padding beyond the pair's extent left out
    assert predicted_box(a, 6, 6, min_pixels=1) == (1.0, 2.0, 5.0, 4.0)
    empty = np.zeros((8, 8), np.int16)
    ref = (1.0, 2.0, 5.0, 3.0)  # 4 x 1 inside the 4 x 2 prediction: IoU 4 / 8
    ious, false_boxes, no_ref = box_scores(
        [a, empty, a, empty], [ref, ref, None, None], [(8, 8)] * 4, min_pixels=2
    )
    assert ious == [0.5, 0.0]  # an empty prediction has no box and scores 0
    # a box drawn where the reference has none is counted apart
    assert (false_boxes, no_ref) == (1, 2)


# -- the derived mask against the generator's truth
# ------------------------------------------------------


def test_derived_mask_matches_the_generator(tmp_path):
    from cryocube.convert.insar_labels import Rules

    m, plan = _plan(tmp_path, "insar")
    mask, box = plan.data_vars["mask"][1], plan.data_vars["box"][1]
    origin = plan.coords["mask_origin"][1]
    r = Rules()
    moved = 0
    for i, p in enumerate(m.pairs):
        assert origin[i] == "derived" and mask[i].dtype == np.int8
        assert plan.coords["mask_pixels"][1][i].tolist() == [
            int((mask[i] == 0).sum()),
            int((mask[i] == 1).sum()),
        ]
        valid = p.coherence >= r.mask_coherence
        # untrusted pixels are ignore, as the rules mask them
        assert ((mask[i] == -1) == ~valid).all()
        b = _box(mask[i])
        # the box of the mask is the cube's box
        assert (b is None) == (not np.isfinite(box[i]).all())
        if b is not None:
            assert tuple(float(v) for v in b) == tuple(float(v) for v in box[i])
        if p.box is None:
            assert not (mask[i] == 1).any()
            continue
        moved += 1
        truth = np.abs(p.los_m) > r.threshold_m
        agree = ((mask[i] == 1) == truth)[valid].mean()
        assert agree > 0.9, (p.id, agree)
        assert b is not None
        ix = max(0, min(b[2], p.box[2]) - max(b[0], p.box[0])) * max(
            0, min(b[3], p.box[3]) - max(b[1], p.box[1])
        )
        union = (b[2] - b[0]) * (b[3] - b[1]) + (p.box[2] - p.box[0]) * (p.box[3] - p.box[1]) - ix
        assert ix / union > 0.6, (p.id, b, p.box)
    assert moved >= 4


def test_human_boxes_and_polygons_are_rasterised(tmp_path):
    # the generator writes the true boxes into the annotations
    m, plan = _plan(tmp_path, "insar", unwrapped=False)
    for i, p in enumerate(m.pairs):
        assert plan.coords["mask_origin"][1][i] == "annotation_box"
        assert _box(plan.data_vars["mask"][1][i]) == (
            None if p.box is None else tuple(int(v) for v in p.box)
        )
        assert (plan.data_vars["mask"][1][i] >= 0).all()  # a human box labels every pixel
    m, plan = _plan(tmp_path, "hephaestus")
    for i, p in enumerate(m.pairs):
        got = plan.data_vars["mask"][1][i]
        assert plan.coords["mask_origin"][1][i] == "annotation_polygons"
        assert _box(got) == (None if p.box is None else tuple(int(v) for v in p.box))
        if p.box is not None:  # the polygon is the box's rectangle: every pixel inside it is 1
            x0, y0, x1, y1 = (int(v) for v in p.box)
            assert (got[y0:y1, x0:x1] == 1).all() and got.sum() == (x1 - x0) * (y1 - y0)


# -- an encoder on the board
# ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ifg_cube(insar_cube):
    return insar_cube(n=12, size=32, seed=0)[0]


def test_encoder_localises_through_segmentation(ifg_cube, tmp_path, client, capsys):
    from cryocube.cli import main
    from cryocube.cube import open_cube
    from cryocube.engine.evaluate import evaluate
    from cryocube.families.recipes import load_recipe
    from cryocube.families.vqa.report import CANNOT

    ds = open_cube(ifg_cube)
    assert ds["mask"].dims == ("sample", "y", "x") and ds.attrs["mask"]["classes"] == [
        "stable",
        "deformation",
    ]
    assert main(["inspect", ifg_cube]) == 0
    assert "mask (per pixel): derived 12" in capsys.readouterr().out
    out = tmp_path / "results"
    # a pretrained encoder (random weights here) stays frozen: features cached from the cube's
    # masks, a decoder trained
    (rec,) = evaluate(
        [RunSpec("ssl4eo_moco", ifg_cube, "frozen")],
        str(out),
        load_recipe(None, FAST),
        client=client,
        progress=False,
        allow_random_weights=True,
    ).records
    assert rec["status"] == "ok", rec.get("error")
    assert not rec["trains_encoder"] and rec["encoder_forward_items"] > 0
    assert rec["band_rule"] == "cross_sensor"  # the dataset's rule, as embed uses it
    split = rec["split"]
    assert sum(split["counts"].values()) == 12 and min(split["counts"].values()) >= 1
    loc = rec["localisation"]
    test = np.flatnonzero(np.array([s == "test" for s in _drawn(ifg_cube)]))
    assert loc["n"] == int(np.isfinite(ds["box"].values[test]).all(axis=1).sum()) >= 1
    assert 0.0 <= loc["ci_low"] <= loc["value"] <= loc["ci_high"] <= 100.0
    assert loc["metric"] == "box_iou" and "min_pixels" in loc["rule"]

    # the board is per dataset with VLM answers
    (vlm,) = evaluate(
        [RunSpec("transformers", ifg_cube, "vqa")],
        str(out),
        load_recipe(None, ["block_samples=6", "gen_batch=6", "max_new_tokens=6"]),
        client=client,
        progress=False,
        allow_random_weights=True,
    ).records
    assert vlm["status"] == "ok", vlm.get("error")

    assert main(["report", str(out), "--out", str(tmp_path / "report")]) == 0
    board = (tmp_path / "report" / "LEADERBOARD.md").read_text()
    rows = {
        r[0]: r
        for r in (
            [c.strip() for c in line.strip("|").split("|")]
            for line in board.splitlines()
            if line.startswith("| ")
        )
    }
    assert rows["Model"][3] == "Localisation IoU (%)"
    g = rows["S12-MoCo (random init)"]
    assert g[1] == "GFM (segmentation)"
    cell = g[3]
    assert (
        cell == f"{loc['value']:.2f} [{loc['ci_low']:.2f}, {loc['ci_high']:.2f}] n={loc['n']}"
        " (segmentation, mask->box)"
    )
    shown = float(cell.split()[0])
    assert 0.0 <= shown <= 100.0 and math.isclose(shown, loc["value"], abs_tol=0.005)
    assert g[4] == g[6] == CANNOT  # text answers stay out of an encoder's reach
    vbox = next(
        c
        for c in vlm["metrics"]["cells"]
        if (c["task"], c["metric"]) == ("deformation_localization", "box_iou")
    )
    # the VLM's test boxes, one split per cube
    assert loc["samples"] == vbox["samples"] and loc["n"] == vbox["n"]
    assert "--protocol frozen" in board
    assert rows["tiny random llava (random init)"][1] == "VLM"
    # its mIoU on deformation masks has a board of its own, never averaged or ranked with
    # Cryo-Bench's datasets
    rep = tmp_path / "report"
    assert (rep / "frozen-interferograms" / "leaderboard.md").exists() and not (
        rep / "frozen"
    ).exists()
    assert "deformation masks, not in the Cryo-Bench averages" in (rep / "report.html").read_text()


def _drawn(url):
    from cryocube.cube import cube_info
    from cryocube.families.segmentation.sample_cubes import as_tiles

    return as_tiles(cube_info(url))[0].splits


def test_a_sample_cube_without_a_mask_is_refused_before_any_cluster(tmp_path, client, capsys):
    from cryocube.cli import main
    from cryocube.convert.writer import convert
    from cryocube.synthetic import make_samples

    make_samples("ssl4eo-downstream", tmp_path / "raw", n=6, size=8, seed=1)
    url = str(tmp_path / "cube.zarr")
    convert("ssl4eo-downstream", str(tmp_path / "raw"), url, client=client, progress=False)
    capsys.readouterr()
    rc = main(
        [
            "evaluate",
            "--cubes",
            url,
            "--models",
            "vit_scratch",
            "--protocol",
            "frozen",
            "--allow-random-weights",
            "--out",
            str(tmp_path / "out"),
            "--dry-run",
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err
    assert f"{url}: a samples cube without a per-pixel target" in err and "--protocol probe" in err


def test_fine_tuning_reads_the_mask_from_the_cube(ifg_cube, tmp_path, client):
    """Fine-tuning streams crops and test tiles from the cube itself (no feature cache): the same
    split, a box IoU."""
    from cryocube.engine.evaluate import evaluate
    from cryocube.families.recipes import load_recipe

    (rec,) = evaluate(
        [RunSpec("ssl4eo_moco", ifg_cube, "finetune")],
        str(tmp_path),
        load_recipe(None, FAST + ["epochs=1"]),
        client=client,
        progress=False,
        allow_random_weights=True,
    ).records
    assert rec["status"] == "ok", rec.get("error")
    assert rec["trains_encoder"] and rec["split"]["digest"] and rec["localisation"]["n"] >= 1
    assert 0.0 <= rec["localisation"]["value"] <= 100.0
