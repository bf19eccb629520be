"""Report figures: every plot is written as a real, non-empty PNG and SVG; qualitative panels read a
cube."""

from __future__ import annotations

import json
import warnings
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import xarray as xr
import zarr
from PIL import Image

from cryocube.errors import UserError
from cryocube.pages import build_report, qualitative_panels

CLASSES = {
    "glid": ["Background", "Target"],
    "sicd": ["open_water", "new_ice", "young_ice"],
    "gld": ["Background", "Glacial Lake"],
}


def rec(model, dataset, miou, *, seed=0, protocol="frozen", fraction=1.0, gflops=10.0, **extra):
    iou = {c: max(0.0, miou + 7 * (k - 1)) for k, c in enumerate(CLASSES[dataset])}
    r = {
        "run_id": f"{model}-{dataset}-{protocol}-{seed}",
        "model": model,
        "dataset": dataset,
        "protocol": protocol,
        "fraction": fraction,
        "seed": seed,
        "status": "ok",
        "error": None,
        "metrics": {"mIoU": miou, "IoU": iou},
        "timings": {"total_s": 60.0},
        "samples_per_s": 5.0,
        "device": "cpu",
        "params": {"encoder": 2_000_000, "decoder": 100_000},
        "gflops": gflops,
        "created": f"2026-03-01T00:00:0{seed}",
    }
    r.update(extra)
    return r


def check_png(p, min_size=(100, 100)):
    assert p.stat().st_size > 2000, p
    with Image.open(p) as im:
        assert im.format == "PNG" and im.size[0] >= min_size[0] and im.size[1] >= min_size[1]
        lo_hi = im.convert("L").getextrema()
        assert lo_hi[1] - lo_hi[0] > 50, f"{p} looks blank"
        return im.size


def check_svg(p):
    assert p.stat().st_size > 2000, p
    root = ET.parse(p).getroot()
    assert root.tag.endswith("svg")
    assert len(list(root.iter())) > 20  # drawn elements, not an empty canvas


def test_all_report_figures_are_written(tmp_path):
    models = {
        "dofa": (90, 80, 20, 34.0),
        "unet": (92, 77, 29, 256.0),
        "ssl4eo_moco": (75, 77, 26, 8.9),
        "terramind_base": (88, 79, 31, 35.6),
    }
    recs = []
    for m, (a, b, c, g) in models.items():
        for s in (0, 1):
            recs += [
                rec(m, "glid", a + s, seed=s, gflops=g),
                rec(m, "gld", b - s, seed=s, gflops=g),
                rec(m, "sicd", c + 0.5 * s, seed=s, gflops=g),
            ]
        recs += [
            rec(m, "glid", a * 0.9, protocol="fewshot", fraction=0.1, gflops=g),
            rec(m, "sicd", c * 0.8, protocol="fewshot", fraction=0.1, gflops=g),
        ]
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    rep = build_report(tmp_path / "runs", tmp_path / "out", formats=["md"], published=True)
    fig = tmp_path / "out" / "figures"
    expected = [
        "frozen_radar",
        "frozen_miou_vs_gflops",
        "frozen_per_class_iou",
        "fewshot_radar",
        "fewshot_retention",
        "published_radar",
    ]
    for stem in expected:
        check_png(fig / f"{stem}.png", min_size=(300, 250))
        check_svg(fig / f"{stem}.svg")
    assert {p.stem for p in rep.figures} >= set(expected)
    assert all(p.exists() for p in rep.figures)


@pytest.fixture(params=[object, str], ids=["vlen-strings", "fixed-strings"])
def cube(tmp_path, request):
    """A tiny cube in the documented layout; string coords stored both ways zarr v3 allows."""
    sdt = request.param
    rng = np.random.default_rng(0)
    n, size = 4, 32
    image = rng.integers(0, 255, (n, 3, size, size)).astype("uint8")
    label = (image[:, 0] > 128).astype("int16")
    label[:, :4, :] = -1  # padding rows
    ds = xr.Dataset(
        {"image": (("sample", "band", "y", "x"), image), "label": (("sample", "y", "x"), label)},
        coords={
            "band": np.array(["B4", "B3", "B2"], dtype=sdt),
            "split": ("sample", np.array(["train", "test", "test", "test"], dtype=sdt)),
            "scene": ("sample", np.array(["s0", "s1", "s1", "s2"], dtype=sdt)),
        },
        attrs={
            "dataset": "glid",
            "schema_version": 3,
            "classes": [
                {"name": "Background", "colour": "#202020"},
                {"name": "Target", "colour": "#1f77b4"},
            ],
        },
    )
    url = tmp_path / "glid.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fixed-width strings have no settled zarr v3 spec
        ds.to_zarr(url, zarr_format=3, consolidated=False)
    return url, label


