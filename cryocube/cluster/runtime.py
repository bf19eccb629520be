"""What a task needs to know about the worker it runs on: memory allocator, device, torch threads.

Runs inside worker processes (and in a plain process for one-machine use). A torch task's thread
count is fixed when it starts, from its run's own settings (`torch_task`): the float reduction
order, and so the result, must not depend on what else runs. Oversubscription is avoided where the
cluster is sized: workers x Dask threads x torch threads fit the cores (cluster/local.py,
`TorchThreads`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys

from distributed.diagnostics.plugin import WorkerPlugin

GPU = "GPU"  # the abstract worker resource that GPU tasks request
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
# the worker's configured torch threads (set by `TorchThreads`)
THREADS_VAR = "CRYOCUBE_TORCH_THREADS"
MALLOC_MMAP_THRESHOLD = 32 * 2**20  # glibc's ceiling: per-sample arrays come from the reusable heap
MALLOC_TRIM_THRESHOLD = 256 * 2**20  # freed heap a worker may keep instead of faulting it in again


def thread_env(threads: int) -> dict[str, str]:
    """The OpenMP/MKL/OpenBLAS variables that fix a worker's math threads; they only take effect
    when set before torch is first imported."""
    return {v: str(threads) for v in THREAD_VARS}


@functools.cache
def tune_malloc() -> bool:
    """Let glibc reuse freed memory for this worker's large, short-lived numpy/torch buffers.

    Dask starts workers with MALLOC_TRIM_THRESHOLD_=64KiB, which also freezes glibc's adaptive mmap
    threshold: every array over 128 KiB becomes a fresh mmap whose pages are faulted in and zeroed,
    then unmapped. Conversion blocks ran 2x slower for it (benchmarks/bench_convert.py). Called at
    the start of heavy tasks, so it also holds on clusters cryocube did not create. False off glibc.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(libc.mallopt(m_mmap_threshold, MALLOC_MMAP_THRESHOLD)) and bool(
        libc.mallopt(m_trim_threshold, MALLOC_TRIM_THRESHOLD)
    )


def device_for_worker() -> str:
    """The torch device for the current task: "cuda" where this process sees a GPU, else "cpu"."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def host_cores() -> int:
    """CPUs this process may use (affinity- and cgroup-aware, as Dask counts them)."""
    from dask.system import CPU_COUNT

    return max(1, int(CPU_COUNT))


def configured_threads(dask_worker=None) -> int:
    """The torch threads this worker was configured with when it started: `TorchThreads` (cryocube's
    clusters), else the OMP_NUM_THREADS its launcher set (Dask's nanny sets 1), else the host's
    cores divided among the worker's Dask threads. Never the load: the same cluster gives the same
    answer.
    """
    for var in (THREADS_VAR, "OMP_NUM_THREADS"):
        v = os.environ.get(var, "")
        if v.isdigit() and int(v) >= 1:
            return int(v)
    nthreads = 1
    try:
        from distributed import get_worker

        nthreads = (dask_worker or get_worker()).state.nthreads
    except ValueError:  # not in a worker: one process, one task at a time
        pass
    return max(1, host_cores() // max(1, nthreads))


@contextlib.contextmanager
def torch_task(threads: int | None = None):
    """What every torch task does first on its worker: malloc tuning, a fixed thread count, torch's
    deterministic algorithms; yields (device, threads).

    `threads` is the run's own (planned from its recipe, part of its identity on CPU); None (tasks
    no run's result depends on, e.g. reading an encoder's shapes): the worker's configured threads.
    The count stays for the whole task, so the float reduction order never follows what else runs.
    """
    import torch

    tune_malloc()
    n = int(threads or configured_threads())
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield device_for_worker(), n


class TorchThreads(WorkerPlugin):
    """Fix each worker's torch thread count when it starts, without importing torch where no task
    needs it (conversion workers): the OMP/MKL variables are set before torch's first import, and
    `configured_threads` (the default threads of the runs planned on this cluster) reads it back.

    threads=None: the worker's CPU share, i.e. its container's CPUs (cgroup-aware) / its Dask
    threads; right on Kubernetes/gateway pods where one worker owns its pod. Backends that put
    several workers on one host (local, cuda) pass their share of the cores.
    """

    name = "cryocube-torch-threads"

    def __init__(self, threads: int | None = None):
        self.threads = threads

    def setup(self, worker) -> None:
        """Runs in each worker as it starts or joins: the variables before torch's first import, or
        torch's own count where it is already imported (dask-cuda's pre_import)."""
        n = self.threads or max(1, host_cores() // max(1, worker.state.nthreads))
        # read by torch/OpenMP when first imported
        os.environ.update({**thread_env(n), THREADS_VAR: str(n)})
        # already imported (e.g. dask-cuda's pre_import): set it directly
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(n)


def _exit_now() -> None:
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


class FastExit(WorkerPlugin):
    """A local worker process ends without Python's finalization, which takes 1.2 s once torch and
    timm are loaded (measured: `import torch, timm` exits in 4.2 s, 3.0 s with os._exit) and which
    every command's cluster close waits for. It runs as the first exit handler (the last
    registered), once the worker has closed: nothing it holds outlives its tasks."""

    name = "cryocube-fast-exit"

    def setup(self, worker) -> None:
        """Registers the exit last, so that handlers registered before it are the ones skipped."""
        import atexit

        atexit.register(_exit_now)
