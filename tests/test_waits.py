"""Waiting on a loaded machine: patient timeouts on the clusters cryocube opens, a timeout that says
what it waited for, a close problem that never turns finished work into a failure, and refusals
before any cluster.
"""

from __future__ import annotations

import contextlib
import time

import dask
import pytest

from cryocube.cli import main
from cryocube.cluster import open_cluster
from cryocube.cluster.timeouts import close_quietly, explain_timeout


def _sleep(s: float) -> float:
    time.sleep(s)
    return s


def test_a_timeout_names_what_it_waited_for(client):
    with pytest.raises(TimeoutError) as workers:
        client.wait_for_workers(9, timeout=0.2)
    assert "a worker to start" in explain_timeout(workers.value) and "--workers" in explain_timeout(
        workers.value
    )
    fut = client.submit(_sleep, 3, pure=False)
    with pytest.raises(TimeoutError) as task:
        fut.result(timeout=0.2)
    assert "a task's result" in explain_timeout(task.value)
    fut.cancel()


def test_a_close_that_times_out_is_a_warning(client):
    stack = contextlib.ExitStack()
    stack.callback(client.wait_for_workers, 9, timeout=0.2)  # a real wait that ends in TimeoutError
    with pytest.warns(
        UserWarning, match="did not close cleanly .*what the command wrote is complete"
    ):
        close_quietly(stack, "local")


def test_clusters_cryocube_opens_wait_longer(client):
    before = dask.config.get("distributed.comm.timeouts.connect")
    with open_cluster(client.scheduler.address, quiet=True):
        assert dask.config.get("distributed.comm.timeouts.connect") == "120s"
        assert dask.config.get("distributed.comm.timeouts.tcp") == "120s"
    assert dask.config.get("distributed.comm.timeouts.connect") == before
    # the user's own setting stands
    with dask.config.set({"distributed.comm.timeouts.connect": "7s"}):
        with open_cluster(client.scheduler.address, quiet=True):
            assert dask.config.get("distributed.comm.timeouts.connect") == "7s"


def _worker_config() -> dict:
    keys = ("distributed.admin.tick.interval", "distributed.worker.profile.enabled")
    return {k: dask.config.get(k) for k in keys}


def _config_of_a_local_worker() -> dict:
    with open_cluster("local", quiet=True, n_workers=1) as c:
        return c.submit(_worker_config, pure=False).result()


def test_the_workers_of_a_local_cluster_wake_less_often(monkeypatch):
    # the event-loop tick and the profiler stall torch's thread team on every core
    got = _config_of_a_local_worker()
    assert got == {
        "distributed.admin.tick.interval": "1s",
        "distributed.worker.profile.enabled": False,
    }, got
    # the user's own setting stands, even where it is Dask's default
    monkeypatch.setenv("DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED", "True")
    with dask.config.set({"distributed.admin.tick.interval": "50ms"}):
        got = _config_of_a_local_worker()
    assert got == {
        "distributed.admin.tick.interval": "50ms",
        "distributed.worker.profile.enabled": True,
    }, got


def test_an_unknown_raw_layout_is_refused_before_a_cluster(tmp_path, capsys):
    raw = tmp_path / "raw"
    (raw / "something").mkdir(parents=True)
    (raw / "something" / "a.txt").write_text("not a dataset")
    # no scheduler at that address: the layout error must come before any cluster is reached
    rc = main(
        [
            "convert",
            "glid",
            "--raw",
            str(raw),
            "--out",
            str(tmp_path / "c.zarr"),
            "--cluster",
            "tcp://127.0.0.1:9",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "does not look like any known glid layout" in err and str(raw) in err, err
    assert len(err.strip().splitlines()) == 1
    rc = main(
        [
            "convert",
            "glid",
            "--raw",
            str(raw),
            "--out",
            str(tmp_path / "c.zarr"),
            "--layout",
            "nope",
            "--cluster",
            "tcp://127.0.0.1:9",
        ]
    )
    assert rc == 2 and "has no layout 'nope'" in capsys.readouterr().err


def _task_keys(dask_scheduler) -> list[str]:
    return [str(k) for k in dask_scheduler.tasks]


def _held(name: str) -> bool:
    from distributed import Event

    return Event(name).wait(600)


def test_a_cubes_labels_are_read_here_while_every_worker_is_busy(client, tile_cube):
    """A notebook's default Client whose workers are all busy (or paused for memory): opening a
    cube and reading its coordinates and planning facts puts no task on the cluster (a run's
    record waited on its scenes for ever when they were read through it)."""
    from concurrent.futures import ThreadPoolExecutor

    from distributed import Event

    from cryocube.cube import as_text, cube_info, open_cube

    cube = tile_cube("glid", train=8, val=2, test=2, seed=13)
    name = f"cryocube-busy-{time.time_ns()}"
    workers = list(client.scheduler_info(n_workers=-1)["workers"])
    busy = [client.submit(_held, name, pure=False, workers=[w]) for w in workers]
    pool = ThreadPoolExecutor(1)
    try:
        while len([k for ks in client.processing().values() for k in ks]) < len(workers):
            time.sleep(0.05)

        def read():
            ds = open_cube(cube)
            return ds, as_text(ds["source"].values), cube_info(cube)

        before = set(client.run_on_scheduler(_task_keys))
        # through the cluster, the reads would wait for the workers: here, never
        ds, source, info = pool.submit(read).result(timeout=120)
        assert len(source) == ds.sizes["sample"] == info.n_samples == 12
        assert isinstance(ds["image"].data, dask.array.Array)  # pixels stay the cluster's
        assert set(client.run_on_scheduler(_task_keys)) - before == set()
    finally:
        Event(name, client=client).set()
        client.gather(busy)
        pool.shutdown()
