"""Every raw-layout reader against real generated files: pixels, labels, splits, georeferencing,
windows, remote URLs, and each kind of bad input naming the file at fault."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import fsspec
import numpy as np
import pytest

from cryocube.catalog import CUBE_IGNORE_INDEX, dataset_ids, load_dataset
from cryocube.convert import ConvertError, open_reader, readers
from cryocube.convert.ai4arctic import chart_set, write_netcdf
from cryocube.convert.splits import choice, shuffle_split
from cryocube.synthetic import RECIPES, corrupt, make_raw

# every layout of every catalog dataset: a new layout is tested because it is in the catalog
# (tile datasets; sample datasets such as ssl4eo-downstream have their own suite in
# test_embedding.py)
PAIRS = sorted(
    (d, lay)
    for d in dataset_ids()
    for lay in load_dataset(d).layouts
    if load_dataset(d).task == "segmentation"
)
IDS = [f"{d}-{layout}" for d, layout in PAIRS]
SMALL = {"train": 2, "val": 1, "test": 1}


def reader(dataset, layout, **kw):
    return open_reader(load_dataset(dataset), layout, **kw)


def remap(raw: np.ndarray, dataset: str, layout: str) -> np.ndarray:
    """The writer's job, done independently here: raw values -> class indices / ignore."""
    lay = load_dataset(dataset).layout(layout)
    out = np.full(raw.shape, 999, np.int16)
    for k, v in lay.label_map.items():
        out[raw == k] = v
    for v in lay.ignore_values:
        out[raw == v] = CUBE_IGNORE_INDEX
    assert (out != 999).all(), f"raw values outside the mapping: {np.unique(raw[out == 999])}"
    return out


@pytest.fixture(scope="module", params=PAIRS, ids=IDS)
def generated(request, tmp_path_factory):
    dataset, layout = request.param
    root = tmp_path_factory.mktemp(f"{dataset}_{layout}")
    return make_raw(dataset, root, layout)


def test_every_catalog_layout_names_a_reader_and_has_sample_data():
    for dataset, layout in PAIRS:
        assert load_dataset(dataset).layout(layout).reader in readers()
        assert dataset in RECIPES


def test_scan_and_read_return_the_generated_data(generated):
    m = generated
    r = reader(m.dataset, m.layout)
    items = r.scan(str(m.root))
    assert [(it.split, it.scene) for it in items] == [(it.split, it.scene) for it in m.items]
    assert all(m.counts[s] > 0 for s in ("train", "val", "test"))
    spec = load_dataset(m.dataset)
    for it, want in zip(items, m.items):
        assert Path(it.image) == Path(want.image_path) and Path(it.label) == Path(want.label_path)
        assert (it.bands, it.height, it.width) == (len(spec.bands), *want.label.shape)
        assert it.crs == want.crs
        if want.transform is None:
            assert it.transform is None
        else:
            np.testing.assert_allclose(it.transform, want.transform)
        image, raw = r.read(it)
        assert image.dtype == want.image.dtype == np.dtype(spec.dtype)
        np.testing.assert_array_equal(image, want.image)  # NaN == NaN here
        np.testing.assert_array_equal(raw, want.raw_label)
        np.testing.assert_array_equal(remap(raw, m.dataset, m.layout), want.label)


def test_generated_data_has_every_class_and_learnable_structure(generated):
    m = generated
    spec = load_dataset(m.dataset)
    labels = np.concatenate([it.label.ravel() for it in m.items])
    assert set(np.unique(labels)) - {CUBE_IGNORE_INDEX} == set(range(spec.num_classes))
    # class-conditional means of band 0 differ clearly (a linear probe can separate classes)
    img = np.concatenate([it.image[0].ravel() for it in m.items]).astype(np.float64)
    means = [np.nanmean(img[labels == c]) for c in range(spec.num_classes)]
    spread = np.nanstd(img)
    assert max(means) - min(means) > 0.5 * spread


def test_windowed_reads_equal_slices_of_the_full_read(generated):
    m = generated
    r = reader(m.dataset, m.layout)
    for it in r.scan(str(m.root))[:3]:
        full_img, full_lbl = r.read(it)
        h, w = it.height, it.width
        for win in [(0, h, 0, w), (5, 37, 11, 50), (h - 13, h, w - 29, w), (0, 1, w - 1, w)]:
            img, lbl = r.read(it, win)
            r0, r1, c0, c1 = win
            np.testing.assert_array_equal(img, full_img[:, r0:r1, c0:c1])
            np.testing.assert_array_equal(lbl, full_lbl[r0:r1, c0:c1])
        with pytest.raises(ValueError, match="outside"):
            r.read(it, (0, h + 1, 0, w))


def test_detect_tells_the_layouts_apart(generated):
    m = generated
    assert reader(m.dataset, m.layout).detect(str(m.root))
    for lay in load_dataset(m.dataset).layouts:
        if lay != m.layout:
            assert not reader(m.dataset, lay).detect(str(m.root)), (
                f"{m.dataset}/{lay} claims a {m.layout} tree"
            )


SCAN_OR_READ_ERRORS = [
    "truncate",
    "header",
    "missing_mask",
    "missing_image",
    "size_mismatch",
    "band_count",
]


def _scan_and_read_all(r, root):
    for it in r.scan(root):
        r.read(it)


