"""`convert`: every reader end to end into a cube on a real LocalCluster, S3 on moto, resume, bad
input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import xarray as xr

from cryocube import store
from cryocube.catalog import CUBE_IGNORE_INDEX, load_dataset
from cryocube.convert.base import ConvertError
from cryocube.convert.writer import convert
from cryocube.cube import COMPLETE_ATTR, IncompleteCubeError, open_cube, stratum_keys, summary
from cryocube.errors import UserError
from cryocube.synthetic import corrupt, make_raw

CASES = [
    ("gsdd", "cryobench"),
    ("glid", "cryobench"),
    ("glid", "original"),
    ("gld", "cryobench"),
    ("sicd", "cryobench"),
    ("sicd", "original"),
    ("caffe", "cryobench"),
    ("caffe", "original"),
]


def expected_tiles(manifest, tile):
    """What the cube must hold, from what the generator wrote: (split, scene, ty, tx, image, label)
    in cube order."""
    out = []
    spec = load_dataset(manifest.dataset)
    for it in manifest.items:  # manifest items are sorted by (split order, scene), like the cube
        c, h, w = it.image.shape
        img = it.image
        lbl = it.label.copy()
        if img.dtype.kind == "f":
            nan = ~np.isfinite(img)
            lbl[nan.any(axis=0)] = CUBE_IGNORE_INDEX
            img = np.where(nan, spec.nan_fill, img)
        for y in range(0, h, tile):
            for x in range(0, w, tile):
                ti = np.zeros((c, tile, tile), dtype=np.dtype(spec.dtype))
                tl = np.full((tile, tile), CUBE_IGNORE_INDEX, dtype=np.int16)
                patch = img[:, y : y + tile, x : x + tile]
                ti[:, : patch.shape[1], : patch.shape[2]] = patch
                tl[: patch.shape[1], : patch.shape[2]] = lbl[y : y + tile, x : x + tile]
                out.append((it.split, it.scene, y, x, ti, tl))
    return out


@pytest.mark.parametrize("dataset,layout", CASES)
def test_reader_to_cube(tmp_path, client, dataset, layout):
    m = make_raw(dataset, tmp_path / "raw", layout=layout, seed=3)
    url = str(tmp_path / f"{dataset}.zarr")
    r = convert(
        dataset,
        str(tmp_path / "raw"),
        url,
        client=client,
        tile_size=m.tile_size,
        block_samples=3,
        progress=False,
    )
    exp = expected_tiles(m, m.tile_size)
    assert r.n_samples == len(exp) and r.blocks_written == r.blocks_total
    ds = open_cube(url)
    assert ds.attrs["layout"] == layout and ds.attrs["dataset"] == dataset
    assert ds.sizes["sample"] == len(exp)
    assert list(ds["split"].values) == [e[0] for e in exp]
    assert list(ds["scene"].values) == [e[1] for e in exp]
    assert list(ds["tile_y"].values) == [e[2] for e in exp] and list(ds["tile_x"].values) == [
        e[3] for e in exp
    ]
    np.testing.assert_array_equal(ds["image"].values, np.stack([e[4] for e in exp]))
    np.testing.assert_array_equal(ds["label"].values, np.stack([e[5] for e in exp]))
    assert list(ds["band"].values) == load_dataset(dataset).band_names
    # class fractions and strata derived from the labels
    k = ds.sizes["class"]
    for i, e in enumerate(exp):
        v = e[5][e[5] >= 0]
        want = np.bincount(v, minlength=k) / v.size if v.size else np.zeros(k)
        np.testing.assert_allclose(ds["class_fraction"].values[i], want, atol=1e-6)
    assert list(ds["stratum"].values) == list(stratum_keys(ds["class_fraction"].values))
    # train statistics over valid pixels, as numpy computes them
    train = [e for e in exp if e[0] == "train"]
    px = np.concatenate([e[4][:, e[5] >= 0].astype(np.float64) for e in train], axis=1)
    np.testing.assert_allclose(ds["band_mean"].values, px.mean(axis=1), rtol=1e-6)
    np.testing.assert_allclose(ds["band_std"].values, px.std(axis=1), rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(ds["band_min"].values, px.min(axis=1))
    np.testing.assert_allclose(ds["band_max"].values, px.max(axis=1))
    # georeferencing where the source has it
    first = m.items[0]
    if first.crs:
        assert ds["crs"].values[0] == first.crs
        np.testing.assert_allclose(ds["transform"].values[0], first.transform)
    # a second convert of the same inputs finds the cube complete and writes nothing
    again = convert(
        dataset,
        str(tmp_path / "raw"),
        url,
        client=client,
        tile_size=m.tile_size,
        block_samples=3,
        progress=False,
    )
    assert again.blocks_written == 0 and again.marker["checksum"] == r.marker["checksum"]
    assert "samples:" in summary(url) and "band" in summary(url)


def test_scene_reassembles(tmp_path, client):
    """SICD scenes cut into tiles go back together exactly from scene/tile_y/tile_x."""
    m = make_raw("sicd", tmp_path / "raw", seed=5)
    url = str(tmp_path / "sicd.zarr")
    convert(
        "sicd", str(tmp_path / "raw"), url, client=client, tile_size=m.tile_size, progress=False
    )
    ds = open_cube(url)
    it = m.items[0]
    sel = np.flatnonzero(ds["scene"].values == it.scene)
    h, w = it.label.shape
    canvas = np.full((h + m.tile_size, w + m.tile_size), -9, dtype=np.int16)
    for s in sel:
        y, x = int(ds["tile_y"].values[s]), int(ds["tile_x"].values[s])
        canvas[y : y + m.tile_size, x : x + m.tile_size] = ds["label"].values[s]
    expect = it.label.copy()
    expect[~np.isfinite(it.image).all(axis=0)] = CUBE_IGNORE_INDEX
    np.testing.assert_array_equal(canvas[:h, :w], expect)
    covered = -(-h // m.tile_size) * m.tile_size
    assert (canvas[h:covered, :w] == CUBE_IGNORE_INDEX).all()  # padding is ignore, never a class


def test_s3_roundtrip_and_sharding(tmp_path, client, s3_bucket):
    """Convert to s3:// on a real S3 server (moto), sharded, and read back with xarray.open_zarr."""
    bucket, opts = s3_bucket
    m = make_raw("gld", tmp_path / "raw", n={"train": 6, "val": 2, "test": 2}, seed=2)
    url = f"s3://{bucket}/gld.zarr"
    convert(
        "gld",
        str(tmp_path / "raw"),
        url,
        client=client,
        tile_size=m.tile_size,
        shard_samples=4,
        storage_options=opts,
        progress=False,
    )
    local = str(tmp_path / "gld.zarr")
    convert(
        "gld",
        str(tmp_path / "raw"),
        local,
        client=client,
        tile_size=m.tile_size,
        shard_samples=4,
        progress=False,
    )
    ds = xr.open_zarr(url, storage_options=opts, decode_coords="all")
    assert COMPLETE_ATTR in ds.attrs
    assert ds["image"].encoding.get("shards") == (4, 10, m.tile_size, m.tile_size)
    np.testing.assert_array_equal(ds["image"].values, open_cube(local)["image"].values)
    np.testing.assert_array_equal(
        ds["label"].values, np.stack([e[5] for e in expected_tiles(m, m.tile_size)])
    )
    assert ds.attrs[COMPLETE_ATTR]["checksum"] == open_cube(local).attrs[COMPLETE_ATTR]["checksum"]


