"""Interferogram cubes: the generator's GeoTIFF and Hephaestus trees -> sample cubes on a real
LocalCluster, the derived labels against the generator's truth, resume and the completion marker,
and every class of bad input refused in one sentence before a cluster starts."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from cryocube import store
from cryocube.catalog import load_dataset
from cryocube.cli import main
from cryocube.convert.base import open_reader
from cryocube.convert.hephaestus import render_phase
from cryocube.convert.insar_labels import Rules, los_to_phase, phase_to_los, wrap
from cryocube.convert.writer import convert
from cryocube.cube import (
    COMPLETE_ATTR,
    IncompleteCubeError,
    as_text,
    cube_info,
    open_cube,
    read_samples,
)
from cryocube.insar_synthetic import corrupt_ifg, make_interferograms, mogi, turbulence


def iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


@pytest.fixture(scope="module")
def geotiff(tmp_path_factory, client):
    root = tmp_path_factory.mktemp("insar")
    m = make_interferograms(root / "raw", n=12, size=64, seed=0)
    url = str(root / "cube.zarr")
    r = convert("insar", str(root / "raw"), url, client=client, block_samples=4, progress=False)
    return m, url, r


def test_physics_of_the_generator():
    """One fringe is lambda/2 of LOS change; Mogi uplift peaks above the source; turbulence is red
    (power law)."""
    lam = 0.05546576
    assert phase_to_los(np.array(2 * math.pi), lam) == pytest.approx(-lam / 2)
    assert los_to_phase(phase_to_los(np.array(1.234), lam), lam) == pytest.approx(1.234)
    x = np.linspace(-5000, 5000, 101)
    ue, un, uz = mogi(x, np.zeros_like(x), depth=2000.0, dv=1e6)
    assert np.argmax(uz) == 50 and uz[50] == pytest.approx(0.75 * 1e6 / math.pi / 2000.0**2)
    assert ue[50] == 0 and ue[60] > 0 > ue[40]  # radial outward motion
    w = wrap(np.array([0.0, math.pi + 0.5, -3 * math.pi]))
    assert np.all(w <= math.pi) and np.all(w > -math.pi) and w[1] == pytest.approx(-math.pi + 0.5)
    t = turbulence(np.random.default_rng(0), 64, 64, sigma=0.3)
    spec = np.abs(np.fft.rfft2(t)) ** 2
    assert t.std() == pytest.approx(0.3) and spec[1:4, 1:4].mean() > 50 * spec[20:30, 20:30].mean()


def test_the_sample_cube_view_reads_the_declared_schema(geotiff, tmp_path):
    """The typed view gives every declared variable by name, with the cube's own values, references
    read checked; a reader naming a variable the schema does not declare (or with the wrong rank) is
    stopped at plan time.
    """
    from cryocube.cube import SAMPLE_VARS, SampleCube, TileCube, declared, open_view

    m, url, _ = geotiff
    view, ds = open_view(url), open_cube(url)
    assert (
        isinstance(view, SampleCube) and not isinstance(view, TileCube) and view.n == len(m.pairs)
    )
    assert set(SAMPLE_VARS) <= set(ds.variables)  # an interferogram cube holds all of them
    assert list(view.values("primary_date")) == [p.primary for p in m.pairs]
    assert np.array_equal(view.values("height"), ds["height"].values)
    assert np.array_equal(view.checked("box"), ds["box"].values, equal_nan=True)
    with pytest.raises(KeyError, match="coordinate"):
        view.checked("frame")
    coords, data_vars = declared({"frame": np.array(["a"]), "box": np.zeros((1, 4))})
    assert coords == {"frame": (("sample",), coords["frame"][1])} and data_vars["box"][0] == (
        "sample",
        "corner",
    )
    with pytest.raises(KeyError, match="not declared"):
        declared({"frams": np.array(["a"])})
    with pytest.raises(ValueError, match="2-D values"):
        declared({"frame": np.zeros((1, 2))})


def test_geotiff_cube_holds_the_maps_and_labels_match_the_truth(geotiff):
    m, url, r = geotiff
    ds = open_cube(url)
    assert ds.attrs["kind"] == "samples" and r.blocks_written == r.blocks_total == 3
    assert ds["image"].dims == ("sample", "band", "y", "x") and ds["image"].shape == (12, 3, 64, 64)
    assert [str(b) for b in ds["band"].values] == ["wrapped_phase", "coherence", "unwrapped_phase"]
    assert [str(u) for u in ds["units"].values] == ["rad", "1", "rad"]
    ids = list(as_text(ds["source"].values))
    assert ids == [p.id for p in m.pairs]
    tasks = list(as_text(ds["task"].values))
    assert tasks == ["coherence_classification", "fringe_counting"] and list(
        as_text(ds["task_type"].values)
    ) == ["cls", "regr"]
    assert as_text(ds["task_classes"].values)[0] == "low|medium|high"
    target, box, ans = ds["target"].values, ds["box"].values, as_text(ds["answer"].values)
    text_tasks = list(as_text(ds["text_task"].values))
    sources = {p.source for p in m.pairs}
    assert sources == {"none", "mogi", "dislocation"} and any(
        np.isnan(p.unwrapped).any() for p in m.pairs
    )
    for i, p in enumerate(m.pairs):
        np.testing.assert_array_equal(ds["image"].values[i, 0], p.wrapped)
        np.testing.assert_array_equal(ds["image"].values[i, 1], p.coherence)
        # masked -> 0
        np.testing.assert_array_equal(ds["image"].values[i, 2], np.nan_to_num(p.unwrapped, nan=0.0))
        assert (
            str(ds["primary_date"].values[i]) == p.primary
            and str(ds["secondary_date"].values[i]) == p.secondary
        )
        assert target[i, 0] == p.coherence_class, p.id
        assert target[i, 1] == p.fringes, p.id
        if p.box is None:
            assert np.isnan(box[i]).all(), p.id
        else:
            assert iou(box[i], p.box) > 0.75, (p.id, box[i], p.box)
        assert str(ds["box_origin"].values[i]) == "derived"
        assert ans[i, text_tasks.index("noise_assessment")] == p.answers["noise_assessment"]
    assert sorted(set(target[:, 0].tolist())) == [0, 1, 2] and set(target[:, 1].tolist()) >= {0, 1}
    assert np.allclose(ds["radar_wavelength_m"].values, 0.05546576)
    d = ds.attrs["derivation"]
    lay = load_dataset("insar").layout("geotiff").options["derive"]
    assert (
        d["coherence_classification"]["thresholds"] == lay["coherence_classification"]["thresholds"]
    )
    assert (
        d["deformation_box"]["threshold_m"] == lay["deformation_box"]["threshold_m"]
        and "lambda" in d["los_convention"]
    )
    assert ds.attrs["unavailable"] == {} and ds.attrs["rendered"] is False
    info = cube_info(url)
    assert (
        info.kind == "samples"
        and info.time == ()
        and dict(info.tasks) == {"coherence_classification": "cls", "fringe_counting": "regr"}
    )
    img, tg = read_samples(url, [2, 5])  # checked against the per-sample digests
    assert img.shape == (2, 3, 64, 64) and np.array_equal(tg, target[[2, 5]], equal_nan=True)


def test_inspect_and_verify_a_sample_cube(geotiff, capsys):
    _, url, _ = geotiff
    assert main(["inspect", url]) == 0
    out = capsys.readouterr().out
    assert "task fringe_counting (regr): 12 labelled" in out and "wrapped_phase" in out
    assert main(["inspect", "--verify", url, "--quiet"]) == 0
    assert "0 damaged, checksum matches" in capsys.readouterr().out


def test_verify_checks_boxes_and_answers_too(geotiff, tmp_path, capsys):
    """The digests cover every per-sample variable a task reads, not only image and target: a
    deleted box chunk (read back as fill values), a garbled answer chunk and one altered box are
    each named by `inspect --verify`.
    """
    import shutil

    _, url, _ = geotiff
    g = store.open_group(url, "r")
    assert g.attrs["digest_vars"] == ["answer", "box", "mask"] and g["sample_digest"].shape == (
        12,
        5,
    )
    box = np.asarray(g["box"][:])
    has_box = np.isfinite(box).all(axis=1)
    # a block whose chunk holds real boxes
    blk = next(b for b in range(3) if has_box[4 * b : 4 * b + 4].any())
    other = (blk + 1) % 3
    copy = str(tmp_path / "damaged.zarr")
    shutil.copytree(url, copy)
    # a deleted chunk reads as NaN fill values
    os.remove(os.path.join(copy, "box", "c", str(blk), "0"))
    # garbled bytes cannot be decoded
    with open(os.path.join(copy, "answer", "c", str(other), "0"), "r+b") as f:
        f.write(b"\xff" * 16)
    assert main(["inspect", "--verify", copy, "--quiet"]) == 1
    out = capsys.readouterr().out
    ids = list(as_text(g["source"][:]))
    for i in range(4 * blk, 4 * blk + 4):
        assert (f"DAMAGED sample {i} ({ids[i]}): box digest mismatch" in out) == bool(has_box[i]), (
            out
        )
    for i in range(4 * other, 4 * other + 4):
        assert f"DAMAGED sample {i} ({ids[i]}): answer unreadable" in out, out
    assert "checksum DOES NOT match the marker: DAMAGED" in out
    # a run reads its references checked too: planning the questions refuses the damaged box, naming
    # it
    from cryocube.cube import DamagedCubeError
    from cryocube.questions.ask import questions
    from cryocube.questions.tasks import select

    first = 4 * blk + int(np.flatnonzero(has_box[4 * blk : 4 * blk + 4])[0])
    with pytest.raises(
        DamagedCubeError,
        match=rf"sample {first} \(source {ids[first]}\): its box does not match the digest",
    ):
        questions(copy, select(None))
    # an altered value (no missing chunk) is named too, and nothing else is
    fine = str(tmp_path / "altered.zarr")
    shutil.copytree(url, fine)
    k = int(np.flatnonzero(has_box)[0])
    h = store.open_group(fine, "r+")
    h["box"][k, 2] = float(box[k, 2]) + 1.0
    assert main(["inspect", "--verify", fine, "--quiet"]) == 1
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("DAMAGED")]
    assert lines == [f"DAMAGED sample {k} ({ids[k]}): box digest mismatch"]
    # one flipped pixel of a deformation mask (the segmentation family's target) is named, and
    # read_dense refuses it
    from cryocube.cube import read_dense

    flipped = str(tmp_path / "mask.zarr")
    shutil.copytree(url, flipped)
    h = store.open_group(flipped, "r+")
    h["mask"][k, 0, 0] = 1 - int(h["mask"][k, 0, 0]) if int(h["mask"][k, 0, 0]) >= 0 else 0
    assert main(["inspect", "--verify", flipped, "--quiet"]) == 1
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("DAMAGED")]
    assert lines == [f"DAMAGED sample {k} ({ids[k]}): mask digest mismatch"]
    with pytest.raises(
        DamagedCubeError,
        match=rf"sample {k} \(source {ids[k]}\): its mask does not match the digest",
    ):
        read_dense(flipped, [k])
    read_dense(flipped, [i for i in range(len(ids)) if i != k])  # the other samples still read


def test_resume_redoes_only_missing_blocks_and_gives_the_same_cube(geotiff, tmp_path, client):
    m, url, first = geotiff
    import shutil

    import zarr

    copy = str(tmp_path / "resumed.zarr")
    shutil.copytree(url, copy)
    g = store.open_group(copy, "r+")
    g["progress"][1] = 0  # block 1 as a killed run leaves it: flag unset, pixels gone, no marker
    shutil.rmtree(os.path.join(copy, "image", "c", "5"))
    del g.attrs[COMPLETE_ATTR]
    zarr.consolidate_metadata(g.store)
    with pytest.raises(IncompleteCubeError):
        open_cube(copy)
    r = convert("insar", str(m.root), copy, client=client, block_samples=4, progress=False)
    assert (r.blocks_written, r.blocks_total) == (1, 3)
    assert r.marker["checksum"] == first.marker["checksum"]
    np.testing.assert_array_equal(open_cube(copy)["image"].values, open_cube(url)["image"].values)
    again = convert("insar", str(m.root), copy, client=client, block_samples=4, progress=False)
    assert again.blocks_written == 0  # complete: nothing to do


@pytest.mark.parametrize(
    "dataset,kinds",
    [
        ("insar", ("coherence_range", "missing_coherence")),
        ("hephaestus", ("heph_field", "heph_missing_coherence")),
    ],
)
def test_on_error_skip_leaves_bad_pairs_out_and_names_them(
    tmp_path, capsys, client, dataset, kinds
):
    """--on-error skip: the bad pairs (bad values found while labelling; a missing file found by the
    scan) are left out, counted and named in the cube's attrs and on screen; the good ones make the
    cube. The default still refuses.
    """
    m = make_interferograms(tmp_path / "raw", n=5, size=32, seed=1, dataset=dataset)
    bad = {m.pairs[i].id: corrupt_ifg(m, kind, index=i) for i, kind in zip((1, 3), kinds)}
    args = [
        "convert",
        dataset,
        "--raw",
        str(tmp_path / "raw"),
        "--out",
        str(tmp_path / "c.zarr"),
        "--quiet",
    ]
    # refused before any cluster (the default)
    assert main(args + ["--cluster", "tcp://127.0.0.1:9"]) == 2
    assert (
        not os.path.exists(tmp_path / "c.zarr")
        and len(capsys.readouterr().err.strip().splitlines()) == 1
    )
    assert main(args + ["--on-error", "skip", "--cluster", client.scheduler.address]) == 0
    out = capsys.readouterr().out
    assert "3 samples, wrote" in out and "skipped 2 bad samples" in out
    ds = open_cube(str(tmp_path / "c.zarr"))
    good = [p.id for k, p in enumerate(m.pairs) if k not in (1, 3)]
    assert list(as_text(ds["source"].values)) == good
    skipped = ds.attrs["skipped_samples"]
    assert sorted(d["source"] for d in skipped) == sorted(bad), skipped
    for d in skipped:
        assert (
            os.path.basename(bad[d["source"]]) in d["reason"] or bad[d["source"]] in d["reason"]
        ), d
        assert f"skipped {d['source']}: {d['reason']}" in out
    if dataset == "insar":  # the kept pairs are labelled as they would be without the bad ones
        truth = {p.id: p for p in m.pairs}
        assert [int(v) for v in ds["target"].values[:, 0]] == [
            truth[i].coherence_class for i in good
        ]
    assert main(["inspect", "--verify", str(tmp_path / "c.zarr"), "--quiet"]) == 0
    assert "0 damaged, checksum matches" in capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "c.zarr")]) == 0
    assert "skipped 2 samples for bad input" in capsys.readouterr().out


def test_without_unwrapped_phase_fringes_are_unavailable_and_boxes_come_from_annotations(
    tmp_path, client
):
    # <frame>/<pair>/ folders
    m = make_interferograms(tmp_path / "raw", n=6, size=48, seed=4, unwrapped=False, frames=2)
    url = str(tmp_path / "c.zarr")
    convert("insar", str(tmp_path / "raw"), url, client=client, progress=False)
    ds = open_cube(url)
    assert list(as_text(ds["source"].values)) == [p.id for p in m.pairs] and m.pairs[
        0
    ].id.startswith("frame00/")
    assert sorted(set(as_text(ds["frame"].values))) == ["frame00", "frame01"]
    assert [str(b) for b in ds["band"].values] == ["wrapped_phase", "coherence"] and ds[
        "image"
    ].shape[1] == 2
    assert np.isnan(ds["target"].values[:, 1]).all()
    assert "unwrapped" in ds.attrs["unavailable"]["fringe_counting"]
    for i, p in enumerate(m.pairs):
        assert ds["target"].values[i, 0] == p.coherence_class
        assert str(ds["box_origin"].values[i]) == "annotation"
        if p.box is None:
            assert np.isnan(ds["box"].values[i]).all()
        else:
            np.testing.assert_array_equal(ds["box"].values[i], p.box)


def test_hephaestus_layout_maps_annotations_onto_the_tasks(tmp_path, client):
    m = make_interferograms(tmp_path / "raw", n=8, size=48, seed=2, dataset="hephaestus")
    # an unlabelled interferogram
    extra = tmp_path / "raw" / m.pairs[0].frame / "interferograms" / "20210101_20210113"
    extra.mkdir()
    for f in ("InSAR.png", "Coherence.png"):
        (extra / f).write_bytes(
            open(m.pairs[0].paths["insar" if f == "InSAR.png" else "coherence"], "rb").read()
        )
    url = str(tmp_path / "h.zarr")
    convert("hephaestus", str(tmp_path / "raw"), url, client=client, progress=False)
    ds = open_cube(url)
    assert ds.attrs["rendered"] is True and ds.attrs["unlabelled_pairs"] == 1
    assert list(as_text(ds["source"].values)) == [p.id for p in m.pairs]
    assert [str(b) for b in ds["band"].values] == [
        "insar_r",
        "insar_g",
        "insar_b",
        "coherence_grey",
    ]
    tasks = list(as_text(ds["task"].values))
    t = ds["target"].values
    assert np.isnan(t[:, tasks.index("coherence_classification")]).all()
    assert np.isnan(t[:, tasks.index("fringe_counting")]).all()
    un = ds.attrs["unavailable"]
    assert (
        "unwrapped" in un["fringe_counting"] and "low_coherence" in un["coherence_classification"]
    )
    ans = as_text(ds["answer"].values)
    for i, p in enumerate(m.pairs):
        ann = json.load(open(p.paths["annotation"]))
        assert (
            t[i, tasks.index("low_coherence")]
            == ann["low_coherence"]
            == int(p.coherence_class == 0)
        )
        assert t[i, tasks.index("atmospheric_fringes")] == p.atmosphere_level
        assert t[i, tasks.index("deformation")] == (p.source != "none")
        if p.box is None:
            assert np.isnan(ds["box"].values[i]).all() and ans[i, 0] == ""
        else:
            np.testing.assert_array_equal(ds["box"].values[i], p.box)
            assert ans[i, 0].startswith(("Mogi", "Earthquake"))
        assert ans[i, 1] == ann["caption"] != ""
        np.testing.assert_array_equal(ds["image"].values[i, :3], render_phase(p.wrapped))
        np.testing.assert_array_equal(ds["image"].values[i, 3], np.rint(p.coherence * 255))


def test_rules_come_from_the_catalog_and_are_checked():
    r = open_reader(load_dataset("insar"), "geotiff")
    assert r.rules == Rules(coherence_thresholds=(0.3, 0.6))
    with pytest.raises(Exception, match="ascending thresholds"):
        Rules.from_options({"coherence_classification": {"thresholds": [0.6, 0.3]}}, "x.yaml")


BAD = [
    ("insar", "phase_range", "outside [-pi, pi]"),
    ("insar", "phase_degrees", "looks like degrees"),
    ("insar", "coherence_range", "outside [0, 1]"),
    ("insar", "missing_coherence", "has no coherence.tif"),
    ("insar", "shape_mismatch", "px, but"),
    ("insar", "crs_mismatch", "CRS"),
    ("insar", "missing_unwrapped", "give it to every pair or to none"),
    ("insar", "annotation_pair", "names pair '19990101_19990113'"),
    ("insar", "annotation_answer", "not text tasks"),
    ("insar", "annotation_box", "lies outside"),
    ("hephaestus", "heph_missing_pair", "names pair"),
    ("hephaestus", "heph_missing_coherence", "has no Coherence.png"),
    ("hephaestus", "heph_field", "'atmospheric_fringes' must be an integer 0..3"),
    ("insar", "bad_date", "'20201301' is not a date (there is no month 13)"),
    ("hephaestus", "heph_bad_date", "'20210230' is not a date (February 2021 has no day 30)"),
]


@pytest.mark.parametrize("dataset,kind,words", BAD, ids=[b[1] for b in BAD])
def test_bad_input_is_one_sentence_before_any_cluster(tmp_path, capsys, dataset, kind, words):
    m = make_interferograms(tmp_path / "raw", n=4, size=32, seed=1, dataset=dataset)
    bad = corrupt_ifg(m, kind)
    # an unreachable scheduler: had the check come after the cluster, the error would be about the
    # connection
    rc = main(
        [
            "convert",
            dataset,
            "--raw",
            str(tmp_path / "raw"),
            "--out",
            str(tmp_path / "c.zarr"),
            "--cluster",
            "tcp://127.0.0.1:9",
            "--quiet",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and words in err, err
    assert os.path.basename(bad) in err or bad in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not os.path.exists(tmp_path / "c.zarr")


def test_pairs_of_different_sizes_are_padded_and_say_their_extent(tmp_path):
    """Hephaestus frames differ in size: smaller interferograms are padded with 0, height/width keep
    their extent."""
    from PIL import Image

    m = make_interferograms(tmp_path / "raw", n=3, size=40, seed=5, dataset="hephaestus")
    # a cropped box would (rightly) be refused as outside the image
    small = next(p for p in m.pairs if p.box is None)
    for k in ("insar", "coherence"):
        Image.open(small.paths[k]).crop((0, 0, 30, 25)).save(small.paths[k])  # 30 wide, 25 high
    r = open_reader(load_dataset("hephaestus"), "hephaestus")
    pairs, plan = r.plan(str(tmp_path / "raw"))
    assert plan.shape == (4, 40, 40)
    i = plan.ids.index(small.id)
    assert plan.coords["height"][1][i] == 25 and plan.coords["width"][1][i] == 30
    img = r.read_sample(pairs[i], plan.shape)
    assert img.shape == (4, 40, 40) and (img[:, 25:] == 0).all() and (img[:, :, 30:] == 0).all()
    np.testing.assert_array_equal(img[:3, :25, :30], render_phase(small.wrapped)[:, :25, :30])


def test_an_impossible_date_is_skipped_and_named_with_on_error_skip(tmp_path, capsys, client):
    m = make_interferograms(tmp_path / "raw", n=4, size=32, seed=1, dataset="hephaestus")
    bad = corrupt_ifg(m, "heph_bad_date", index=2)
    args = [
        "convert",
        "hephaestus",
        "--raw",
        str(tmp_path / "raw"),
        "--out",
        str(tmp_path / "c.zarr"),
        "--quiet",
        "--on-error",
        "skip",
        "--cluster",
        client.scheduler.address,
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    pair = f"{m.pairs[2].frame}/{os.path.basename(bad)}"
    assert (
        "3 samples, wrote" in out and "skipped 1 bad samples" in out and f"skipped {pair}: " in out
    )
    ds = open_cube(str(tmp_path / "c.zarr"))
    (d,) = ds.attrs["skipped_samples"]
    assert d["source"] == pair and "February 2021 has no day 30" in d["reason"]
    assert ds.attrs["unlabelled_pairs"] == 0  # its annotation was not counted as a pair without one


def test_flagged_hephaestus_samples_are_left_out_unless_kept(tmp_path, capsys, client):
    """`corrupted: 1` / `processing_error: 1` annotations: left out, counted on screen and in
    skipped_samples; with --keep-corrupted they stay and the cube lists them as kept. Another layout
    refuses the option.
    """
    from cryocube.insar_synthetic import _annotation

    m = make_interferograms(tmp_path / "raw", n=5, size=32, seed=3, dataset="hephaestus")
    _annotation(m, m.pairs[1], corrupted=1)
    _annotation(m, m.pairs[3], processing_error=True)
    base = [
        "convert",
        "hephaestus",
        "--raw",
        str(tmp_path / "raw"),
        "--quiet",
        "--cluster",
        client.scheduler.address,
    ]
    assert main(base + ["--out", str(tmp_path / "a.zarr")]) == 0
    out = capsys.readouterr().out
    assert "3 samples, wrote" in out and "skipped 2 bad samples" in out
    assert (
        f"skipped {m.pairs[1].id}: " in out
        and "corrupted: 1" in out
        and "processing_error: 1" in out
    )
    ds = open_cube(str(tmp_path / "a.zarr"))
    assert list(as_text(ds["source"].values)) == [
        p.id for k, p in enumerate(m.pairs) if k not in (1, 3)
    ]
    assert sorted(d["source"] for d in ds.attrs["skipped_samples"]) == sorted(
        [m.pairs[1].id, m.pairs[3].id]
    )
    assert ds.attrs["unlabelled_pairs"] == 0 and ds.attrs["kept_flagged_samples"] == []
    assert ds.attrs["flagged_samples"].startswith("left out")
    assert main(base + ["--out", str(tmp_path / "k.zarr"), "--keep-corrupted"]) == 0
    out = capsys.readouterr().out
    assert (
        "5 samples, wrote" in out
        and "kept 2 samples the annotations flag (corrupted, processing_error)" in out
    )
    kd = open_cube(str(tmp_path / "k.zarr"))
    assert (
        len(kd["source"]) == 5
        and kd.attrs["skipped_samples"] == []
        and kd.attrs["flagged_samples"].startswith("kept")
    )
    assert {d["source"]: d["flags"] for d in kd.attrs["kept_flagged_samples"]} == {
        m.pairs[1].id: ["corrupted"],
        m.pairs[3].id: ["processing_error"],
    }
    # a flag that is not 0/1 is one sentence naming the file; the option on a layout without flags
    # is refused
    _annotation(m, m.pairs[0], corrupted="maybe")
    assert main(base + ["--out", str(tmp_path / "b.zarr")]) == 2
    assert "field 'corrupted' must be an integer 0..1, got 'maybe'" in capsys.readouterr().err
    make_interferograms(tmp_path / "g", n=2, size=32, seed=3)
    assert (
        main(
            [
                "convert",
                "insar",
                "--raw",
                str(tmp_path / "g"),
                "--out",
                str(tmp_path / "g.zarr"),
                "--keep-corrupted",
                "--cluster",
                "tcp://127.0.0.1:9",
                "--quiet",
            ]
        )
        == 2
    )
    assert "--keep-corrupted: the insar layout" in capsys.readouterr().err


def test_a_hephaestus_cube_asks_its_own_annotations(tmp_path, client):
    """The Hephaestus task file's tasks find their references in the cube (targets and answers,
    digested like every per-sample variable); an insar cube is not asked them."""
    from cryocube.questions.ask import questions
    from cryocube.questions.tasks import select

    m = make_interferograms(tmp_path / "raw", n=6, size=32, seed=2, dataset="hephaestus")
    two = next(i for i, p in enumerate(m.pairs) if p.source != "none")
    # two types: no deformation-type reference for it
    _heph_label(m.pairs[two], label=["Mogi", "Sill"])
    url = str(tmp_path / "h.zarr")
    convert("hephaestus", str(tmp_path / "raw"), url, client=client, progress=False)
    tasks = select(None, "samples", "hephaestus")
    qs, left_out = questions(url, tasks)
    by = {(q.sample, q.task, q.variant): dict(q.refs) for q in qs}
    for i, p in enumerate(m.pairs):
        ann = json.load(open(p.paths["annotation"]))
        assert (
            by[(i, "deformation", 0)]
            == by[(i, "deformation", 1)]
            == {"accuracy": "yes" if p.source != "none" else "no"}
        )
        assert by[(i, "low_coherence", 0)] == {"accuracy": "yes" if ann["low_coherence"] else "no"}
        assert by[(i, "atmospheric_fringes", 0)] == {"mae": float(p.atmosphere_level)}
        assert by[(i, "intensity", 0)] == {"accuracy": ann["intensity_level"][0].lower()}
        assert by[(i, "caption", 0)] == {"token_f1": ann["caption"]}
        want = (
            None
            if i == two
            else {"mogi": "mogi", "dislocation": "earthquake", "none": "none"}[p.source]
        )
        assert by.get((i, "deformation_type", 0), {}).get("accuracy") == want
    assert "deformation" not in left_out and not any(
        t in left_out for t in ("caption", "intensity", "deformation_type")
    )
    mc = next(q for q in qs if q.task == "deformation" and q.variant == 1)
    assert "A. no; B. yes" in mc.prompt
    assert [t.name for t in select(None, "samples", "insar")] == [
        "coherence_classification",
        "fringe_counting",
        "deformation_localization",
        "noise_assessment",
    ]
    # a label outside the catalog's classes is one sentence naming the file and field
    _heph_label(m.pairs[1], label=["Caldera collapse"])
    with pytest.raises(
        Exception, match=r"field 'label' has 'Caldera collapse', which is none of the classes"
    ):
        open_reader(load_dataset("hephaestus"), "hephaestus").plan(str(tmp_path / "raw"))


def _heph_label(p, **fields):
    d = json.load(open(p.paths["annotation"]))
    d.update(fields)
    json.dump(d, open(p.paths["annotation"], "w"))
