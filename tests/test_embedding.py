"""The embedding family end to end: the SSL4EO-downstream challenge layout -> a sample cube, `embed`
(encoders and the organisers' baselines, on workers and in one process), submission CSVs, `probe`
(NeuCo-Bench on Dask), `evaluate --protocol probe` and the report's probe-vs-segmentation table."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from cryocube.cli import main
from cryocube.convert.writer import convert
from cryocube.cube import DamagedCubeError, cube_info, open_cube, read_samples
from cryocube.embeddings.embed import embed, load_embeddings
from cryocube.embeddings.submission import (
    SubmissionError,
    read_submission,
    write_submission,
)
from cryocube.errors import UserError
from cryocube.families.embedding.probe import probe_recipe, tasks_from_cube
from cryocube.families.embedding.work import probe_embeddings
from cryocube.synthetic import make_raw, make_samples

FAST = {"epochs": 30, "lr": 1e-2}


@pytest.fixture(scope="module")
def ssl(tmp_path_factory, client):
    root = tmp_path_factory.mktemp("ssl4eo")
    m = make_samples("ssl4eo-downstream", root / "raw", n=60, size=8, seed=3)
    convert(
        "ssl4eo-downstream",
        str(root / "raw"),
        str(root / "cube.zarr"),
        client=client,
        progress=False,
    )
    return m, root, str(root / "cube.zarr")


def test_converter_reads_the_challenge_layout(ssl, client):
    m, root, url = ssl
    assert sorted(os.listdir(root / "raw" / "data")) == ["s1", "s2l1c", "s2l2a"]
    assert any(
        p.endswith(".zarr.zip") for _, _, fs in os.walk(root / "raw" / "data" / "s1") for p in fs
    )
    info = cube_info(url)
    assert info.kind == "samples" and info.time == ("spring", "summer", "fall", "winter")
    assert dict(info.tasks) == {"cloudy": "cls", "noise": "regr", "water_fraction": "regr"}
    ds = open_cube(url)
    assert ds["image"].dims == ("sample", "time", "band", "y", "x") and ds["image"].shape == (
        60,
        4,
        27,
        8,
        8,
    )
    ids = [str(i) for i in ds["source"].values]
    assert sorted(ids) == sorted(m.ids)
    k = ids.index(m.ids[0])
    # the modalities side by side in catalog band order (the challenge files hold S2 as uint16, S1
    # as float16)
    np.testing.assert_array_equal(
        ds["image"].values[k, :, 2:], m.images[m.ids[0]][:, 2:].astype(np.uint16)
    )
    np.testing.assert_array_equal(
        ds["image"].values[k, :, :2], m.images[m.ids[0]][:, :2].astype(np.float16)
    )
    px = ds["image"].values.astype(np.float64)
    # every season's pixels
    np.testing.assert_allclose(ds["band_mean"].values, px.mean(axis=(0, 1, 3, 4)), rtol=1e-9)
    np.testing.assert_allclose(ds["band_std"].values, px.std(axis=(0, 1, 3, 4)), rtol=1e-6)
    tasks = [str(t) for t in ds["task"].values]
    wf = ds["target"].values[:, tasks.index("water_fraction")]
    unlabelled = [i for i in m.ids if i not in m.tasks["water_fraction"][1]]
    # empty CSV labels stay missing
    assert unlabelled and all(np.isnan(wf[ids.index(i)]) for i in unlabelled)
    got = {ids[i]: float(v) for i, v in enumerate(wf) if np.isfinite(v)}
    assert got == pytest.approx(m.tasks["water_fraction"][1])
    assert ds.attrs["published_statistics"].startswith("raw")
    # the offset option: S2 + 1000, S1 untouched, the v1.1 statistics become the published ones
    shifted = str(root / "shifted.zarr")
    assert (
        main(
            [
                "convert",
                "ssl4eo-downstream",
                "--raw",
                str(root / "raw"),
                "--out",
                shifted,
                "--shift-s2",
                "--quiet",
                "--cluster",
                client.scheduler.address,
            ]
        )
        == 0
    )
    sh = open_cube(shifted)
    np.testing.assert_allclose(
        sh["image"].values[:, :, 2:], ds["image"].values[:, :, 2:] + 1000.0, rtol=1e-6
    )
    np.testing.assert_array_equal(sh["image"].values[:, :, :2], ds["image"].values[:, :, :2])
    # s2l1c_B01 of SSL4EO-S12 v1.1
    assert float(sh["published_mean"].values[2]) == pytest.approx(2607.345)
    assert float(ds["published_mean"].values[2]) == pytest.approx(1635.299)


def test_an_ssl4eo_cube_reads_the_declared_defaults(ssl):
    """A sample cube without interferogram facts: its typed view gives each declared variable's
    default, no box."""
    from cryocube.cube import SampleCube, open_view

    _, _, url = ssl
    view = open_view(url)
    assert isinstance(view, SampleCube) and view.n == 60 and view.tasks
    assert set(view.values("primary_date")) == {"?"} and set(view.values("frame")) == {""}
    assert list(view.values("task_classes")) == [""] * len(view.tasks)
    assert np.isnan(view.values("radar_wavelength_m")).all() and set(view.values("height")) == {
        view.size[0]
    }
    assert view.checked("box") is None and len(view.values("text_task")) == 0
    assert view.checked("target").shape == (60, len(view.tasks))


def test_a_damaged_sample_cube_is_refused(ssl, tmp_path):
    import shutil

    _, _, url = ssl
    bad = str(tmp_path / "bad.zarr")
    shutil.copytree(url, bad)
    chunk = next(p for p in (tmp_path / "bad.zarr" / "image" / "c").rglob("*") if p.is_file())
    chunk.unlink()
    with pytest.raises(DamagedCubeError, match="sample"):
        read_samples(bad, np.arange(60), labels=False)


def test_embed_on_workers_equals_embed_in_one_process(ssl, client, tmp_path, embedding_plan):
    _, _, url = ssl
    cube = cube_info(url)
    spec, prov = embedding_plan(
        "ssl4eo_moco",
        cube,
        dim=16,
        ctx={"allow_random_weights": True},
        input_size=16,
        block_samples=16,
    )
    a = embed(spec, cube, str(tmp_path / "a.zarr"), client=client, progress=False, provenance=prov)
    b = embed(spec, cube, str(tmp_path / "b.zarr"), client=None, progress=False, provenance=prov)
    ia, xa, sa, attrs = load_embeddings(a.url)
    ib, xb, _, _ = load_embeddings(b.url)
    assert ia == ib and xa.shape == (60, 16) and set(sa) == {"all"}
    np.testing.assert_allclose(xa, xb, rtol=1e-4, atol=1e-5)
    # provenance: what made the vectors, and the PCA (fitted on all samples: the challenge cube has
    # no train split)
    assert (
        attrs["weights"]["random_init"]
        and attrs["precision"]["effective"] == spec.encoder.precision
    )
    assert attrs["pca"]["fitted_on"] == "all" and attrs["cube"]["checksum"] == cube.checksum
    assert attrs["pooled_width"] > 16  # the concatenated levels, before PCA
    again = embed(spec, cube, a.url, client=client, progress=False, provenance=prov)
    assert again.blocks_run == 0  # complete store of the same inputs: reused


def test_organisers_mean_baseline_layout(ssl, tmp_path, embedding_plan):
    """Season, then channel group, then y, x (8 x 8 from 8 x 8 pixels is the identity
    resampling)."""
    m, _, url = ssl
    cube = cube_info(url)
    spec, _ = embedding_plan("mean", cube)
    assert spec.grid == 8 and len(spec.groups) == 4
    r = embed(spec, cube, str(tmp_path / "mean.zarr"), progress=False)
    ids, X, _, _ = load_embeddings(r.url)
    assert X.shape == (60, 1024)
    img = m.images[ids[0]].astype(np.float64)
    mean, std = cube.published_mean, cube.published_std
    z = (img - mean[None, :, None, None]) / std[None, :, None, None]
    s1 = z[:, [0, 1]].mean(axis=1)  # group 4: S1 VV + VH
    np.testing.assert_allclose(X[0].reshape(4, 4, 8, 8)[:, 3], s1, rtol=1e-3, atol=1e-3)
    assert not np.allclose(X[0].reshape(4, 4, 8, 8)[:, 0], s1)


def test_planted_signal_scores_high_and_random_vectors_near_zero(tmp_path, client):
    """Through the CLI on a submission CSV and a NeuCo-Bench labels folder."""
    rng = np.random.default_rng(0)
    n, d = 400, 64
    ids = [f"loc{i:04d}" for i in range(n)]
    y = rng.normal(size=n)
    X = rng.normal(size=(n, d)).astype(np.float32)
    X[:, :8] += 3 * y[:, None]  # the planted signal, linear in the vectors
    write_submission(tmp_path / "planted.csv", ids, X)
    write_submission(tmp_path / "random.csv", ids, rng.normal(size=(n, d)).astype(np.float32))
    (tmp_path / "labels").mkdir()
    with open(tmp_path / "labels" / "signal__regr.csv", "w") as f:
        f.write("id,label\n" + "".join(f"{i}.zarr.zip,{float(v)!r}\n" for i, v in zip(ids, y)))
    q = {}
    for name in ("planted", "random"):
        out = tmp_path / f"out-{name}"
        rc = main(
            [
                "probe",
                str(tmp_path / f"{name}.csv"),
                "--labels",
                str(tmp_path / "labels"),
                "--out",
                str(out),
                "--k",
                "4",
                "--set",
                "epochs=20",
                "--set",
                "lr=1e-2",
                "--quiet",
                "--cluster",
                client.scheduler.address,
            ]
        )
        rec = json.loads((out / "results.jsonl").read_text().splitlines()[-1])
        run = out / "runs" / rec["run_id"]  # NeuCo-Bench's files, in the run's own folder
        assert rec["summary_file"] == str(run / "results_summary.json")
        summary = json.loads((run / "results_summary.json").read_text())
        per = json.loads((run / "signal__regr" / "signal__regr_result.json").read_text())
        assert set(per) >= {"q_stat", "mean_score", "std_dev"} and len(per["q_t"]) == 4
        q[name] = summary["overall_q_score"]
        if name == "planted":
            assert rc == 0
        assert rec["family"] == "embedding" and rec["metrics"]["Q"] == pytest.approx(
            summary["overall_q_score"], nan_ok=True
        )
    assert q["planted"] > 20  # R^2 near 1 with a small spread
    assert q["random"] < 5  # R^2 <= 0 on unseen rows: Q near zero or below


def test_submission_csv_round_trip_and_rejections(ssl, tmp_path, client):
    _, _, url = ssl
    csv = tmp_path / "sub.csv"
    assert (
        main(
            [
                "embed",
                "random",
                "--cube",
                url,
                "--out",
                str(csv),
                "--format",
                "csv",
                "--dim",
                "1024",
                "--quiet",
                "--cluster",
                client.scheduler.address,
            ]
        )
        == 0
    )
    ids, X, _ = read_submission(csv, [str(i) for i in open_cube(url)["source"].values], 1024)
    _, E, _, attrs = load_embeddings(str(tmp_path / "sub.zarr"))
    np.testing.assert_array_equal(X, E)
    assert attrs["baseline"] == "random" and X.shape == (60, 1024)
    lines = csv.read_text().splitlines()
    (tmp_path / "short.csv").write_text("\n".join(line.rsplit(",", 1)[0] for line in lines) + "\n")
    with pytest.raises(SubmissionError, match="1024"):
        read_submission(tmp_path / "short.csv", None, 1024)
    with pytest.raises(SubmissionError):
        read_submission(csv, ids + ["missing-location"], 1024)
    parts = lines[2].split(",")
    parts[1] = "nan"
    (tmp_path / "nan.csv").write_text("\n".join(lines[:2] + [",".join(parts)] + lines[3:]) + "\n")
    with pytest.raises(SubmissionError):
        read_submission(tmp_path / "nan.csv", None, 1024)


def test_probe_refuses_labels_without_vectors_before_any_probe(ssl, tmp_path):
    _, _, url = ssl
    rng = np.random.default_rng(1)
    write_submission(
        tmp_path / "few.csv", ["a", "b", "c"], rng.normal(size=(3, 8)).astype(np.float32)
    )
    with pytest.raises(UserError, match="have no embedding"):
        probe_embeddings(
            str(tmp_path / "few.csv"), str(tmp_path / "o"), probe_recipe(), tasks_from=url
        )
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "probe,sets,words",
    [
        ("linear", {"nosuch": 1}, "has no field 'nosuch'"),
        ("linear", {"epochs": -1}, "epochs must be an integer >= 1"),
        ("linear", {"lr": 0}, "lr must be a number > 0"),
        ("knn", {"knn_k": 0}, "knn_k must be an integer >= 1"),
        ("knn", {"epochs": 5}, "the knn probe has no field 'epochs'"),  # not silently dropped
    ],
)
def test_probe_fields_are_checked_in_one_sentence(probe, sets, words):
    with pytest.raises(UserError, match=words):
        probe_recipe(probe, 10, sets)


def test_embed_takes_the_recipes_checkpoint_as_evaluate_does(ssl, tmp_path, embedding_plan):
    """The refusal says `--set encoder_weights={model: PATH}` works: it must, for embed too."""
    import torch

    _, _, url = ssl
    cube = cube_info(url)
    ckpt = tmp_path / "moco.pt"
    torch.save({}, ckpt)
    spec, prov = embedding_plan(
        "ssl4eo_moco", cube, input_size=16, encoder_weights={"ssl4eo_moco": str(ckpt)}
    )
    assert spec.encoder.weights == str(ckpt) and not prov["weights"]["random_init"]


def test_a_sample_cube_cannot_be_segmented(ssl, tmp_path):
    _, _, url = ssl
    rc = main(["evaluate", "--cubes", url, "--models", "unet", "--out", str(tmp_path), "--dry-run"])
    assert rc == 2


def test_evaluate_probe_protocol_and_report(tmp_path, client):
    """Tile cube: tasks derived from class presence/fraction; probe Q next to frozen mIoU in the
    report."""
    from cryocube.engine.evaluate import evaluate
    from cryocube.families import RunSpec
    from cryocube.families.recipes import load_recipe
    from cryocube.pages import build_report

    make_raw("gld", tmp_path / "raw", n={"train": 24, "val": 4, "test": 4}, seed=2)
    url = str(tmp_path / "gld.zarr")
    convert("gld", str(tmp_path / "raw"), url, client=client, tile_size=32, progress=False)
    names = [t.name for t in tasks_from_cube(url)]
    assert any(n.endswith("_fraction__regr") for n in names) and all("__" in n for n in names)
    recipe = load_recipe(
        None,
        [
            "epochs=2",
            "input_size=32",
            "decoder_channels=16",
            "val_every=1",
            "batch_size=8",
            "crops_per_sample=1",
            "normalization=cube",
        ],
    )
    runs = [
        RunSpec(m, url, "probe", overrides=(("k", 3), ("epochs", 5)))
        for m in ["ssl4eo_moco", "ssl4eo_dino", "mean"]
    ]
    runs += [RunSpec(m, url, "frozen") for m in ["ssl4eo_moco", "ssl4eo_dino"]]
    res = evaluate(
        runs,
        str(tmp_path / "results"),
        recipe,
        client=client,
        progress=False,
        allow_random_weights=True,
    )
    assert all(r["status"] == "ok" for r in res.records), [r.get("error") for r in res.records]
    probes = [r for r in res.records if r["family"] == "embedding"]
    assert len(probes) == 3 and all(math.isfinite(r["metrics"]["Q"]) for r in probes)
    r0 = probes[0]
    summary = json.loads(open(r0["summary_file"]).read())
    assert summary["overall_q_score"] == pytest.approx(r0["metrics"]["Q"])
    assert r0["embedding"]["sha256"] and r0["weights"]["random_init"]
    # the same runs again: cached by content hash
    again = evaluate(
        runs,
        str(tmp_path / "results"),
        recipe,
        client=client,
        progress=False,
        allow_random_weights=True,
    )
    assert len(again.skipped) == len(runs) and not again.records
    rep = build_report([str(tmp_path / "results")], str(tmp_path / "report"), formats=["md", "csv"])
    lb = rep.tables["embedding/embedding_leaderboard_gld"]
    assert len(lb.rows) == 3 and sorted(r[0] for r in lb.rows)[0] == 1
    # Q's interval over folds (the records keep their fold scores; docs/statistics.md)
    for row in lb.rows:
        lo, hi = row[lb.col("q_lo")], row[lb.col("q_hi")]
        assert math.isfinite(lo) and math.isfinite(hi) and lo <= hi
    pv = rep.tables["embedding/probe_vs_segmentation"]
    assert len(pv.rows) == 2 and "Spearman" in pv.notes[-1]
    assert "frozen" in rep.leaderboards  # segmentation runs still rank as before


def test_labelled_standardisation_is_the_same_on_workers_and_in_one_process(
    ssl, tmp_path, embedding_plan
):
    """`standardize: labelled` on the worker path (the matrix read from the store, as `evaluate
    --protocol probe` does) equals the in-process path, and differs from `all` when some rows are
    unlabelled.
    """
    from functools import reduce

    from cryocube.families.embedding.probe import (
        align,
        fold_tasks,
        merge,
        probe_fold,
        run_probes,
        task_scores,
    )

    _, _, url = ssl
    cube = cube_info(url)
    spec, prov = embedding_plan("random", cube, dim=16)
    res = embed(spec, cube, str(tmp_path / "r.zarr"), client=None, progress=False, provenance=prov)
    ids, X, _, attrs = load_embeddings(res.url)
    tasks = [t for t in tasks_from_cube(url) if t.name == "water_fraction__regr"]
    assert 0 < len(tasks[0].labels) < len(ids)  # some samples are unlabelled in this task
    scores = {}
    for mode in ("all", "labelled"):
        recipe = probe_recipe("linear", 3, {"epochs": 2}, standardize=mode)
        here = run_probes(X, ids, tasks, recipe, progress=False)
        folds = fold_tasks(
            align(ids, tasks), recipe, res.url, str(attrs.get("embedding_sha256", ""))[:16]
        )
        there = task_scores(reduce(merge, [probe_fold(f) for f in folds]))
        assert here == there, mode
        scores[mode] = here
    assert scores["all"] != scores["labelled"]


def test_embed_and_evaluate_use_one_band_rule_on_a_sar_only_cube(tmp_path, client, embedding_plan):
    """A SAR-only cube (CaFFe) and every optical-only encoder of Cryo-Bench's grid: `embed` follows
    the cross-sensor rule as `evaluate` does (was: refused, "cannot take any band"), feeding the
    same cube bands to the same slots.
    """
    from cryocube.convert.writer import convert
    from cryocube.cube import cube_info
    from cryocube.engine.plan import plan_runs
    from cryocube.families import PlanContext, RunSpec
    from cryocube.families.recipes import load_recipe
    from cryocube.synthetic import make_raw

    m = make_raw("caffe", tmp_path / "raw", n={"train": 2, "val": 1, "test": 1}, seed=3)
    url = str(tmp_path / "caffe.zarr")
    convert(
        "caffe", str(tmp_path / "raw"), url, client=client, tile_size=m.tile_size, progress=False
    )
    cube = cube_info(url)
    assert not any(b.role == "optical" for b in cube.bands)
    ctx = PlanContext(out=str(tmp_path / "res"), allow_random_weights=True)
    for model in ("remoteclip", "ssl4eo_moco", "vit_scratch", "scalemae"):
        spec, prov = embedding_plan(model, cube, ctx={"allow_random_weights": True})
        seg = plan_runs([RunSpec(model, url)], load_recipe(None, []), ctx)[0].record
        assert spec.encoder.rule == seg["band_rule"] == "cross_sensor", model
        assert list(spec.inputs.index) == seg["band_index"], model
        assert prov["band_mode"].startswith("cross_sensor: "), prov["band_mode"]