def write_predictions(path, label, samples):
    g = zarr.open_group(str(path), mode="w")
    pred = label[samples].copy()
    pred[:, 10:20, 10:20] = 1 - np.clip(pred[:, 10:20, 10:20], 0, 1)  # some wrong pixels
    g.create_array("pred", data=pred.astype("int16"))
    g.create_array("sample", data=np.asarray(samples, dtype="int64"))


def test_qualitative_panels_with_and_without_predictions(tmp_path, cube):
    url, label = cube
    without = qualitative_panels(str(url), None, None, tmp_path / "q_none")
    assert [p.suffix for p in without] == [".png", ".svg"]
    w2, h2 = check_png(without[0])
    check_svg(without[1])
    write_predictions(tmp_path / "predictions.zarr", label, [1, 2])
    with_pred = qualitative_panels(
        str(url), str(tmp_path / "predictions.zarr"), [1, 2, 3], tmp_path / "q_pred"
    )
    w3, h3 = check_png(with_pred[0])
    assert w3 > w2 * 1.3  # a third column: the prediction
    svg = with_pred[1].read_text()
    assert "no prediction" in svg  # sample 3 has none
    with pytest.raises(UserError, match="out of range"):
        qualitative_panels(str(url), None, [99], tmp_path / "bad")
    with pytest.raises(UserError, match="no cube here"):
        qualitative_panels(str(tmp_path / "missing.zarr"), None, None, tmp_path / "bad")


def test_report_finds_a_runs_predictions_for_a_cube(tmp_path, cube):
    url, label = cube
    runs = tmp_path / "runs"
    r = rec("dofa", "glid", 88.0, cube={"url": str(url), "checksum": "x"})
    write_predictions(runs / "runs" / r["run_id"] / "predictions.zarr", label, [1, 2, 3])
    (runs / "results.jsonl").write_text(json.dumps(r) + "\n")
    rep = build_report(
        runs, tmp_path / "out", cube_urls=[str(url)], samples=[1, 2], formats=["html"]
    )
    q = [p for p in rep.figures if p.stem.startswith("qualitative") and p.suffix == ".png"]
    assert len(q) == 1
    check_png(q[0])
    assert "prediction of DOFA" in rep.html.read_text()


def test_label_fraction_curves_never_join_recipes_and_say_what_they_left_out(tmp_path):
    """One model at fraction 0.5 with epochs=1 and at fraction 1 with epochs=3: no curve joins them,
    and the section says which points it left out; a model with two fractions under one recipe is a
    curve, not a note.
    """

    def r(model, f, epochs, seed=0):
        return rec(
            model,
            "glid",
            40 + 20 * f + epochs,
            seed=seed,
            protocol="fewshot" if f < 1 else "frozen",
            fraction=f,
            run_id=f"{model}-{f}-{epochs}",
            identity={
                "model": model,
                "recipe": {"epochs": epochs},
                "fraction": f,
                "seed": seed,
                "protocol": "x",
            },
        )

    (tmp_path / "runs").mkdir()
    recs = [r("unet", 0.5, 1), r("unet", 1.0, 3), r("dofa", 0.5, 3), r("dofa", 1.0, 3)]
    (tmp_path / "runs" / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    build_report(tmp_path / "runs", tmp_path / "out", formats=["md"])
    md = (tmp_path / "out" / "report.md").read_text()
    sec = md.split("Label-fraction curves", 1)[1]
    assert "Left out of the curves, 2 point(s)" in sec, sec[:800]
    assert (
        "U-Net" in sec.split("Left out", 1)[1].split("\n", 1)[0]
        or "unet" in sec.split("Left out", 1)[1].split("\n", 1)[0]
    )
    assert "at fraction 0.5" in sec and "at fraction 1," in sec
    left = sec.split("Left out", 1)[1].split("\n", 1)[0]
    assert "dofa" not in left.lower()  # its two fractions share a recipe: a curve
