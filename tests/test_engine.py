"""`evaluate` end to end on generated cubes with a LocalCluster of 2 worker processes."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
import torch
import zarr

from cryocube import store
from cryocube.convert.writer import convert
from cryocube.cube import COMPLETE_ATTR, IncompleteCubeError
from cryocube.engine.evaluate import evaluate
from cryocube.engine.plan import runs_from_grid
from cryocube.errors import UserError
from cryocube.families import RunSpec
from cryocube.families.recipes import load_recipe
from cryocube.families.segmentation.metrics import confusion_matrix, metrics_from_confusion
from cryocube.record import read_results
from cryocube.synthetic import make_raw

FAST = [
    "epochs=4",
    "decoder_channels=32",
    "input_size=32",
    "val_every=2",
    "crops_per_sample=2",
    "batch_size=4",
    "normalization=cube",
]


def load_config(path=None, sets=()):
    return load_recipe(path, list(sets))


def ev(runs, out, cfg, client, **kw):
    return evaluate(
        runs, str(out), cfg, client=client, progress=False, allow_random_weights=True, **kw
    )


@pytest.fixture(scope="module")
def cubes(tmp_path_factory, client):
    root = tmp_path_factory.mktemp("cubes")
    out = {}
    for ds, n in (
        ("glid", {"train": 16, "val": 4, "test": 4}),
        ("caffe", {"train": 3, "val": 1, "test": 1}),
    ):
        m = make_raw(ds, root / "raw" / ds, n=n, seed=11)
        out[ds] = str(root / f"{ds}.zarr")
        convert(
            ds,
            str(root / "raw" / ds),
            out[ds],
            client=client,
            tile_size=m.tile_size,
            progress=False,
        )
    return out


def _cube_labels(url, samples):
    return np.asarray(
        store.open_group(url, "r")["label"].get_orthogonal_selection((np.asarray(samples),))
    )


def test_protocols_and_learning(tmp_path, client, cubes):
    """Every protocol produces a record; U-Net learns the lakes far above chance."""
    cfg = load_config(None, FAST)
    runs = [
        RunSpec("unet", cubes["glid"], "frozen"),  # scratch baseline: trained end to end
        RunSpec("ssl4eo_moco", cubes["glid"], "frozen"),
        RunSpec("ssl4eo_moco", cubes["glid"], "fewshot", fraction=0.5),
        RunSpec("ssl4eo_moco", cubes["glid"], "finetune"),
        RunSpec("ssl4eo_moco", cubes["caffe"], "cross_sensor"),
    ]
    res = ev(runs, str(tmp_path), cfg.replace(epochs=6), client)
    recs = {(r["model"], r["protocol"], r["dataset"]): r for r in res.records}
    assert all(r["status"] == "ok" for r in res.records), [r.get("error") for r in res.records]
    assert len(recs) == 5
    unet = recs[("unet", "frozen", "glid")]
    # chance is ~50 on two balanced classes
    assert unet["trains_encoder"] and unet["metrics"]["mIoU"] > 75
    few = recs[("ssl4eo_moco", "fewshot", "glid")]
    assert few["subset"] and len(few["subset"]) < 16 and few["fraction"] == 0.5
    assert recs[("ssl4eo_moco", "cross_sensor", "caffe")]["band_rule"] == "cross_sensor"
    assert recs[("ssl4eo_moco", "finetune", "glid")]["trains_encoder"]
    for r in res.records:
        assert (
            {"mIoU", "mF1", "oAcc", "mAcc", "IoU"} <= set(r["metrics"])
            and r["val_curve"]
            and r["versions"]["torch"]
        )
        assert r["cube"]["checksum"] and r["samples_per_s"] > 0 and r["peak_memory_mb"] > 0
    assert len(read_results(str(tmp_path))) == 5 and (tmp_path / "results.parquet").exists()
    # the time budget each record carries (benchmarks/bench_reference.py prints it beside FLOP
    # counts)
    for r in res.records:
        ph = r["timings"]["fit_phases"]
        assert (
            ph["forward_s"] > 0
            and ph["backward_s"] > 0
            and ph["optimizer_s"] > 0
            and ph["checkpoint_write_s"] > 0
        )
        assert ph["validations"] == len(r["val_curve"]) and ph["validate_s"] > 0
        assert ph["forward_s"] + ph["backward_s"] + ph["validate_s"] <= r["timings"]["train_s"]
        if r["trains_encoder"]:
            assert "feature_phases" not in r["timings"]
        # the feature cache of this plan was built by this call: its reads, encoder time and writes
        else:
            fe = r["timings"]["feature_phases"]
            assert fe["encode_s"] > 0 and fe["read_s"] > 0 and fe["write_s"] > 0

    # the map-reduced confusion matrix equals one computed on the whole test split at once
    g = zarr.open_group(unet["predictions"], mode="r")
    preds, samples = np.asarray(g["pred"][:]), np.asarray(g["sample"][:])
    labels = _cube_labels(cubes["glid"], samples)
    whole = confusion_matrix(preds, labels, 2)
    np.testing.assert_array_equal(whole, np.asarray(unet["confusion_matrix"]))
    # and the metrics equal torchmetrics' on the same predictions
    from torchmetrics.classification import MulticlassF1Score, MulticlassJaccardIndex

    p, t = torch.from_numpy(preds.astype(np.int64)), torch.from_numpy(labels.astype(np.int64))
    iou = MulticlassJaccardIndex(2, average=None, ignore_index=-1)(p, t).numpy() * 100
    f1 = MulticlassF1Score(2, average=None, ignore_index=-1)(p, t).numpy() * 100
    np.testing.assert_allclose(
        [unet["metrics"]["IoU"][c] for c in ("background", "glacial_lake")], iou, rtol=1e-5
    )
    np.testing.assert_allclose(
        [unet["metrics"]["F1"][c] for c in ("background", "glacial_lake")], f1, rtol=1e-5
    )


def test_cache_determinism_and_resume(tmp_path, client, cubes):
    """Same seed -> same mIoU; finished runs are skipped; features are reused by new runs; a worker
    killed during training loses nothing."""
    cfg = load_config(None, FAST)
    run = [RunSpec("ssl4eo_mae_optical", cubes["glid"], "frozen", seed=0)]
    a = ev(run, str(tmp_path / "a"), cfg, client)
    assert a.records[0]["encoder_forward_items"] > 0
    again = ev(run, str(tmp_path / "a"), cfg, client)
    assert again.records == [] and again.skipped == [a.records[0]["run_id"]]
    # a new seed reuses the feature cache: the encoder runs on nothing
    s1 = ev(
        [RunSpec("ssl4eo_mae_optical", cubes["glid"], "frozen", seed=1)],
        str(tmp_path / "a"),
        cfg,
        client,
    )
    assert s1.records[0]["encoder_forward_items"] == 0 and sum(s1.encoder_items.values()) == 0

    # the same run elsewhere, with a worker killed while it trains
    out_b = str(tmp_path / "b")
    result = {}
    th = threading.Thread(
        target=lambda: result.setdefault("r", ev(run, out_b, cfg.replace(epochs=12), client))
    )
    th.start()
    killed = None
    deadline = time.time() + 120
    while th.is_alive() and time.time() < deadline and killed is None:
        for addr, keys in client.processing().items():
            if any(str(k).startswith("cryocube-fit-") for k in keys):
                pid = client.run(os.getpid, workers=[addr])[addr]
                os.kill(pid, signal.SIGKILL)
                killed = addr
                break
        time.sleep(0.05)
    th.join(300)
    assert killed, "no training task was caught running"
    c = ev(run, str(tmp_path / "c"), cfg.replace(epochs=12), client)
    b = result["r"]
    assert b.records[0]["status"] == "ok"
    assert b.records[0]["metrics"]["mIoU"] == pytest.approx(
        c.records[0]["metrics"]["mIoU"], abs=1e-9
    )
    assert b.records[0]["confusion_matrix"] == c.records[0]["confusion_matrix"]
    client.wait_for_workers(2, timeout=60)


def test_failures_are_recorded_or_refused(tmp_path, client, cubes):
    cfg = load_config(None, FAST)
    # a diverging run is recorded as an error; the other run goes on
    runs = [
        RunSpec("ssl4eo_moco", cubes["glid"], "frozen", seed=5),
        RunSpec("unet", cubes["glid"], "frozen", seed=5),
    ]
    res = ev(runs[:1], str(tmp_path), cfg.replace(lr=1e25), client)
    ok = ev(runs[1:], str(tmp_path), cfg.replace(epochs=1), client)
    assert res.records[0]["status"] == "error" and "non-finite loss" in res.records[0]["error"]
    assert ok.records[0]["status"] == "ok"
    # a model that cannot see any band of the cube is refused before any work
    with pytest.raises(UserError, match="croma_sar"):
        ev([RunSpec("croma_sar", cubes["glid"], "frozen")], str(tmp_path / "x"), cfg, client)
    assert not (tmp_path / "x" / "features").exists()
    # an incomplete cube is refused
    g = store.open_group(cubes["caffe"], "r+")
    marker = g.attrs[COMPLETE_ATTR]
    del g.attrs[COMPLETE_ATTR]
    zarr.consolidate_metadata(g.store)
    try:
        with pytest.raises(IncompleteCubeError):
            ev([RunSpec("unet", cubes["caffe"], "frozen")], str(tmp_path / "y"), cfg, client)
    finally:
        g.attrs[COMPLETE_ATTR] = marker
        zarr.consolidate_metadata(g.store)


def test_grid_and_metrics_from_cm():
    runs = runs_from_grid(["a", "b"], ["c1"], ["frozen", "fewshot"], [None], [0, 1])
    assert len(runs) == 8
    cm = np.array([[5, 1], [2, 2]])
    m = metrics_from_confusion(cm, ["bg", "fg"])
    assert m["IoU"]["bg"] == pytest.approx(100 * 5 / 8) and m["IoU"]["fg"] == pytest.approx(
        100 * 2 / 5
    )
    assert m["precision"]["fg"] == pytest.approx(100 * 2 / 3) and m["recall"][
        "fg"
    ] == pytest.approx(50)
    assert m["oAcc"] == pytest.approx(70) and m["mAcc"] == pytest.approx(100 * (5 / 6 + 0.5) / 2)


def test_decoder_init_does_not_depend_on_a_cached_encoder(cubes):
    """A training task that finds the encoder already built (cached by extraction on that worker)
    and one that builds it must start from the same decoder weights, or seeds stop being
    reproducible.
    """
    from cryocube.engine.plan import plan_runs
    from cryocube.families import PlanContext, encoders
    from cryocube.families.segmentation.train import build_model

    cfg = load_config(None, FAST)
    p = plan_runs(
        [RunSpec("ssl4eo_moco", cubes["glid"], "frozen")],
        cfg,
        PlanContext(out="x", allow_random_weights=True),
    )[0]
    encoders._ENCODERS.clear()
    fresh, _ = build_model(p.work, "cpu")  # builds the encoder
    cached, _ = build_model(p.work, "cpu")  # finds it
    assert len(encoders._ENCODERS) == 1
    for (k, a), (_, b) in zip(fresh.state_dict().items(), cached.state_dict().items()):
        assert torch.equal(a, b), k


def test_batches_of_padding_only_are_skipped_not_a_nan_loss(tmp_path, client):
    """Small scenes padded into big tiles: with a small input most crops are padding only, whose
    mean cross-entropy is 0/0. Such a batch is skipped (counted in the record) and the run learns
    from the others."""
    make_raw("gld", tmp_path / "raw", n={"train": 4, "val": 2, "test": 2}, size=40, seed=3)
    url = str(tmp_path / "gld.zarr")
    convert("gld", str(tmp_path / "raw"), url, client=client, tile_size=96, progress=False)
    cfg = load_config(
        None,
        [
            "epochs=3",
            "decoder_channels=16",
            "input_size=32",
            "val_every=1",
            "crops_per_sample=4",
            "batch_size=1",
            "normalization=cube",
        ],
    )
    res = ev([RunSpec("unet", url, "frozen")], tmp_path / "res", cfg, client)
    rec = res.records[0]
    assert rec["status"] == "ok", rec.get("error")
    assert 0 < rec["unlabelled_steps"] < rec["steps"]
    assert np.isfinite(rec["metrics"]["mIoU"])


def _budget(**over):
    b = {
        "version": 1,
        "date": "2026-12-04",
        "machine": {"cpu": "test", "cores": 2},
        "encoder_gflops": 8.87,
        "batch_size": 4,
        "cryocube": {
            "startup_s": 10.0,
            "fit_setup_s": 1.0,
            "encoder_s_per_item": 0.1,
            "step_s": 2.0,
            "decoder_window_s": 0.05,
            "test_fixed_s": 0.5,
        },
        "reference": {
            "setup_s": 5.0,
            "encoder_s_per_item": 0.2,
            "decoder_step_s": 4.0,
            "decoder_window_s": 0.1,
            "train_encoder_s_per_item": 0.2,
        },
    }
    b.update(over)
    return b


def test_dry_run_estimate_from_a_measured_budget(tmp_path, cubes, capsys):
    """The estimate sums planned steps, windows and encoder items at the budget's unit costs; a
    feature cache is paid once by cryocube, the encoder in every step and validation by the
    reference."""
    import json

    from cryocube.engine.estimate import estimate, load_budget
    from cryocube.engine.plan import plan_runs
    from cryocube.families import PlanContext
    from cryocube.models import model_spec

    cfg = load_config(None, FAST)
    planned = plan_runs(
        [
            RunSpec("ssl4eo_moco", cubes["glid"], "frozen"),
            RunSpec("ssl4eo_moco", cubes["glid"], "fewshot", 0.5),
        ],
        cfg,
        PlanContext(out=str(tmp_path), allow_random_weights=True),
    )
    assert planned[0].prep_key == planned[1].prep_key
    b = _budget(encoder_gflops=model_spec("ssl4eo_moco").gflops)  # scale 1
    est = estimate(planned, b)
    cc, ref = 10.0, 0.0
    for i, p in enumerate(planned):
        e, w = p.estimate, p.work
        win = (
            e["validations"] * w.val_samples.size * e["windows_per_tile"]
            + w.test_samples.size * e["windows_per_tile"]
        )
        cc += (
            (e["encoder_items"] * 0.1 if i == 0 else 0) + 1.0 + e["steps"] * 2.0 + win * 0.05 + 0.5
        )
        ref += 5.0 + e["steps"] * (4.0 + w.recipe.batch_size * 0.2) + win * (0.1 + 0.2)
    assert (
        est["runs"] == 2
        and est["cryocube_s"] == pytest.approx(cc)
        and est["reference_s"] == pytest.approx(ref)
    )
    # a model twice as heavy doubles the encoder share only
    heavy = estimate(planned, _budget(encoder_gflops=model_spec("ssl4eo_moco").gflops / 2))
    assert heavy["reference_s"] - est["reference_s"] == pytest.approx(
        sum(
            p.estimate["steps"] * 4 * 0.2
            + (p.estimate["validations"] * p.work.val_samples.size + p.work.test_samples.size)
            * p.estimate["windows_per_tile"]
            * 0.2
            for p in planned
        )
    )

    good = tmp_path / "budget.json"
    good.write_text(json.dumps(b))
    assert load_budget(str(good))["cryocube"]["step_s"] == 2.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_budget(reference={"setup_s": 1})))
    with pytest.raises(UserError, match="reference.encoder_s_per_item"):
        load_budget(str(bad))
    bad.write_text("{")
    with pytest.raises(UserError, match="bench_reference.py --budget-out"):
        load_budget(str(bad))

    from cryocube.cli import main

    bad.write_text(json.dumps(_budget(cryocube={**b["cryocube"], "step_s": -1})))
    args = [
        "evaluate",
        "--cubes",
        cubes["glid"],
        "--models",
        "ssl4eo_moco",
        "--out",
        str(tmp_path / "o"),
        "--dry-run",
        "--allow-random-weights",
        *[x for kv in FAST for x in ("--set", kv)],
    ]
    assert main(args + ["--budget", str(bad)]) == 2
    assert "field cryocube.step_s must be a number >= 0" in capsys.readouterr().err
    # without --dry-run too, on the default local cluster: refused before the workers start
    running = [a for a in args if a != "--dry-run"]
    assert main(running + ["--budget", str(bad)]) == 2
    assert "field cryocube.step_s must be a number >= 0" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    assert main(args + ["--budget", str(good)]) == 0
    out = capsys.readouterr().out
    assert "estimated wall time of 1 segmentation runs: cryocube" in out and f"budget {good}" in out


def _unit(model: str, **shares) -> dict:
    from cryocube.models import model_spec

    return {
        "model": model,
        "encoder_gflops": model_spec(model).gflops,
        "batch_size": 4,
        "cryocube": {
            "startup_s": 8.0,
            "fit_setup_s": 2.0,
            "encoder_s_per_item": 0.3,
            "step_s": 3.0,
            "window_s": 0.4,
            "test_fixed_s": 1.0,
            "step_encoder_share": shares.get("cc_step", 0.0),
            "window_encoder_share": shares.get("cc_window", 0.0),
        },
        "reference": {
            "setup_s": 6.0,
            "step_s": 9.0,
            "window_s": 1.2,
            "step_encoder_share": shares.get("ref_step", 0.5),
            "window_encoder_share": shares.get("ref_window", 0.5),
        },
    }


def test_dry_run_estimate_per_class_and_protocol(tmp_path, cubes):
    """A run is costed at the unit measured for its own size class and protocol (an L fine-tune at
    the L fine-tune unit, unscaled); a class with no unit of its own takes the nearest measured unit
    of its protocol, its encoder share scaled by GFLOPs, and the text says SCALED and from what."""
    import json

    from cryocube.engine.estimate import estimate, estimate_text, load_budget, size_class
    from cryocube.engine.plan import plan_runs
    from cryocube.families import PlanContext
    from cryocube.models import model_spec

    assert [size_class(model_spec(m)) for m in ("ssl4eo_moco", "dofa", "terramind_large")] == [
        "S",
        "B",
        "L",
    ]
    assert size_class(model_spec("gfmswin")) == size_class(model_spec("satlasnet_si")) == "Swin"
    cfg = load_config(None, FAST)
    planned = plan_runs(
        [
            RunSpec("terramind_large", cubes["glid"], "finetune"),
            RunSpec("ssl4eo_moco", cubes["glid"], "finetune"),
            RunSpec("ssl4eo_moco", cubes["glid"], "frozen"),
        ],
        cfg,
        PlanContext(out=str(tmp_path), allow_random_weights=True),
    )
    share = {"cc_step": 0.8, "cc_window": 0.6, "ref_step": 0.9, "ref_window": 0.7}
    budget = {
        "version": 2,
        "date": "2026-12-06",
        "machine": {"cpu": "test", "cores": 2},
        "units": {
            "L/finetune": _unit("terramind_large", **share),
            "S/frozen": _unit("ssl4eo_moco"),
        },
    }
    path = tmp_path / "b2.json"
    path.write_text(json.dumps(budget))
    b = load_budget(str(path))
    est = estimate(planned, b)
    g = est["groups"]
    assert g["L/finetune"]["units"] == {"measured L/finetune": 1}
    assert g["S/frozen"]["units"] == {"measured S/frozen": 1}
    assert g["S/finetune"]["units"] == {"scaled L/finetune": 1}

    def windows(p):
        e, w = p.estimate, p.work
        return (e["validations"] * w.val_samples.size + w.test_samples.size) * e["windows_per_tile"]

    large, small, frozen = planned
    # measured in its own class: the unit's costs as they are
    assert g["L/finetune"]["cryocube_s"] == pytest.approx(
        2.0 + large.estimate["steps"] * 3.0 + windows(large) * 0.4 + 1.0
    )
    assert g["L/finetune"]["reference_s"] == pytest.approx(
        6.0 + large.estimate["steps"] * 9.0 + windows(large) * 1.2
    )
    # scaled: only the encoder's share of a step and a window follows the GFLOPs
    k = model_spec("ssl4eo_moco").gflops / model_spec("terramind_large").gflops
    assert g["S/finetune"]["cryocube_s"] == pytest.approx(
        2.0
        + small.estimate["steps"] * 3.0 * (0.8 * k + 0.2)
        + windows(small) * 0.4 * (0.6 * k + 0.4)
        + 1.0
    )
    assert g["S/finetune"]["reference_s"] < g["L/finetune"]["reference_s"]
    # the frozen run pays its cache's extraction; start-up once for the plan
    assert g["S/frozen"]["cryocube_s"] == pytest.approx(
        frozen.estimate["encoder_items"] * 0.3
        + 2.0
        + frozen.estimate["steps"] * 3.0
        + windows(frozen) * 0.4
        + 1.0
    )
    assert est["cryocube_s"] == pytest.approx(8.0 + sum(x["cryocube_s"] for x in g.values()))
    text = estimate_text(planned, b, str(path))
    assert "S/finetune" in text and "SCALED from L/finetune (terramind_large)" in text
    assert "L/finetune" in text and "measured (terramind_large)" in text

    bad = tmp_path / "bad2.json"
    bad.write_text(json.dumps({**budget, "units": {"XL/frozen": _unit("ssl4eo_moco")}}))
    with pytest.raises(UserError, match="unit 'XL/frozen' is not <class>/<protocol> or <model>/"):
        load_budget(str(bad))
    broken = _unit("ssl4eo_moco")
    del broken["cryocube"]["window_s"]
    bad.write_text(json.dumps({**budget, "units": {"S/frozen": broken}}))
    with pytest.raises(UserError, match=r"field units\.S/frozen\.cryocube\.window_s must be"):
        load_budget(str(bad))


def test_dry_run_estimate_per_model_units(tmp_path, cubes):
    """A unit measured on a model costs that model's runs unscaled; another model of the class
    takes the class's measured model nearest in GFLOPs, scaled (DOFA's and SpectralGPT's
    fine-tunes are both B: each keeps its own), and the text counts the runs of each unit."""
    import json

    from cryocube.engine.estimate import estimate, estimate_text, load_budget, size_class
    from cryocube.engine.plan import plan_runs
    from cryocube.families import PlanContext
    from cryocube.models import model_spec

    # B encoders: DOFA 34 GFLOPs, SpectralGPT 213; Prithvi (34) is near DOFA, RAMEN (715) not
    models = ("dofa", "spectralgpt", "prithvi", "ramen")
    assert {size_class(model_spec(m)) for m in models} == {"B"}
    planned = plan_runs(
        [RunSpec(m, cubes["glid"], "finetune") for m in models],
        load_config(None, FAST),
        PlanContext(out=str(tmp_path), allow_random_weights=True),
    )
    units = {f"{m}/finetune": _unit(m, cc_step=0.8, ref_step=0.9) for m in models[:2]}
    units["spectralgpt/finetune"]["cryocube"]["step_s"] = 1.5
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"version": 2, "date": "2026-12-07", "units": units}))
    b = load_budget(str(path))
    assert estimate(planned, b)["groups"]["B/finetune"]["units"] == {
        "measured dofa/finetune": 1,
        "measured spectralgpt/finetune": 1,
        "scaled dofa/finetune": 1,
        "scaled spectralgpt/finetune": 1,
    }
    # SpectralGPT at its own step cost (1.5 s), not DOFA's 3 s scaled by GFLOPs
    p = planned[1]
    windows = (
        p.estimate["validations"] * p.work.val_samples.size + p.work.test_samples.size
    ) * p.estimate["windows_per_tile"]
    assert estimate([p], b)["groups"]["B/finetune"]["cryocube_s"] == pytest.approx(
        2.0 + p.estimate["steps"] * 1.5 + windows * 0.4 + 1.0
    )
    text = estimate_text(planned, b, str(path))
    assert "measured (spectralgpt) (1 runs)" in text and "measured (dofa) (1 runs)" in text
    assert "SCALED from spectralgpt/finetune (spectralgpt) by encoder GFLOPs (1 runs)" in text
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 2, "units": {"dofa2/finetune": units["dofa/finetune"]}}))
    with pytest.raises(UserError, match="unit 'dofa2/finetune' is not"):
        load_budget(str(bad))
