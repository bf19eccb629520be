"""Identity all the way: unique sample ids in every cube (tiles of one scene included), embeddings
that carry their cube's checksum (store and CSV) and are refused against another cube's tasks, and
folds drawn over rows ordered by id, so `--labels` and `--tasks-from` give the same Q for the same
data.
"""

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
from cryocube.embeddings.embed import load_embeddings
from cryocube.embeddings.submission import read_submission
from cryocube.errors import RecipeError, UserError
from cryocube.families.embedding.probe import probe_recipe, tasks_from_cube
from cryocube.families.embedding.work import probe_embeddings
from cryocube.synthetic import make_raw, make_samples

RECIPE = {"epochs": 3, "lr": 1e-2}


@pytest.fixture(scope="module")
def caffe(tmp_path_factory, client):
    """Three small CaFFe scenes cut into 32 px tiles: several tiles per scene share one `source`."""
    root = tmp_path_factory.mktemp("caffe")
    make_raw(
        "caffe", root / "raw", "cryobench", n={"train": 2, "val": 0, "test": 1}, size=64, seed=4
    )
    url = str(root / "caffe.zarr")
    convert("caffe", str(root / "raw"), url, client=client, tile_size=32, progress=False)
    return root, url


@pytest.fixture(scope="module")
def samples(tmp_path_factory, client):
    """One sample cube and a second one converted from the same files with other options (same
    ids)."""
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
    assert (
        main(
            [
                "embed",
                "mean",
                "--cube",
                url,
                "--out",
                str(csv_path),
                "--format",
                "csv",
                "--quiet",
                "--cluster",
                client.scheduler.address,
            ]
        )
        == 0
    )
    got, X, _ = read_submission(csv_path, None, None, strict=False)
    assert got == list(ids) and X.shape[0] == n  # every tile is a row: nothing merged
    store_ids, _, _, attrs = load_embeddings(str(tmp_path / "mean.zarr"))
    assert (
        store_ids == list(ids)
        and attrs["cube"]["checksum"] == ds.attrs["cryocube_complete"]["checksum"]
    )
    side = json.loads((tmp_path / "mean.csv.json").read_text())
    assert side["cube"]["checksum"] == attrs["cube"]["checksum"] and side["source"] == "mean"
    labelled = np.asarray(ds["class_fraction"].values).sum(axis=1) > 0
    for t in tasks_from_cube(url):
        assert set(t.labels) == set(ids[labelled])  # a task has a label per labelled tile


def test_a_cube_written_before_ids_gets_them_derived_once_and_duplicates_are_refused(
    caffe, tmp_path
):
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


def test_embeddings_of_another_cube_are_refused_by_checksum_store_and_csv(
    samples, client, tmp_path
):
    root, a, b = samples
    out = tmp_path / "emb.csv"
    assert (
        main(
            [
                "embed",
                "mean",
                "--cube",
                a,
                "--out",
                str(out),
                "--format",
                "csv",
                "--quiet",
                "--cluster",
                client.scheduler.address,
            ]
        )
        == 0
    )
    ca, cb = (open_cube(u).attrs["cryocube_complete"]["checksum"] for u in (a, b))
    # same ids
    assert ca != cb and list(sample_ids(open_cube(a), a)) == list(sample_ids(open_cube(b), b))
    for emb in (str(tmp_path / "emb.zarr"), str(out)):
        with pytest.raises(
            UserError,
            match=(
                f"{emb} was embedded from the cube {a} \\(checksum {ca[:16]}\\), not from "
                f"{b} \\(checksum {cb[:16]}\\)"
            ),
        ):
            probe_embeddings(
                emb, str(tmp_path / "p"), probe_recipe("linear", 2, RECIPE), tasks_from=b
            )
    assert not (tmp_path / "p").exists()  # refused before any probe ran
    rec = probe_embeddings(
        str(out),
        str(tmp_path / "ok"),
        probe_recipe("linear", 2, RECIPE),
        tasks_from=a,
        progress=False,
    ).record
    # the CSV's provenance reaches the record
    assert rec["cube"]["checksum"] == ca and rec["model"] == "mean"
    # an edited CSV is no longer credited to the cube (a warning says so) and is scored as vectors
    # made elsewhere
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:1] + lines[2:] + lines[1:2]) + "\n")
    with pytest.warns(UserWarning, match="changed since `cryocube embed` wrote it"):
        rec = probe_embeddings(
            str(out),
            str(tmp_path / "edited"),
            probe_recipe("linear", 2, RECIPE),
            tasks_from=b,
            progress=False,
        ).record
    assert rec["cube"] is None


