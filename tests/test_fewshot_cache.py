"""The frozen-feature cache is keyed by the samples it holds: a few-shot run extracts only its draw,
a later run only what is missing, and a partly filled cache (as a killed extraction leaves it) is
never read as complete. Real cubes, real LocalCluster, real encoder (random weights)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from cryocube import store
from cryocube.engine.evaluate import evaluate
from cryocube.families import RunSpec
from cryocube.families.recipes import load_recipe
from cryocube.families.segmentation.features import COMPLETE

FAST = [
    "epochs=2",
    "decoder_channels=32",
    "input_size=32",
    "val_every=2",
    "crops_per_sample=2",
    "batch_size=2",
    "normalization=cube",
]
K = 2  # crops_per_sample
MODEL = "ssl4eo_moco"


@pytest.fixture(scope="module")
def cube(tile_cube):
    return tile_cube("glid", train=20, val=2, test=2, seed=5)


def ev(specs, out, client):
    res = evaluate(
        specs,
        str(out),
        load_recipe(None, FAST),
        client=client,
        progress=False,
        allow_random_weights=True,
    )
    assert all(r["status"] == "ok" for r in res.records), [r.get("error") for r in res.records]
    return res.records


def _split(out, name="train"):
    (cache,) = (out / "features").iterdir()
    return cache, store.open_group(str(cache), "r")[name]


def _held(out) -> set[int]:
    """Cube sample indices the train split holds."""
    _, g = _split(out)
    samples = np.asarray(g["sample"][::K])
    return set(samples[np.asarray(g["held"][:]).astype(bool)].tolist())


def _train_arrays(out) -> dict[str, np.ndarray]:
    _, g = _split(out)
    names = [f"f{i}" for i in range(int(g.attrs["levels"]))] + ["label", "offset", "sample"]
    return {n: np.asarray(g[n][:]) for n in names}


def test_fewshot_extracts_its_draw_and_a_full_run_only_the_rest(tmp_path, client, cube):
    out = tmp_path / "a"
    (few,) = ev([RunSpec(MODEL, cube, "fewshot", seed=0)], out, client)
    draw = set(few["subset"])
    assert 0 < len(draw) < 20
    by = few["encoder_forward_items_by_split"]
    # the record's train items are the draw's crops; validation and test windows as before
    assert by["train"] == len(draw) * K and by["val"] > 0 and by["test"] > 0
    assert few["encoder_forward_items"] == sum(by.values())
    assert _held(out) == draw
    _, g = _split(out)
    assert COMPLETE not in g.attrs  # a partly filled split is not marked complete

    # another seed's draw: only its samples the first draw did not hold
    (few1,) = ev([RunSpec(MODEL, cube, "fewshot", seed=1)], out, client)
    draw1 = set(few1["subset"])
    assert draw1 != draw
    assert few1["encoder_forward_items_by_split"] == {
        "train": len(draw1 - draw) * K,
        "val": 0,
        "test": 0,
    }
    assert _held(out) == draw | draw1

    # the full run: only what is missing, then the split is complete
    (full,) = ev([RunSpec(MODEL, cube, "frozen")], out, client)
    assert full["encoder_forward_items_by_split"]["train"] == (20 - len(draw | draw1)) * K
    cache, g = _split(out)
    assert COMPLETE in g.attrs and len(_held(out)) == 20

    # a fresh full extraction elsewhere: every cached item is bit-identical, and so is the run
    fresh = tmp_path / "fresh"
    (ref,) = ev([RunSpec(MODEL, cube, "frozen")], fresh, client)
    assert ref["encoder_forward_items_by_split"]["train"] == 20 * K
    a, b = _train_arrays(out), _train_arrays(fresh)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].tobytes() == b[name].tobytes(), name
    assert full["confusion_matrix"] == ref["confusion_matrix"]
    assert full["run_id"] == ref["run_id"]


def test_a_partial_cache_resumes_and_is_never_read_as_complete(tmp_path, client, cube):
    out = tmp_path / "a"
    (few,) = ev([RunSpec(MODEL, cube, "fewshot", seed=0)], out, client)
    draw = sorted(few["subset"])
    cache, g = _split(out)
    pos = {int(s): i for i, s in enumerate(np.asarray(g["sample"][::K]))}
    # as a killed extraction task leaves it: one sample written but its flag not yet up, another
    # with its flag down and its feature chunks gone
    w = store.open_group(str(cache), "r+")["train"]
    written, lost = pos[draw[0]], pos[draw[-1]]
    w["held"][written] = 0
    w["held"][lost] = 0
    for name in [f"f{i}" for i in range(int(g.attrs["levels"]))] + ["label"]:
        for item in range(lost * K, (lost + 1) * K):
            chunk = cache / "train" / name / "c" / str(item)
            shutil.rmtree(chunk) if chunk.is_dir() else chunk.unlink()

    # the same draw again (another decoder setting: a new run): the two samples are extracted again
    (again,) = ev([RunSpec(MODEL, cube, "fewshot", seed=0, overrides=(("lr", 2e-4),))], out, client)
    assert again["subset"] == few["subset"]
    assert again["encoder_forward_items_by_split"] == {"train": 2 * K, "val": 0, "test": 0}
    assert _held(out) == set(draw)
    _, g = _split(out)
    assert COMPLETE not in g.attrs

    # a full run then fills the rest; it equals a fresh extraction bit for bit
    (full,) = ev([RunSpec(MODEL, cube, "frozen")], out, client)
    assert full["encoder_forward_items_by_split"]["train"] == (20 - len(draw)) * K
    (ref,) = ev([RunSpec(MODEL, cube, "frozen")], tmp_path / "fresh", client)
    a, b = _train_arrays(out), _train_arrays(tmp_path / "fresh")
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name
    assert full["confusion_matrix"] == ref["confusion_matrix"]


def test_a_held_sample_whose_chunk_is_lost_is_refused(tmp_path, client, cube):
    """A flag up but its features gone (a damaged partial cache): the run fails naming the cache,
    never trains on fill values."""
    out = tmp_path / "a"
    (few,) = ev([RunSpec(MODEL, cube, "fewshot", seed=0)], out, client)
    cache, g = _split(out)
    pos = {int(s): i for i, s in enumerate(np.asarray(g["sample"][::K]))}
    item = pos[few["subset"][0]] * K
    chunk = cache / "train" / "f0" / "c" / str(item)
    shutil.rmtree(chunk) if chunk.is_dir() else chunk.unlink()
    res = evaluate(
        [RunSpec(MODEL, cube, "fewshot", seed=0, overrides=(("lr", 2e-4),))],
        str(out),
        load_recipe(None, FAST),
        client=client,
        progress=False,
        allow_random_weights=True,
    )
    (r,) = res.records
    assert r["status"] == "error" and "never written or are damaged" in r["error"]
