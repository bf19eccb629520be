"""Memory on real local clusters: a worker's limit follows the plan, each run records its own peak,
a run that cannot fit is refused before it starts, Dask's memory warnings are one line of
cryocube's, and a busy dashboard port costs no warning."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from cryocube.cluster import open_cluster
from cryocube.cluster.registry import DASHBOARD_PORT
from cryocube.cluster.runtime import rss_bytes, task_boundary, tune_malloc
from cryocube.engine.evaluate import check_memory, cluster_context, evaluate
from cryocube.engine.plan import plan_runs
from cryocube.errors import UserError
from cryocube.families import RunSpec
from cryocube.families.recipes import load_recipe

DASK_PORT_WARNING = ("already in use", "Perhaps you already have a cluster", "Hosting the HTTP")


def _limits(client) -> list[int]:
    return [w["memory_limit"] for w in client.scheduler_info(n_workers=-1)["workers"].values()]


def test_a_workers_memory_limit_follows_the_plan_as_its_threads_do():
    """One run: its single worker gets the machine's memory (Dask's automatic limit gave a
    one-thread worker half of it, though the plan gives it every core); two workers share it."""
    from distributed.system import MEMORY_LIMIT

    with open_cluster("local", parallel=1, quiet=True, dashboard=False) as c:
        assert _limits(c) == [MEMORY_LIMIT]
    with open_cluster("local", n_workers=2, quiet=True, dashboard=False) as c:
        assert _limits(c) == [MEMORY_LIMIT // 2] * 2
    with open_cluster("local", parallel=1, memory_limit="1GB", quiet=True, dashboard=False) as c:
        assert _limits(c) == [10**9]


def _run(url, out, client, sets):
    cfg = load_recipe(None, ["epochs=1", "val_every=1", "normalization=cube", *sets])
    res = evaluate(
        [RunSpec("unet", url, "frozen")],
        str(out),
        cfg,
        client=client,
        progress=False,
        allow_random_weights=True,
    )
    (rec,) = res.records
    assert rec["status"] == "ok", rec.get("error")
    return rec


def test_two_runs_of_different_sizes_on_one_worker_record_their_own_peaks(tile_cube, tmp_path):
    """The larger run first, then the smaller on the same worker process: the smaller one's peak
    is its own, not the worker's lifetime high-water mark that the larger one left."""
    url = tile_cube("glid", train=4, val=1, test=1, seed=3)
    big = ["batch_size=16", "input_size=256", "decoder_channels=64"]
    small = ["batch_size=1", "input_size=32", "decoder_channels=8"]
    with open_cluster("local", n_workers=1, quiet=True, dashboard=False) as c:
        pids = set(c.run(lambda: __import__("os").getpid()).values())
        a = _run(url, tmp_path / "big", c, big)
        b = _run(url, tmp_path / "small", c, small)
        assert set(c.run(lambda: __import__("os").getpid()).values()) == pids  # one worker
    assert a["peak_memory_scope"] == b["peak_memory_scope"] == "task"
    # the big run's activations (16 x 256 px through a U-Net) are hundreds of MB over the small's
    assert b["peak_memory_mb"] < a["peak_memory_mb"] - 200, (
        a["peak_memory_mb"],
        b["peak_memory_mb"],
    )


def test_a_run_that_cannot_fit_a_worker_is_refused_before_it_starts(tile_cube, tmp_path):
    """TerraMind-L fine-tuned needs gigabytes; a 2 GB worker gets one sentence with the figure, and
    no task runs (no record, no worker restarted)."""
    url = tile_cube("glid", train=4, val=1, test=1, seed=3)
    cfg = load_recipe(None, ["epochs=1", "batch_size=4"])
    with open_cluster("local", n_workers=1, memory_limit="2GB", quiet=True, dashboard=False) as c:
        with pytest.raises(UserError) as e:
            evaluate(
                [RunSpec("terramind_large", url, "finetune")],
                str(tmp_path / "out"),
                cfg,
                client=c,
                progress=False,
                allow_random_weights=True,
            )
    msg = str(e.value)
    assert "needs at least" in msg and "GiB" in msg and "--memory-limit" in msg, msg
    need = float(msg.split("needs at least ")[1].split(" GiB")[0])
    assert need > 5  # 305 M parameters trained with AdamW
    assert (
        not (tmp_path / "out" / "results.jsonl").exists()
        or not (tmp_path / "out" / "results.jsonl").read_text().strip()
    )


def _exit_soon():
    import os
    import threading

    threading.Timer(0.2, os._exit, (1,)).start()


