"""Shared fixtures: a real Dask LocalCluster with worker processes and a real S3 server on
loopback."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
# reports read measured compute profiles from here: an empty folder, so no developer's cache changes
# a test
os.environ["CRYOCUBE_PROFILES"] = tempfile.mkdtemp(prefix="cryocube-profiles-")
# removed when the session ends (every test session used to leave one behind in /tmp)
atexit.register(shutil.rmtree, os.environ["CRYOCUBE_PROFILES"], True)


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread in the test process: on shared cores two OpenMP threads stall at every op
    barrier (measured 1.7x slower); Dask workers already run with one."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def client():
    """LocalCluster with 2 worker processes (1 thread each), shared by the session's tests."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=":0",
        memory_limit="4GB",
    )
    c = Client(cluster)
    yield c
    c.close()
    try:  # on a loaded 2-core machine workers can take longer than the default to stop
        cluster.close(timeout=120)
    except TimeoutError:
        pass


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server mode on 127.0.0.1 (real HTTP, real s3fs/zarr code path)."""
    from moto.server import ThreadedMotoServer

    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        os.environ.setdefault(k, v)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture()
def s3_bucket(s3_server):
    """A fresh bucket; returns (bucket name, storage options for s3fs)."""
    import uuid

    import boto3

    name = f"cube-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").create_bucket(Bucket=name)
    opts = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": s3_server, "region_name": "us-east-1"},
    }
    return name, opts


@pytest.fixture()
def http_dir(tmp_path):
    """A real HTTP server on 127.0.0.1 serving tmp_path/www; returns (folder, base URL)."""
    import functools
    import http.server
    import threading

    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.fixture()
def lab_tasks(tmp_path, monkeypatch):
    """A lab's own catalog folder (CRYOCUBE_CATALOGS) with an empty tasks/ for task files written by
    a test."""
    root = tmp_path / "labcat"
    (root / "tasks").mkdir(parents=True)
    monkeypatch.setenv("CRYOCUBE_CATALOGS", str(root))
    return root / "tasks"


@pytest.fixture(scope="session")
def tile_cube(tmp_path_factory, client):
    """Factory of converted tile cubes of synthetic raw data, each made once per session per
    (dataset, split sizes, seed): tests read them and copy one before damaging it."""
    from cryocube.convert.writer import convert
    from cryocube.synthetic import make_raw

    made: dict[tuple, str] = {}

    def make(dataset: str = "glid", *, train: int, val: int, test: int, seed: int) -> str:
        key = (dataset, train, val, test, seed)
        if key not in made:
            root = tmp_path_factory.mktemp(f"{dataset}-cube")
            n = {"train": train, "val": val, "test": test}
            m = make_raw(dataset, root / "raw", n=n, seed=seed)
            url = str(root / f"{dataset}.zarr")
            convert(
                dataset,
                str(root / "raw"),
                url,
                client=client,
                tile_size=m.tile_size,
                progress=False,
            )
            made[key] = url
        return made[key]

    return make


@pytest.fixture(scope="session")
def insar_cube(tmp_path_factory, client):
    """Factory of converted interferogram cubes (synthetic pairs of `size` px), each made once per
    session per (n, size, seed); returns (url, the generator's manifest of true values)."""
    from cryocube.convert.writer import convert
    from cryocube.insar_synthetic import make_interferograms

    made: dict[tuple, tuple] = {}

    def make(*, n: int, size: int, seed: int) -> tuple:
        if (n, size, seed) not in made:
            d = tmp_path_factory.mktemp("insar-cube")
            m = make_interferograms(d / "raw", n=n, size=size, seed=seed)
            url = str(d / "insar.zarr")
            convert("insar", str(d / "raw"), url, client=client, progress=False)
            made[(n, size, seed)] = (url, m)
        return made[(n, size, seed)]

    return make


@pytest.fixture(scope="session")
def embedding_plan():
    """`plan_embedding` as `cryocube embed` calls it: the benchmark's embedding recipe with `sets`
    (recipe fields, as --set gives them) and a context of `ctx`'s fields (weights, random)."""
    from cryocube.embeddings.embed import plan_embedding
    from cryocube.families import PlanContext
    from cryocube.families.recipes import load_recipe

    def plan(source: str, cube, *, dim=None, seed: int = 0, ctx: dict | None = None, **sets):
        r = load_recipe(None, sets, families=("embedding",)).of("embedding")
        return plan_embedding(source, cube, r, PlanContext(**(ctx or {})), dim=dim, seed=seed)

    return plan


@pytest.fixture()
def run_with_plugin(tmp_path):
    """Runs Python `code` in a fresh process beside a real distribution `name` (its package's
    `__init__` is `source`; its dist-info declares it in the entry-point `group`); returns the
    CompletedProcess. Argument strings after the code are its sys.argv[1:]."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    def run(name: str, group: str, source: str, code: str, *argv: str):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(source)
        info = tmp_path / f"{name}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[{group}]\n{name} = {name}\n")
        root = Path(__file__).resolve().parents[1]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(root)]))
        cmd = [sys.executable, "-c", code, *argv]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)

    return run
