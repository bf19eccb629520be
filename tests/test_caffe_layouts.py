"""CaFFe in the layouts users already hold: TorchGeo's repackaging (train/val/test patches, masks
named `<stem>_zones__<patch>.png`) converts as a catalog layout, and the original layout says what
it does not read (a `val/` folder beside train/test) instead of skipping it silently."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from cryocube.catalog import load_dataset
from cryocube.cli import main
from cryocube.convert import ConvertError, open_reader
from cryocube.cube import as_text, open_cube, sample_ids
from cryocube.synthetic import make_raw


def test_torchgeo_caffe_converts_with_its_own_val_split_and_patch_tiles(tmp_path, client):
    m = make_raw(
        "caffe",
        tmp_path / "caffe",
        "torchgeo",
        n={"train": 2, "val": 1, "test": 1},
        size=40,
        seed=7,
    )
    it = m.split("val")[0]
    stem, patch = it.scene.split("__", 1)
    # TorchGeo's names: the image <stem>__<patch>.png, its zone mask <stem>_zones__<patch>.png, in
    # split folders
    assert it.image_path.endswith(f"sar_images/val/{stem}__{patch}.png")
    assert it.label_path.endswith(f"zones/val/{stem}_zones__{patch}.png") and os.path.isfile(
        it.label_path
    )
    spec = load_dataset("caffe")
    assert open_reader(spec, "torchgeo").detect(str(m.root)) and not open_reader(
        spec, "original"
    ).detect(str(m.root))
    out = str(tmp_path / "caffe.zarr")
    assert (
        main(
            [
                "convert",
                "caffe",
                "--raw",
                str(m.root),
                "--out",
                out,
                "--quiet",
                "--cluster",
                client.scheduler.address,
            ]
        )
        == 0
    )  # --layout auto finds it
    ds = open_cube(out)
    assert ds.attrs["layout"] == "torchgeo" and ds.attrs["tile_size"] == 512  # one patch, one tile
    split = as_text(ds["split"].values)
    assert {s: int((split == s).sum()) for s in ("train", "val", "test")} == {
        "train": 2,
        "val": 1,
        "test": 1,
    }
    ids = list(sample_ids(ds, out))
    assert sorted(ids) == sorted(i.scene for i in m.items)  # a patch is a file: its stem is its id
    for item in m.items:
        k = ids.index(item.scene)
        h, w = item.label.shape
        # 0/64/127/254 -> 0..3
        np.testing.assert_array_equal(ds["label"].values[k, :h, :w], item.label)
        assert (ds["label"].values[k, h:, :] == -1).all() and split[k] == item.split
    # the original layout on this tree: one sentence naming the masks it cannot pair, and the val
    # folder it skips
    with (
        pytest.warns(UserWarning, match="sar_images/val: not read"),
        pytest.raises(ConvertError, match=r"images without a mask: .*__93_102_0_0_0\.png"),
    ):
        open_reader(spec, "original").scan(str(m.root))


def test_original_layout_says_that_it_does_not_read_a_val_folder(tmp_path, client):
    m = make_raw(
        "caffe", tmp_path / "raw", "original", n={"train": 3, "val": 0, "test": 1}, size=40, seed=8
    )
    it = m.split("train")[0]
    for kind, path in (("sar_images", it.image_path), ("zones", it.label_path)):
        os.makedirs(m.root / kind / "val", exist_ok=True)
        shutil.copy(path, m.root / kind / "val" / os.path.basename(path))
    out = str(tmp_path / "c.zarr")
    with pytest.warns(UserWarning) as said:
        assert (
            main(
                [
                    "convert",
                    "caffe",
                    "--raw",
                    str(m.root),
                    "--out",
                    out,
                    "--layout",
                    "original",
                    "--tile",
                    "32",
                    "--quiet",
                    "--cluster",
                    client.scheduler.address,
                ]
            )
            == 0
        )
    told = [str(w.message) for w in said if "not read" in str(w.message)]
    assert told == [
        f"{m.root / 'sar_images' / 'val'}: not read (the caffe 'original' layout reads the split"
        " folders test, train; its val split is drawn from train); pass --layout for a layout that"
        " has them"
    ]
    ds = open_cube(out)
    # the train and test scenes, the val copy not among them
    assert len(set(as_text(ds["source"].values))) == 4