def test_the_check_waits_for_a_worker_its_nanny_is_restarting(tile_cube, tmp_path):
    """The only worker dies after planning (as a worker restarted for memory does): while its nanny
    starts another the scheduler lists no worker, and the check waits for it instead of passing."""
    url = tile_cube("glid", train=4, val=1, test=1, seed=3)
    cfg = load_recipe(None, ["epochs=1", "batch_size=4"])
    with open_cluster("local", n_workers=1, memory_limit="2GB", quiet=True, dashboard=False) as c:
        ctx = cluster_context(c, str(tmp_path / "out"), allow_random_weights=True)
        todo = plan_runs([RunSpec("terramind_large", url, "finetune")], cfg, ctx)
        (old,) = c.scheduler_info(n_workers=-1)["workers"]
        c.run(_exit_soon)
        deadline = time.monotonic() + 60
        while old in c.scheduler_info(n_workers=-1)["workers"] and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(UserError, match="needs at least"):
            check_memory(todo, c)
        assert _limits(c) == [2 * 10**9]


def test_dasks_memory_warnings_are_one_line_of_cryocubes(tmp_path):
    """A task that holds most of a small worker's limit: Dask warns every few hundred ms (unmanaged
    memory high, pausing); the worker prints one cryocube line instead."""
    code = textwrap.dedent("""
        import time
        from cryocube.cluster import open_cluster

        def hold():
            import numpy as np
            a = np.ones(330 * 2**20 // 8)  # 330 MiB, touched
            time.sleep(3)
            return float(a[-1])

        with open_cluster("local", n_workers=1, memory_limit="500MiB", quiet=True,
                          dashboard=False) as c:
            print("RESULT", c.submit(hold, pure=False).result())
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "RESULT 1.0" in r.stdout, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "memory" in ln]
    assert len(lines) == 1 and lines[0].startswith("cryocube: a worker's memory is high"), r.stderr
    assert "Unmanaged memory use is high" not in r.stderr and "Pausing" not in r.stderr


@contextlib.contextmanager
def _port_taken(port: int):
    """`port` held by another process for the block (it may be held already: then so much the
    better)."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket,sys,time\n"
            "s=socket.socket()\n"
            "try:\n"
            f"    s.bind(('', {port})); s.listen()\n"
            "except OSError:\n"
            "    pass\n"
            "print('held', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        probe = socket.socket()
        with pytest.raises(OSError):
            probe.bind(("", port))
        probe.close()
        yield
    finally:
        holder.kill()
        holder.wait()


def test_a_busy_dashboard_port_costs_no_dask_warning(tile_cube, tmp_path):
    """Port 8787 held by another process: a command prints the dashboard's other link once, in
    cryocube's cluster line, and no word of Dask's warning; a planning error stays one sentence."""
    url = tile_cube("glid", train=4, val=1, test=1, seed=3)
    with _port_taken(DASHBOARD_PORT):
        r = subprocess.run(
            [sys.executable, "-m", "cryocube.cli", "evaluate", "--cubes", url, "--models", "unet"]
            + ["--epochs", "1", "--set", "input_size=32", "--set", "decoder_channels=8"]
            + ["--allow-random-weights", "--out", str(tmp_path / "out"), "--workers", "1"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr
        assert not any(w in r.stderr for w in DASK_PORT_WARNING), r.stderr
        links = [ln for ln in r.stderr.splitlines() if "dashboard http" in ln]
        assert len(links) == 1 and links[0].startswith("cryocube: local cluster"), r.stderr
        assert f":{DASHBOARD_PORT}/" not in links[0]
        bad = tmp_path / "no-cube.zarr"
        r = subprocess.run(
            [sys.executable, "-m", "cryocube.cli", "evaluate", "--cubes", str(bad), "--models"]
            + ["unet", "--out", str(tmp_path / "o2"), "--cluster", "local", "--workers", "1"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


@task_boundary
def _fills_and_frees_the_heap(mib: int) -> int:
    tune_malloc()  # what a torch task sets: glibc keeps up to 256 MiB of freed heap
    blocks = [np.ones(2**17) for _ in range(mib)]  # 1 MiB each, from the heap
    peak = rss_bytes()
    del blocks
    return peak


def test_a_task_gives_the_heap_it_freed_back_to_the_system():
    """Dask pauses a worker by its resident memory: freed heap a finished task kept counted as use
    (a 2 GiB gateway worker paused after a U-Net fit and a notebook waited on it for ever)."""
    before = rss_bytes()
    peak = _fills_and_frees_the_heap(200)
    after = rss_bytes()
    assert peak - before > 150 * 2**20, (before, peak)  # the blocks were resident
    assert after - before < 50 * 2**20, (before, peak, after)
