"""`--cluster local` (LocalCluster of worker processes) and `--cluster cuda` (dask-cuda, one worker per GPU)."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from .registry import ClusterError, ClusterRequest, backend, dashboard_kwargs, own_client, own_cluster, require
from .runtime import GPU, host_cores, thread_env

if TYPE_CHECKING:
    from distributed import Client

MAX_LOCAL_WORKERS = 4  # beyond this, fewer processes with more torch threads each use memory better


@backend("local")
def local(req: ClusterRequest, stack: contextlib.ExitStack) -> "Client":
    """Worker processes (not threads): torch and the GIL, and crash isolation per worker."""
    from distributed import LocalCluster

    cores = host_cores()
    tpw = req.threads_per_worker or 1
    n = req.n_workers or max(1, min(cores // tpw, MAX_LOCAL_WORKERS))
    threads = req.torch_threads or max(1, cores // (n * tpw))
    cluster = own_cluster(stack, LocalCluster(
        n_workers=n, threads_per_worker=tpw, processes=True, memory_limit=req.memory_limit or "auto",
        env=thread_env(threads), **dashboard_kwargs(req.dashboard)))
    return own_client(stack, cluster, req.torch_threads)


@backend("cuda")
def cuda(req: ClusterRequest, stack: contextlib.ExitStack) -> "Client":
    """One worker process per visible GPU, each advertising {"GPU": 1} for the engine's annotations."""
    dask_cuda = require("dask_cuda", "cuda", "cuda")
    from dask_cuda.utils import get_n_gpus

    try:
        n_gpus = get_n_gpus()
    except Exception as e:  # pynvml raises NVMLError_LibraryNotFound/DriverNotLoaded/... without a GPU
        raise ClusterError(f"--cluster cuda: LocalCUDACluster finds no GPU ({type(e).__name__}: {e}); "
                           "this machine has no visible NVIDIA GPU/driver: use --cluster local") from e
    if n_gpus < 1:
        raise ClusterError("--cluster cuda: LocalCUDACluster finds no GPU (CUDA_VISIBLE_DEVICES is empty); "
                           "use --cluster local")
    n = req.n_workers or n_gpus
    if n > n_gpus:
        raise ClusterError(f"--cluster cuda: {n} workers asked but {n_gpus} GPUs visible (one worker per GPU)")
    tpw = req.threads_per_worker or 1
    cluster = stack.enter_context(dask_cuda.LocalCUDACluster(
        n_workers=n, threads_per_worker=tpw, memory_limit=req.memory_limit or "auto",
        resources={GPU: 1}, pre_import=["torch"], **dashboard_kwargs(req.dashboard)))
    return own_client(stack, cluster, req.torch_threads)
