"""What a task needs to know about the worker it runs on: memory allocator, device, torch threads.

Runs inside worker processes (and in a plain process for one-machine use). Torch threads follow the
work: a host's cores are divided among the cryocube torch tasks running on it at that moment, so a
run alone uses every core and N concurrent runs share them without oversubscription (`CoreShare`).
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from distributed.diagnostics.plugin import WorkerPlugin

GPU = "GPU"  # the abstract worker resource that GPU tasks request
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
MALLOC_MMAP_THRESHOLD = 32 * 2**20  # glibc's ceiling: per-sample arrays come from the reusable heap
MALLOC_TRIM_THRESHOLD = 256 * 2**20  # freed heap a worker may keep instead of faulting it in again


def thread_env(threads: int) -> dict[str, str]:
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
    return bool(libc.mallopt(m_mmap_threshold, MALLOC_MMAP_THRESHOLD)) and bool(libc.mallopt(m_trim_threshold, MALLOC_TRIM_THRESHOLD))


def device_for_worker() -> str:
    """The torch device for the current task: "cuda" where this process sees a GPU, else "cpu"."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def host_cores() -> int:
    """CPUs this process may use (affinity- and cgroup-aware, as Dask counts them)."""
    from dask.system import CPU_COUNT

    return max(1, int(CPU_COUNT))


class CoreShare:
    """This task's share of the host's cores: host cores // torch tasks registered on the host now.

    Each running torch task holds one file named after its process and thread in a per-user folder
    of the host's temp directory; files of dead processes are pruned when counted. `refresh()` (called
    every epoch and extraction block) re-divides as tasks start and finish, so a run that is alone
    for its last epochs gets the cores its finished neighbours released.
    """

    def __init__(self, fixed: int | None = None, root: str | os.PathLike | None = None):
        self.fixed = fixed
        self.root = Path(root or Path(tempfile.gettempdir()) / f"cryocube-cores-{os.getuid() if hasattr(os, 'getuid') else 0}")
        self.token = self.root / f"{os.getpid()}-{threading.get_ident()}"
        self.used: set[int] = set()

    def __enter__(self) -> "CoreShare":
        if self.fixed is None:
            self.root.mkdir(parents=True, exist_ok=True)
            self.token.write_text(str(time.time()))
        self.refresh()
        return self

    def __exit__(self, *exc) -> None:
        if self.fixed is None:
            self.token.unlink(missing_ok=True)

    def tasks(self) -> int:
        """Torch tasks registered on this host (this one included); dead processes are removed."""
        n = 0
        for f in self.root.glob("*-*"):
            pid = int(f.name.split("-", 1)[0]) if f.name.split("-", 1)[0].isdigit() else -1
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                f.unlink(missing_ok=True)
                continue
            except (PermissionError, OSError):
                pass
            n += 1
        return max(1, n)

    def threads(self) -> int:
        return self.fixed or max(1, host_cores() // self.tasks())

    def refresh(self) -> int:
        """Set torch's intra-op threads to the current share; returns it."""
        import torch

        n = self.threads()
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
        self.used.add(n)
        return n


@contextlib.contextmanager
def torch_task(threads: int | None = None):
    """What every torch task does first on its worker: malloc tuning, a core share; yields (device, share).

    threads=None: follow the work (`CoreShare`); an integer fixes torch's threads for the task.
    """
    tune_malloc()
    with CoreShare(threads) as share:
        yield device_for_worker(), share


class TorchThreads(WorkerPlugin):
    """Start each worker's torch with a sensible thread count, without importing torch where no task
    needs it (conversion workers): the OMP/MKL variables are set before torch's first import. Tasks
    then re-divide the cores at run time (`CoreShare`).

    threads=None: the worker's CPU share, i.e. its container's CPUs (cgroup-aware) / its Dask
    threads; right on Kubernetes/gateway pods where one worker owns its pod.
    """

    name = "cryocube-torch-threads"

    def __init__(self, threads: int | None = None):
        self.threads = threads

    def setup(self, worker) -> None:
        n = self.threads or max(1, host_cores() // max(1, worker.state.nthreads))
        os.environ.update(thread_env(n))  # read by torch/OpenMP when first imported
        if "torch" in sys.modules:  # already imported (e.g. dask-cuda's pre_import): set it directly
            sys.modules["torch"].set_num_threads(n)
