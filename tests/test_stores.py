"""One round-trip suite, subclassed per store: a directory, a sharded directory, fsspec's memory
store (a threads-only cluster: its workers share the process) and S3 on moto. Each converts the same
raw GLD folder, reads it back exactly, verifies every chunk, resumes as a no-op and catches a
deleted chunk.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_convert import expected_tiles

from cryocube import store
from cryocube.convert.writer import convert
from cryocube.cube import COMPLETE_ATTR, DamagedCubeError, open_cube, read_samples, verify
from cryocube.synthetic import make_raw


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    root = tmp_path_factory.mktemp("raw")
    m = make_raw("gld", root / "gld", n={"train": 4, "val": 2, "test": 2}, seed=5)
    return m, str(root / "gld")


class StoreRoundTrip:
    shard: int | None = None

    @pytest.fixture()
    def target(self, tmp_path, client):
        """(cube url, storage options, client that can write there)."""
        return str(tmp_path / "gld.zarr"), None, client

    def test_round_trip(self, raw, target):
        m, src = raw
        url, opts, client = target
        store.register_options(url, opts)
        r = convert(
            "gld",
            src,
            url,
            client=client,
            tile_size=m.tile_size,
            shard_samples=self.shard,
            storage_options=opts,
            progress=False,
        )
        exp = expected_tiles(m, m.tile_size)
        ds = open_cube(url)
        assert COMPLETE_ATTR in ds.attrs and ds.sizes["sample"] == len(exp) == r.n_samples
        img, lab = read_samples(url, np.arange(len(exp)))  # checked against the per-sample digests
        np.testing.assert_array_equal(img, np.stack([e[4] for e in exp]))
        np.testing.assert_array_equal(lab, np.stack([e[5] for e in exp]))
        if self.shard:
            assert ds["image"].encoding.get("shards", (None,))[0] == self.shard
        rep = verify(url, progress=False)
        assert rep.ok and rep.digests
        again = convert(
            "gld",
            src,
            url,
            client=client,
            tile_size=m.tile_size,
            shard_samples=self.shard,
            storage_options=opts,
            progress=False,
        )
        assert again.blocks_written == 0  # complete: resuming is a no-op

    def test_a_deleted_chunk_is_caught(self, raw, target):
        m, src = raw
        url, opts, client = target
        store.register_options(url, opts)
        convert(
            "gld",
            src,
            url,
            client=client,
            tile_size=m.tile_size,
            shard_samples=self.shard,
            storage_options=opts,
            progress=False,
        )
        fs, path = store.fs_path(url)
        chunks = sorted(p for p in fs.find(f"{path.rstrip('/')}/image") if "/image/c/" in p)
        fs.rm(chunks[-1])
        from cryocube.cube.read import _GROUPS

        _GROUPS.clear()  # this process cached the group while converting
        rep = verify(url, progress=False)
        assert not rep.ok and rep.damaged
        with pytest.raises(DamagedCubeError):
            read_samples(url, np.arange(open_cube(url).sizes["sample"]))


class TestDirectory(StoreRoundTrip):
    pass


class TestShardedDirectory(StoreRoundTrip):
    shard = 4


class TestMemory(StoreRoundTrip):
    @pytest.fixture()
    def target(self, tmp_path):
        import uuid

        from distributed import Client, LocalCluster

        with (
            LocalCluster(
                n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
            ) as lc,
            Client(lc) as c,
        ):
            yield f"memory://cubes-{uuid.uuid4().hex[:8]}/gld.zarr", None, c


class TestS3(StoreRoundTrip):
    @pytest.fixture()
    def target(self, s3_bucket, client):
        bucket, opts = s3_bucket
        return f"s3://{bucket}/gld.zarr", opts, client
