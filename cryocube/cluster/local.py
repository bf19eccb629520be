"""`--cluster local` (LocalCluster of worker processes) and `--cluster cuda` (one per GPU)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading

from distributed import Client, LocalCluster
from distributed.system import MEMORY_LIMIT

from .registry import (
    ClusterError,
    ClusterRequest,
    backend,
    dashboard_kwargs,
    own_client,
    own_cluster,
    require,
)
from .runtime import GPU, FastExit, host_cores, thread_env
from .worker_logs import LOCAL_WORKER

MAX_LOCAL_WORKERS = 4  # beyond this, fewer processes with more torch threads each use memory better


def local_sizing(
    n_workers: int | None,
    threads_per_worker: int | None,
    torch_threads: int | None,
    parallel: int | None = None,
    cores: int | None = None,
) -> tuple[int, int, int]:
    """(workers, Dask threads, torch threads per worker) fitting the cores, fewer workers for fewer
    `parallel` runs; never from the load: the same plan gets the same threads, and so bits."""
    cores = cores or host_cores()
    tpw = threads_per_worker or 1
    n = n_workers or max(1, min(cores // tpw, MAX_LOCAL_WORKERS, parallel or MAX_LOCAL_WORKERS))
    return n, tpw, torch_threads or max(1, cores // (n * tpw))


def worker_memory(memory_limit: str | None, n_workers: int) -> str | int:
    """`--memory-limit`, else the machine's memory shared among the workers (Dask's "auto" gave a
    one-run plan's one-thread worker, computing on every core, half the machine)."""
    if memory_limit and memory_limit != "auto":
        return memory_limit
    return int(MEMORY_LIMIT // max(1, n_workers))


@contextlib.contextmanager
def ctrl_c_stays_here():
    """Workers spawned inside ignore SIGINT: on Ctrl-C only this process, closing them, acts."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _started(cls, req: ClusterRequest, n: int, tpw: int, **kw):
    """A cluster of this machine's processes, sized, with its dashboard, Ctrl-C kept here."""
    kw |= dashboard_kwargs(req.dashboard) | {"memory_limit": worker_memory(req.memory_limit, n)}
    with ctrl_c_stays_here():
        return cls(n_workers=n, threads_per_worker=tpw, **kw)


@backend("local")
def local(req: ClusterRequest, stack: contextlib.ExitStack) -> Client:
    """Worker processes (not threads): torch and the GIL, and crash isolation per worker."""
    n, tpw, threads = local_sizing(
        req.n_workers, req.threads_per_worker, req.torch_threads, req.parallel
    )
    env = {**thread_env(threads), LOCAL_WORKER: "1"}
    cluster = own_cluster(stack, _started(LocalCluster, req, n, tpw, processes=True, env=env))
    client = own_client(stack, cluster, threads)
    # its processes are this command's alone: they end without Python's finalization
    client.register_plugin(FastExit(), name=FastExit.name)
    return client


def hidden_gpus() -> str | None:
    """Why CUDA_VISIBLE_DEVICES hides every GPU, or None ("" and "-1" would count as one GPU)."""
    v = os.environ.get("CUDA_VISIBLE_DEVICES")
    if v is None:
        return None
    entries = [e.strip() for e in v.split(",")]
    if not any(entries):
        return "CUDA_VISIBLE_DEVICES is set and empty"
    # CUDA stops at the first invalid index
    if entries[0].lstrip("-").isdigit() and int(entries[0]) < 0:
        return f"CUDA_VISIBLE_DEVICES={v!r} starts with a negative index"
    return None


@backend("cuda")
def cuda(req: ClusterRequest, stack: contextlib.ExitStack) -> Client:
    """One worker process per visible GPU, each advertising {"GPU": 1} for the engine."""
    if hidden := hidden_gpus():
        raise ClusterError(
            f"--cluster cuda: {hidden}, which hides every GPU: unset it, name GPUs (e.g. 0,1) "
            "or use --cluster local"
        )
    dask_cuda = require("dask_cuda", "cuda", "cuda")
    from dask_cuda.utils import get_n_gpus

    try:
        n_gpus = get_n_gpus()
    # pynvml raises NVMLError_LibraryNotFound/DriverNotLoaded/... without a GPU
    except Exception as e:
        raise ClusterError(
            f"--cluster cuda: LocalCUDACluster finds no GPU ({type(e).__name__}: {e}); "
            "this machine has no visible NVIDIA GPU/driver: use --cluster local"
        ) from e
    if n_gpus < 1:
        raise ClusterError("--cluster cuda: LocalCUDACluster finds no GPU; use --cluster local")
    n = req.n_workers or n_gpus
    if n > n_gpus:
        raise ClusterError(
            f"--cluster cuda: {n} workers asked but {n_gpus} GPUs visible (one worker per GPU)"
        )
    tpw = req.threads_per_worker or 1
    made = _started(
        dask_cuda.LocalCUDACluster, req, n, tpw, resources={GPU: 1}, pre_import=["torch"]
    )
    cluster = stack.enter_context(made)
    return own_client(stack, cluster, req.torch_threads or max(1, host_cores() // (n * tpw)))
