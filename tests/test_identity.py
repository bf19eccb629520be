"""Identity all the way: unique sample ids in every cube (tiles of one scene included), embeddings that
carry their cube's checksum (store and CSV) and are refused against another cube's tasks, and folds
drawn over rows ordered by id, so `--labels` and `--tasks-from` give the same Q for the same data."""
from __future__ import annotations

import csv
import json
import shutil
import warnings

import numpy as np
import pytest
import zarr

from cryocube.cli import main
from cryocube.convert.writer import convert
from cryocube.cube import as_text, open_cube, sample_ids
from cryocube.errors import UserError
from cryocube.families.embedding.embed import load_embeddings
from cryocube.families.embedding.probe import probe_embeddings, probe_recipe, tasks_from_cube
from cryocube.families.embedding.submission import read_submission
from cryocube.synthetic import make_raw, make_samples

RECIPE = {"epochs": 3, "lr": 1e-2}


@pytest.fixture(scope="module")
def caffe(tmp_path_factory, client):
    """Three small CaFFe scenes cut into 32 px tiles: several tiles per scene share one `source`."""
    root = tmp_path_factory.mktemp("caffe")
    make_raw("caffe", root / "raw", "cryobench", n={"train": 2, "val": 0, "test": 1}, size=64, seed=4)
    url = str(root / "caffe.zarr")
    convert("caffe", str(root / "raw"), url, client=client, tile_size=32, progress=False)
    return root, url


@pytest.fixture(scope="module")
def samples(tmp_path_factory, client):
    """One sample cube and a second one converted from the same files with other options (same ids)."""
    root = tmp_path_factory.mktemp("ssl")
    make_samples("ssl4eo-downstream", root / "raw", n=40, size=8, seed=5)
    a, b = str(root / "a.zarr"), str(root / "b.zarr")
    convert("ssl4eo-downstream", str(root / "raw"), a, client=client, progress=False)
    convert("ssl4eo-downstream", str(root / "raw"), b, client=client, progress=False, shift_s2=True)
    return root, a, b


def test_tiles_of_one_scene_keep_their_own_ids_through_embed_csv_and_tasks(caffe, client, tmp_path):
    root, url = caffe
    ds = open_cube(url)
    n = ds.sizes["sample"]
    ids = sample_ids(ds, url)
    sources = as_text(ds["source"].values)
    assert len(set(sources)) == 3 and n > 3 * 4  # scenes of ~64x98 px in 32 px tiles
    assert len(set(ids)) == n  # one id per tile, where `source` names only the scene
    first = sources[0].rsplit(".", 1)[0]
    assert ids[0] == f"{first}__0_0" and ids[1] == f"{first}__0_32"
    csv_path = tmp_path / "mean.csv"
    assert main(["embed", "mean", "--cube", url, "--out", str(csv_path), "--format", "csv", "--quiet",
                 "--cluster", client.scheduler.address]) == 0
    got, X, _ = read_submission(csv_path, None, None, strict=False)
    assert got == list(ids) and X.shape[0] == n  # every tile is a row: nothing merged
    store_ids, _, _, attrs = load_embeddings(str(tmp_path / "mean.zarr"))
    assert store_ids == list(ids) and attrs["cube"]["checksum"] == ds.attrs["cryocube_complete"]["checksum"]
    side = json.loads((tmp_path / "mean.csv.json").read_text())
    assert side["cube"]["checksum"] == attrs["cube"]["checksum"] and side["source"] == "mean"
    labelled = np.asarray(ds["class_fraction"].values).sum(axis=1) > 0
    for t in tasks_from_cube(url):
        assert set(t.labels) == set(ids[labelled])  # a task has a label per labelled tile