@pytest.mark.parametrize("kind", SCAN_OR_READ_ERRORS)
@pytest.mark.parametrize("pair", PAIRS, ids=IDS)
def test_bad_input_raises_naming_the_file(pair, kind, tmp_path):
    m = make_raw(pair[0], tmp_path, pair[1], n=SMALL)
    damaged = corrupt(m, kind)
    # a deleted file is reported through its partner left alone
    partner = {
        "missing_mask": {it.label_path: it.image_path for it in m.items},
        "missing_image": {it.image_path: it.label_path for it in m.items},
    }
    named = partner.get(kind, {}).get(damaged, damaged)
    with pytest.raises(ConvertError) as e:
        _scan_and_read_all(reader(*pair), str(tmp_path))
    assert os.path.basename(named) in str(e.value)


@pytest.mark.parametrize("pair", PAIRS, ids=IDS)
def test_label_and_nan_damage_reaches_the_writer_unchanged(pair, tmp_path):
    """Readers return raw values; the writer validates them. The corruptions must be real."""
    m = make_raw(pair[0], tmp_path, pair[1], n=SMALL)
    r = reader(*pair)
    lay = load_dataset(pair[0]).layout(pair[1])
    path = corrupt(m, "label_value")
    it = next(i for i in r.scan(str(tmp_path)) if Path(i.label) == Path(path))
    raw = r.read(it)[1]
    assert raw[1, 1] not in lay.label_map and raw[1, 1] not in lay.ignore_values
    if m.items[0].image.dtype.kind == "f":
        path = corrupt(m, "nan")
        it = next(i for i in r.scan(str(tmp_path)) if Path(i.image) == Path(path))
        assert np.isnan(r.read(it, (0, 3, 0, 3))[0][0, 1, 1])
    else:
        with pytest.raises(ValueError, match="NaN"):
            corrupt(m, "nan")


def test_pairing_is_by_name_and_ignores_stray_files(tmp_path):
    m = make_raw("gsdd", tmp_path, n=SMALL)
    (tmp_path / "train" / "image" / "notes.txt").write_text("not a raster")
    # a mask whose name matches no image is an error even though the counts are equal
    it = m.split("train")[0]
    os.rename(it.label_path, it.label_path.replace(it.scene, "zzz_other"))
    with pytest.raises(ConvertError, match="zzz_other"):
        reader("gsdd", "cryobench").scan(str(tmp_path))


def test_glid_original_accepts_train_or_GLID_but_not_both(tmp_path):
    m = make_raw("glid", tmp_path, "original", n=SMALL)
    r = reader("glid", "original")
    assert (tmp_path / "GLID").is_dir()
    os.rename(tmp_path / "GLID", tmp_path / "train")
    assert [i.split for i in r.scan(str(tmp_path))] == [i.split for i in m.items]
    shutil.copytree(tmp_path / "train", tmp_path / "GLID")
    with pytest.raises(ConvertError, match="GLID"):
        r.scan(str(tmp_path))


def test_empty_root_is_an_error(tmp_path):
    for d, lay in PAIRS:
        with pytest.raises(ConvertError, match=re.escape(str(tmp_path))):
            reader(d, lay).scan(str(tmp_path))


def test_caffe_val_draw_replays_sklearn_train_test_split():
    from sklearn.model_selection import train_test_split

    for n in (3, 10, 559):
        names = [f"scene_{i:04d}" for i in range(n)]
        _, val = train_test_split(names, test_size=0.1, random_state=1)
        assert shuffle_split(list(reversed(names)), {"fraction": 0.1, "seed": 1}) == set(val)


def test_sicd_val_draw_is_the_starter_kit_choice():
    names = [f"2019{i:04d}T000000_dmi" for i in range(512)]
    np.random.seed(0)
    want = set(np.random.choice(np.array(names), size=10, replace=False))
    assert choice(list(reversed(names)), {"scenes": 10, "seed": 0}) == want
    assert len(choice(names[:4], {})) == 1 and choice(names[:1], {}) == set()


def test_sicd_original_test_scene_with_charts_inside(tmp_path):
    m = make_raw("sicd", tmp_path, "original", n=SMALL)
    t = m.split("test")[0]
    os.remove(t.label_path)
    r = reader("sicd", "original")
    write_netcdf(
        t.image_path, t.scene, dict(zip(r.variables, t.image)), chart_set(r.chart, t.raw_label)
    )
    r = reader("sicd", "original")
    it = next(i for i in r.scan(str(tmp_path)) if i.scene == t.scene)
    assert it.label == it.image and it.split == "test"
    np.testing.assert_array_equal(r.read(it)[1], t.raw_label)


@pytest.mark.parametrize(
    "pair",
    [("gld", "cryobench"), ("caffe", "original"), ("sicd", "original")],
    ids=["tif", "png", "netcdf"],
)
def test_remote_urls_read_like_local_files(pair, tmp_path):
    m = make_raw(pair[0], tmp_path, pair[1], n=SMALL)
    fs = fsspec.filesystem("memory")
    base = f"/remote_{pair[0]}_{pair[1]}"
    for p in tmp_path.rglob("*"):
        if p.is_file():
            fs.pipe(f"{base}/{p.relative_to(tmp_path).as_posix()}", p.read_bytes())
    root = f"memory://{base}"
    assert reader(*pair).detect(root)
    r = reader(*pair)
    items = r.scan(root)
    assert [(i.split, i.scene) for i in items] == [(i.split, i.scene) for i in m.items]
    for it, want in zip(items, m.items):
        assert it.image.startswith("memory://") and it.crs == want.crs
        img, lbl = r.read(it, (2, 20, 3, 30))
        np.testing.assert_array_equal(img, want.image[:, 2:20, 3:30])
        np.testing.assert_array_equal(lbl, want.raw_label[2:20, 3:30])
    fs.rm(base, recursive=True)