def test_labels_folder_and_tasks_from_give_the_same_q_for_the_same_data(
    samples, tmp_path, embedding_plan
):
    root, a, _ = samples
    from cryocube.cube import cube_info
    from cryocube.embeddings.embed import embed

    spec, prov = embedding_plan("mean", cube_info(a), dim=32)
    emb = str(tmp_path / "emb.zarr")
    embed(spec, cube_info(a), emb, progress=False, provenance=prov)
    ds = open_cube(a)
    ids = list(sample_ids(ds, a))
    labels = tmp_path / "labels"
    labels.mkdir()
    rng = np.random.default_rng(0)
    for j, (task, kind) in enumerate(
        zip(as_text(ds["task"].values), as_text(ds["task_type"].values))
    ):
        y = np.asarray(ds["target"].values)[:, j]
        with open(labels / f"{task}__{kind}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["id", "label"])
            for r in rng.permutation(len(ids)):  # another row order than the cube's
                if np.isfinite(y[r]):
                    w.writerow([ids[r], repr(float(y[r]))])
    recipe = probe_recipe("linear", 3, RECIPE)
    by_labels = probe_embeddings(
        emb, str(tmp_path / "l"), recipe, labels=str(labels), progress=False
    )
    by_cube = probe_embeddings(emb, str(tmp_path / "c"), recipe, tasks_from=a, progress=False)
    assert by_labels.scores.keys() == by_cube.scores.keys() and len(by_cube.scores) == 3
    # bit for bit: the folds follow the ids, not the file order
    assert by_labels.scores == by_cube.scores
    assert by_labels.summary["overall_q_score"] == by_cube.summary["overall_q_score"]


# -- report groups keyed by identity
# -------------------------------------------------------------------


def _seg(i, model, fraction, miou, epochs, name="U-Net", protocol="frozen"):
    """A segmentation record as the engine writes it: identity = what defines the run (recipe
    included)."""
    ident = {
        "family": "segmentation",
        "model": model,
        "arch": "unet",
        "cube": "c0ffee",
        "protocol": protocol,
        "fraction": fraction,
        "seed": 0,
        "recipe": {"epochs": epochs, "lr": 1e-3},
        "weights": "random",
        "v": 1,
    }
    return {
        "run_id": f"r{i}",
        "family": "segmentation",
        "model": model,
        "model_name": name,
        "dataset": "glid",
        "protocol": protocol,
        "fraction": fraction,
        "seed": 0,
        "status": "ok",
        "metrics": {"mIoU": miou},
        "identity": ident,
        "config": ident["recipe"],
        "created": f"2026-01-01T00:00:{i:02d}+00:00",
    }


def test_fraction_curves_never_join_models_that_share_a_name_or_recipes_that_differ(tmp_path):
    from cryocube.pages import build_report

    lines = [
        _seg(0, "unet", 0.1, 10.0, 1),
        _seg(1, "unet", 1.0, 11.0, 1),  # U-Net, 1 epoch
        # 3 epochs
        _seg(2, "unet", 0.1, 30.0, 3),
        _seg(3, "unet", 0.5, 31.0, 3),
        _seg(4, "unet", 1.0, 32.0, 3),
        # another model, the same name
        _seg(5, "my_unet", 0.1, 50.0, 1),
        _seg(6, "my_unet", 1.0, 51.0, 1),
    ]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rep = build_report([str(tmp_path)], str(tmp_path / "rep"), formats=["md"])
    f = rep.tables["fractions/label_fraction"]
    got = {}
    for row in f.rows:
        got.setdefault(row[f.col("model")], {})[row[f.col("fraction")]] = row[f.col("miou")]
    assert got == {
        "U-Net (unet; epochs=1)": {0.1: 10.0, 1.0: 11.0},
        "U-Net (unet; epochs=3)": {0.1: 30.0, 0.5: 31.0, 1.0: 32.0},
        "U-Net (my_unet)": {0.1: 50.0, 1.0: 51.0},
    }
    cell = {r.name: r.cells["glid"].mean for r in rep.leaderboards["frozen-100pct"].rows}["U-Net"]
    # one model's one recipe, never an average of recipes (or of models) as seeds
    assert cell in (32.0, 51.0)
    assert any("another recipe" in n for n in rep.tables["failures"].notes)


def test_probe_runs_on_other_label_sets_are_ranked_apart(samples, tmp_path, embedding_plan):
    """Two label folders, one dataset name ("labels"): before, they were pooled, every run missed
    the other set's tasks and was listed as dropped for a NaN Q."""
    from cryocube.cube import cube_info
    from cryocube.embeddings.embed import embed
    from cryocube.pages import build_report

    root, a, _ = samples
    ds = open_cube(a)
    ids = list(sample_ids(ds, a))
    target = np.asarray(ds["target"].values)
    tasks = list(zip(as_text(ds["task"].values), as_text(ds["task_type"].values)))
    results = tmp_path / "results"
    for model in ("mean", "random"):
        spec, prov = embedding_plan(model, cube_info(a), dim=16)
        emb = str(tmp_path / f"{model}.zarr")
        embed(spec, cube_info(a), emb, progress=False, provenance=prov)
        for s, picked in enumerate((tasks[:1], tasks[1:])):
            labels = tmp_path / f"labels{s}"
            labels.mkdir(exist_ok=True)
            for task, kind in picked:
                j = [t for t, _ in tasks].index(task)
                (labels / f"{task}__{kind}.csv").write_text(
                    "id,label\n"
                    + "".join(
                        f"{i},{float(target[r, j])!r}\n"
                        for r, i in enumerate(ids)
                        if np.isfinite(target[r, j])
                    )
                )
            res = probe_embeddings(
                emb,
                str(results / f"{model}{s}"),
                probe_recipe("linear", 3, RECIPE),
                labels=str(labels),
                progress=False,
            )
            assert res.record["dataset"] == "ssl4eo-downstream" and res.record["label_set"]
    rep = build_report([str(results)], str(tmp_path / "rep"), formats=["md"])
    boards = {
        k: t
        for k, t in rep.tables.items()
        if k.startswith("embedding/embedding_leaderboard_ssl4eo-downstream")
    }
    assert len(boards) == 2  # one per label set, each ranking both models
    for t in boards.values():
        assert len(t.rows) == 2 and not any("Dropped" in n for n in t.notes)
        assert sorted(t.column_values("model")) == ["mean", "random"]


def test_an_embedding_store_with_repeated_ids_is_refused(caffe, tmp_path, embedding_plan):
    """A store embedded before ids were unique (its rows named by `source`) is refused, never
    collapsed."""
    from cryocube.cube import cube_info
    from cryocube.embeddings.embed import embed

    _, url = caffe
    spec, prov = embedding_plan("random", cube_info(url), dim=4)
    emb = str(tmp_path / "old.zarr")
    embed(spec, cube_info(url), emb, progress=False, provenance=prov)
    g = zarr.open_group(emb, mode="r+")
    src = as_text(open_cube(url)["source"].values)
    g["id"][:] = src.astype(object)  # what v1 stores held: the scene's file for every tile
    with pytest.raises(
        UserError,
        match="old.zarr: .* used more than once.*run `cryocube embed` again with --overwrite",
    ):
        load_embeddings(emb)


def test_derived_ids_tell_tiles_and_split_folders_apart():
    from cryocube.cube import derive_sample_ids

    ids = derive_sample_ids(
        ["a.tif", "a.tif", "b.png", "b.png", "c.nc"],
        ["train", "train", "train", "test", "test"],
        [0, 0, 0, 0, 0],
        [0, 32, 0, 0, 0],
    )
    # one stem in two split folders: prefixed
    assert list(ids) == ["a__0_0", "a__0_32", "train/b", "test/b", "c"]


def test_a_study_finds_its_default_run_when_another_recipe_fills_the_leaderboard_cell(tmp_path):
    """A study's default run and a later fraction curve at another recipe share (model, dataset,
    protocol, 1.0): the cell shows one recipe, and the study still compares against its own
    default."""
    from cryocube.pages import build_report

    base = _seg(0, "unet", 1.0, 20.0, 1)
    best = _seg(1, "unet", 1.0, 40.0, 1) | {
        "sweep": {
            "study": "s",
            "trial": 0,
            "best": True,
            "baseline_run_id": "r0",
            "params": {"lr": 0.01},
            "value": 1.0,
            "metric": "val_mIoU",
        }
    }
    best["identity"] = best["identity"] | {"recipe": {"epochs": 1, "lr": 0.01}}
    curve = [_seg(2 + i, "unet", f, 30.0 + i, 6) for i, f in enumerate((0.25, 0.5, 1.0))]
    (tmp_path / "results.jsonl").write_text(
        "".join(json.dumps(x) + "\n" for x in [base, best, *curve])
    )
    rep = build_report([str(tmp_path)], str(tmp_path / "rep"), formats=["md"])
    s = rep.tables["tune/studies"]
    assert s.rows[0][s.col("default")] == 20.0 and s.rows[0][s.col("tuned")] == 40.0
    cells = {r.name: r.cells["glid"].mean for r in rep.leaderboards["frozen-100pct"].rows}
    # the newest recipe fills the cell; never 26.0, an average
    assert cells == {"U-Net": 32.0, "U-Net (tuned)": 40.0}


# -- follow_reference: honoured (or refused) by every family and by `cryocube embed` ---------------

FOLLOW_CASES = {  # evaluation family (or command) -> (protocol, model)
    "segmentation": ("frozen", "ssl4eo_dino"),
    "embedding": ("probe", "ssl4eo_dino"),
    "heads": ("heads", "ssl4eo_dino"),
    "vqa": ("vqa", "transformers"),
    "cryocube embed": (None, "ssl4eo_dino"),
}
# generative models declare no deviation from a reference: nothing to follow, said in one sentence
FOLLOW_REFUSED = {"vqa": "a generative model declares none, so the vqa protocol has nothing"}
# shared recipe fields only (`embed` refuses the others); fixed so the ids are the machine's own
FOLLOW_SETS = ["input_size=32", "precision=fp32", "threads=1", "normalization=cube"]


def _followed(case: str, url: str, sets: list[str], out, client) -> tuple[dict, str]:
    """(the record's `deviations`, the run id) of one planned run, or for `cryocube embed` the
    store's attributes and key (the id its vectors are known by)."""
    from cryocube.engine.plan import plan_runs
    from cryocube.families import PlanContext, RunSpec
    from cryocube.families.recipes import load_recipe

    protocol, model = FOLLOW_CASES[case]
    if protocol is None:
        store = str(out / "emb.zarr")
        args = ["embed", model, "--cube", url, "--out", store, "--allow-random-weights"]
        args += ["--quiet", "--cluster", client.scheduler.address]
        assert main(args + [a for s in sets for a in ("--set", s)]) == 0
        _, _, _, attrs = load_embeddings(store)
        return attrs["deviations"], attrs["key"]
    ctx = PlanContext(out=str(out), allow_random_weights=True)
    (run,) = plan_runs([RunSpec(model, url, protocol)], load_recipe(None, sets), ctx)
    return run.record.get("deviations"), run.run_id


@pytest.mark.parametrize("case", sorted(FOLLOW_CASES))
def test_follow_reference_is_followed_or_refused_by_every_family_and_by_embed(
    case, tile_cube, client, tmp_path
):
    """S12-DINO declares one deviation (its qkv biases): with `--set follow_reference=true` each
    family's record says it was followed and the run is another run; the vqa family, whose models
    declare none, refuses the setting in one sentence instead of ignoring it."""
    from cryocube.catalog import protocol
    from cryocube.families import BUILTIN

    families = {m.rsplit(".", 1)[1] for m in BUILTIN}
    assert families == set(FOLLOW_CASES) - {"cryocube embed"}  # every built-in family is a case
    if case in families:
        assert protocol(FOLLOW_CASES[case][0]).family == case
    url = tile_cube("glid", train=8, val=2, test=3, seed=7)
    dev, run_id = _followed(case, url, FOLLOW_SETS, tmp_path / "default", client)
    follow = FOLLOW_SETS + ["follow_reference=true"]
    if case in FOLLOW_REFUSED:
        with pytest.raises(RecipeError) as e:
            _followed(case, url, follow, tmp_path / "follow", client)
        msg = str(e.value)
        assert "follow_reference=true" in msg and FOLLOW_REFUSED[case] in msg, msg
        assert "\n" not in msg and msg.startswith(f"{FOLLOW_CASES[case][1]}/"), msg  # the run
        return
    assert dev == {"in_effect": ["dino_qkv_bias"], "followed": []}
    dev_f, run_id_f = _followed(case, url, follow, tmp_path / "follow", client)
    assert dev_f == {"in_effect": [], "followed": ["dino_qkv_bias"]}
    assert run_id_f != run_id


def test_a_baseline_has_nothing_to_follow_and_embed_says_so(tile_cube, client, tmp_path, capsys):
    url = tile_cube("glid", train=8, val=2, test=3, seed=7)
    args = ["embed", "mean", "--cube", url, "--out", str(tmp_path / "m.zarr"), "--quiet"]
    args += ["--cluster", client.scheduler.address, "--set", "follow_reference=true"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "follow_reference=true: the mean baseline is no model" in err, err
    assert not (tmp_path / "m.zarr" / "embedding").exists()  # refused before any vector