def test_a_cube_written_before_ids_gets_them_derived_once_and_duplicates_are_refused(caffe, tmp_path):
    _, url = caffe
    want = sample_ids(open_cube(url), url)
    old = str(tmp_path / "old.zarr")
    shutil.copytree(url, old)
    g = zarr.open_group(old, mode="r+")
    del g["sample_id"]
    zarr.consolidate_metadata(old)
    ds = open_cube(old)
    assert "sample_id" not in ds.variables
    with pytest.warns(UserWarning, match="old.zarr: this cube has no stored sample ids"):
        got = sample_ids(ds, old)
    assert list(got) == list(want)  # what a new conversion stores
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per cube, not per use
        sample_ids(open_cube(old), old)
    dup = str(tmp_path / "dup.zarr")
    shutil.copytree(url, dup)
    g = zarr.open_group(dup, mode="r+")
    g["sample_id"][2] = str(want[0])
    zarr.consolidate_metadata(dup)
    with pytest.raises(UserError, match=f"dup.zarr: 1 sample id.*{want[0]!s}.*samples \\[0, 2\\]"):
        sample_ids(open_cube(dup), dup)
    with pytest.raises(UserError, match="used more than once"):
        tasks_from_cube(dup)


def test_embeddings_of_another_cube_are_refused_by_checksum_store_and_csv(samples, client, tmp_path):
    root, a, b = samples
    out = tmp_path / "emb.csv"
    assert main(["embed", "mean", "--cube", a, "--out", str(out), "--format", "csv", "--quiet",
                 "--cluster", client.scheduler.address]) == 0
    ca, cb = (open_cube(u).attrs["cryocube_complete"]["checksum"] for u in (a, b))
    assert ca != cb and list(sample_ids(open_cube(a), a)) == list(sample_ids(open_cube(b), b))  # same ids
    for emb in (str(tmp_path / "emb.zarr"), str(out)):
        with pytest.raises(UserError, match=f"{emb} was embedded from the cube {a} \\(checksum {ca[:16]}\\), not from "
                                            f"{b} \\(checksum {cb[:16]}\\)"):
            probe_embeddings(emb, str(tmp_path / "p"), probe_recipe("linear", 2, RECIPE), tasks_from=b)
    assert not (tmp_path / "p").exists()  # refused before any probe ran
    rec = probe_embeddings(str(out), str(tmp_path / "ok"), probe_recipe("linear", 2, RECIPE), tasks_from=a,
                           progress=False).record
    assert rec["cube"]["checksum"] == ca and rec["model"] == "mean"  # the CSV's provenance reaches the record
    # an edited CSV is no longer credited to the cube (a warning says so) and is scored as vectors made elsewhere
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:1] + lines[2:] + lines[1:2]) + "\n")
    with pytest.warns(UserWarning, match="changed since `cryocube embed` wrote it"):
        rec = probe_embeddings(str(out), str(tmp_path / "edited"), probe_recipe("linear", 2, RECIPE), tasks_from=b,
                               progress=False).record
    assert rec["cube"] is None


def test_labels_folder_and_tasks_from_give_the_same_q_for_the_same_data(samples, tmp_path):
    root, a, _ = samples
    from cryocube.cube import cube_info
    from cryocube.families.embedding.embed import embed, plan_embedding

    spec, prov = plan_embedding("mean", cube_info(a), dim=32)
    emb = str(tmp_path / "emb.zarr")
    embed(spec, cube_info(a), emb, progress=False, provenance=prov)
    ds = open_cube(a)
    ids = list(sample_ids(ds, a))
    labels = tmp_path / "labels"
    labels.mkdir()
    rng = np.random.default_rng(0)
    for j, (task, kind) in enumerate(zip(as_text(ds["task"].values), as_text(ds["task_type"].values))):
        y = np.asarray(ds["target"].values)[:, j]
        with open(labels / f"{task}__{kind}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["id", "label"])
            for r in rng.permutation(len(ids)):  # another row order than the cube's
                if np.isfinite(y[r]):
                    w.writerow([ids[r], repr(float(y[r]))])
    recipe = probe_recipe("linear", 3, RECIPE)
    by_labels = probe_embeddings(emb, str(tmp_path / "l"), recipe, labels=str(labels), progress=False)
    by_cube = probe_embeddings(emb, str(tmp_path / "c"), recipe, tasks_from=a, progress=False)
    assert by_labels.scores.keys() == by_cube.scores.keys() and len(by_cube.scores) == 3
    assert by_labels.scores == by_cube.scores  # bit for bit: the folds follow the ids, not the file order
    assert by_labels.summary["overall_q_score"] == by_cube.summary["overall_q_score"]