def test_s3_raw_input(tmp_path, client, s3_bucket):
    """Raw files read through fsspec from s3:// too."""
    import s3fs

    bucket, opts = s3_bucket
    m = make_raw("glid", tmp_path / "raw", n={"train": 3, "val": 1, "test": 1}, seed=4)
    fs = s3fs.S3FileSystem(**opts)
    fs.put(str(tmp_path / "raw"), f"{bucket}/raw", recursive=True)
    url = str(tmp_path / "glid.zarr")
    convert(
        "glid",
        f"s3://{bucket}/raw",
        url,
        client=client,
        tile_size=m.tile_size,
        raw_storage_options=opts,
        progress=False,
    )
    np.testing.assert_array_equal(
        open_cube(url)["image"].values, np.stack([e[4] for e in expected_tiles(m, m.tile_size)])
    )


def _progress(url):
    try:
        return np.asarray(store.open_group(url, "r")["progress"][:])
    except Exception:
        return None


def test_resume_after_kill(tmp_path, client):
    """A conversion killed by SIGKILL mid-way resumes, redoes only missing blocks, and gives the
    same cube."""
    m = make_raw("gld", tmp_path / "raw", n={"train": 60, "val": 10, "test": 10}, size=96, seed=7)
    url = str(tmp_path / "killed.zarr")
    cmd = [
        sys.executable,
        "-m",
        "cryocube.cli",
        "convert",
        "gld",
        "--raw",
        str(tmp_path / "raw"),
        "--out",
        url,
        "--tile",
        str(m.tile_size),
        "--block",
        "1",
        "--workers",
        "1",
        "--quiet",
    ]
    proc = subprocess.Popen(
        cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    deadline = time.time() + 120
    done = None
    while time.time() < deadline and proc.poll() is None:
        p = _progress(url)
        if p is not None and 3 <= p.sum() < p.size:
            done = int(p.sum())
            break
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert done is not None, (
        f"conversion was not caught mid-way: {proc.stdout.read().decode()[-2000:]}"
    )
    with pytest.raises(IncompleteCubeError):
        open_cube(url)
    r = convert(
        "gld",
        str(tmp_path / "raw"),
        url,
        client=client,
        tile_size=m.tile_size,
        block_samples=1,
        progress=False,
    )
    assert 0 < r.blocks_written < r.blocks_total  # resumed, not restarted
    fresh = convert(
        "gld",
        str(tmp_path / "raw"),
        str(tmp_path / "fresh.zarr"),
        client=client,
        tile_size=m.tile_size,
        block_samples=1,
        progress=False,
    )
    assert r.marker["checksum"] == fresh.marker["checksum"]
    xr.testing.assert_equal(
        open_cube(url)[["image", "label", "class_fraction"]].load(),
        open_cube(str(tmp_path / "fresh.zarr"))[["image", "label", "class_fraction"]].load(),
    )


BAD = [
    ("gld", "truncate"),
    ("gld", "header"),
    ("gld", "missing_mask"),
    ("gld", "missing_image"),
    ("gld", "size_mismatch"),
    ("gld", "band_count"),
    ("gld", "label_value"),
    ("gsdd", "nan"),
    ("glid", "label_value"),
    ("caffe", "label_value"),
    ("caffe", "truncate"),
]


@pytest.mark.parametrize("dataset,kind", BAD)
def test_bad_input_names_the_file(tmp_path, client, dataset, kind):
    m = make_raw(dataset, tmp_path / "raw", seed=1)
    bad = corrupt(m, kind)
    url = str(tmp_path / "bad.zarr")
    with pytest.raises(ConvertError) as e:
        convert(
            dataset,
            str(tmp_path / "raw"),
            url,
            client=client,
            tile_size=m.tile_size,
            progress=False,
        )
    assert os.path.basename(bad) in str(e.value) or os.path.splitext(os.path.basename(bad))[
        0
    ] in str(e.value)
    if store.exists(url):  # failed during writing: never reported complete
        with pytest.raises(IncompleteCubeError):
            open_cube(url)


def test_skip_bad_samples_records_them(tmp_path, client):
    m = make_raw("gld", tmp_path / "raw", seed=1)
    bad = corrupt(m, "label_value", index=1)
    url = str(tmp_path / "skip.zarr")
    r = convert(
        "gld",
        str(tmp_path / "raw"),
        url,
        client=client,
        tile_size=m.tile_size,
        on_error="skip",
        progress=False,
    )
    assert r.skipped == 1
    ds = open_cube(url)
    skipped = ds.attrs["skipped_samples"]
    assert (
        len(skipped) == 1
        and os.path.basename(bad).split(".")[0] in skipped[0]["source"] + skipped[0]["reason"]
    )
    assert ds["split"].values[skipped[0]["sample"]] == "skipped"
    assert (ds["label"].values[skipped[0]["sample"]] == CUBE_IGNORE_INDEX).all()


def test_unwritable_output(tmp_path, client):
    make_raw("glid", tmp_path / "raw", seed=1)
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(UserError, match="cannot write"):
        convert(
            "glid",
            str(tmp_path / "raw"),
            str(tmp_path / "file" / "cube.zarr"),
            client=client,
            tile_size=64,
            progress=False,
        )


def test_different_inputs_refused_without_overwrite(tmp_path, client):
    m = make_raw("glid", tmp_path / "raw", n={"train": 2, "val": 1, "test": 1}, seed=1)
    url = str(tmp_path / "c.zarr")
    convert(
        "glid", str(tmp_path / "raw"), url, client=client, tile_size=m.tile_size, progress=False
    )
    with pytest.raises(UserError, match="overwrite"):
        convert(
            "glid",
            str(tmp_path / "raw"),
            url,
            client=client,
            tile_size=m.tile_size,
            block_samples=1,
            progress=False,
        )
    r = convert(
        "glid",
        str(tmp_path / "raw"),
        url,
        client=client,
        tile_size=m.tile_size,
        block_samples=1,
        overwrite=True,
        progress=False,
    )
    assert r.blocks_written == r.blocks_total


def test_block_statistics_merge_exactly_even_for_low_contrast_bands():
    """Moments per sample (float32 passes) merged in float64 keep a band of 10000 +- 0.5 exact:
    sum/sum-of-squares in float32 would lose its variance to cancellation."""
    from cryocube.cube import combine_stats, partial_stats

    rng = np.random.default_rng(0)
    img = (10000 + rng.uniform(-0.5, 0.5, size=(12, 2, 64, 64))).astype(np.float32)
    img[:, 1] = rng.normal(3, 2, size=(12, 64, 64))
    lbl = rng.integers(0, 2, size=(12, 64, 64)).astype(np.int16)
    lbl[3, :10] = CUBE_IGNORE_INDEX  # partly valid sample
    lbl[5] = CUBE_IGNORE_INDEX  # no valid pixel at all
    use = np.ones(12, bool)
    use[7] = False  # not train
    blocks = [
        partial_stats(img[s], lbl[s], use[s]) for s in (slice(0, 5), slice(5, 9), slice(9, 12))
    ]
    st = combine_stats(np.stack(blocks))
    px = np.concatenate(
        [img[i][:, lbl[i] >= 0].astype(np.float64) for i in range(12) if use[i]], axis=1
    )
    assert st["count"][0] == px.shape[1]
    np.testing.assert_allclose(st["mean"], px.mean(axis=1), rtol=1e-12)
    np.testing.assert_allclose(st["std"], px.std(axis=1), rtol=1e-6)
    np.testing.assert_array_equal(st["min"], px.min(axis=1))
    np.testing.assert_array_equal(st["max"], px.max(axis=1))


@pytest.mark.parametrize("compressor", ["none", "zstd"])
def test_compressor_changes_bytes_not_content(tmp_path, client, compressor):
    import zarr

    make_raw("glid", tmp_path / "raw", n={"train": 3, "val": 1, "test": 1}, seed=2)
    a = convert(
        "glid", str(tmp_path / "raw"), str(tmp_path / "lz4.zarr"), client=client, progress=False
    )
    b = convert(
        "glid",
        str(tmp_path / "raw"),
        str(tmp_path / "b.zarr"),
        client=client,
        compressor=compressor,
        progress=False,
    )
    # the checksum is over pixels, not stored bytes
    assert a.marker["checksum"] == b.marker["checksum"]
    xr.testing.assert_equal(
        open_cube(str(tmp_path / "lz4.zarr"))[["image", "label"]],
        open_cube(str(tmp_path / "b.zarr"))[["image", "label"]],
    )
    codecs = [
        type(c).__name__ for c in zarr.open_array(str(tmp_path / "b.zarr" / "image")).compressors
    ]
    assert codecs == ([] if compressor == "none" else ["BloscCodec"])
    assert open_cube(str(tmp_path / "b.zarr")).attrs["compressor"] == compressor
    # resuming must not mix codecs
    with pytest.raises(UserError, match="different inputs or options"):
        convert(
            "glid", str(tmp_path / "raw"), str(tmp_path / "b.zarr"), client=client, progress=False
        )


def test_workers_tune_malloc_for_large_buffers(client):
    """Dask's MALLOC_TRIM_THRESHOLD_ freezes glibc's mmap threshold on workers; block tasks lift
    it."""
    from cryocube.cluster import tune_malloc

    env = client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_"))
    assert set(env.values()) == {"65536"}  # what distributed sets: the reason tune_malloc exists
    assert all(client.run(tune_malloc).values())


def test_label_lookup_table_matches_the_general_remap():
    """The one-pass table lookup (integer labels) and the searchsorted path agree, errors
    included."""
    from cryocube.catalog import Layout
    from cryocube.convert.writer import remap_labels

    lay = Layout(
        name="t",
        reader="paired_raster",
        label_map={0: 0, 64: 1, 127: 2, 254: 3},
        ignore_values=(255,),
    )
    raw = np.array([[0, 64, 127], [254, 255, 0]], dtype=np.uint8)
    want = np.array([[0, 1, 2], [3, CUBE_IGNORE_INDEX, 0]], dtype=np.int16)
    np.testing.assert_array_equal(remap_labels(raw, lay, "x.png"), want)  # table path
    np.testing.assert_array_equal(remap_labels(raw.astype(np.int64) - 0, lay, "x.png"), want)
    # float labels
    np.testing.assert_array_equal(remap_labels(raw.astype(np.float32), lay, "x.png"), want)
    for bad in (
        np.array([[0, 65]], np.uint8),
        np.array([[0, 300]], np.int32),
        np.array([[-3, 0]], np.int32),
    ):
        with pytest.raises(
            ConvertError, match=r"x\.png: label values \[(65|300|-3)\] are not in the t mapping"
        ):
            remap_labels(bad, lay, "x.png")


def test_header_reads_spread_over_workers_keep_order_and_errors(tmp_path, client, monkeypatch):
    from cryocube.convert import open_reader, writer

    m = make_raw("gld", tmp_path / "raw", n={"train": 6, "val": 2, "test": 3}, seed=4)
    r = open_reader(load_dataset("gld"), "cryobench")
    # 11 files, 2 workers: 5 chunks on the workers
    monkeypatch.setattr(writer, "HEADERS_PER_TASK", 2)
    assert r.scan(str(m.root), map_headers=writer.worker_mapper(client)) == r.scan(str(m.root))
    bad = corrupt(m, "header", index=5)
    with pytest.raises(ConvertError, match=os.path.basename(bad)):
        r.scan(str(m.root), map_headers=writer.worker_mapper(client))
