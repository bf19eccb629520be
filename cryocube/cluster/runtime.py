"""What a task needs to know about its worker (allocator, device, torch threads) and the peak memory
of what it ran. A torch task's threads come from its run (`torch_task`): the float reduction order,
and so the result, must not depend on what else runs."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import logging
import os
import sys
import threading

from dask.system import CPU_COUNT
from distributed import get_worker
from distributed.diagnostics.plugin import WorkerPlugin

from ..errors import UserError

GPU = "GPU"  # the abstract worker resource that GPU tasks request
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
THREADS_VAR = "CRYOCUBE_TORCH_THREADS"  # the worker's configured torch threads (`TorchThreads`)
MALLOC_MMAP_THRESHOLD = 32 * 2**20  # glibc's ceiling: per-sample arrays come from the reusable heap
MALLOC_TRIM_THRESHOLD = 256 * 2**20  # freed heap a worker may keep instead of faulting it in again


def thread_env(threads: int) -> dict[str, str]:
    """The variables that fix a worker's math threads (before torch's first import)."""
    return {v: str(threads) for v in THREAD_VARS}


@functools.cache
def tune_malloc() -> bool:
    """Let glibc reuse freed memory: Dask's MALLOC_TRIM_THRESHOLD_ made every array over 128 KiB a
    fresh, zeroed mmap, conversion 2x slower (benchmarks/bench_convert.py); False off glibc."""
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


def trim_malloc() -> None:
    """Give glibc's free heap back to the system, so what follows shows its own rise in RSS."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def task_boundary(fn):
    """For functions that run as Dask tasks: a UserError leaves the worker without its causes, which
    distributed would pickle along (rasterio's CPLE errors do not unpickle); the heap the task freed
    goes back to the system, as Dask pauses a worker by its resident memory, not by what it uses
    (a 2 GiB worker sat paused at 1.6 GiB after a U-Net fit, 1.1 GiB of it torch's imports, and a
    notebook waited on it; a trim takes 0.4-6 ms)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            clean = type(e)(*e.args)
        finally:
            trim_malloc()
        raise clean  # outside the except block: no __context__ to drag along

    return wrapper


def rss_bytes() -> int:
    """This process's resident set."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def hwm_bytes() -> int | None:
    """This process's peak resident set (VmHWM) since it started or `reset_hwm`; None off Linux."""
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


# a reset that leaves VmHWM this far above RSS did not take (a kernel or sandbox that ignores it)
HWM_RESET_SLACK = 64 * 2**20


def reset_hwm() -> bool:
    """Reset VmHWM to the current RSS (Linux 4.0+); False where that is refused or has no effect."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        hwm = hwm_bytes()
        return hwm is not None and hwm <= rss_bytes() + HWM_RESET_SLACK
    except OSError:
        return False


class PeakMemory:
    """The peak memory of one span of a task: `mb` (or None) and `scope`, what the figure covers."""

    def __init__(self, device: str):
        self.device, self.mb, self.scope, self.open = device, None, "task", False

    @property
    def measured(self) -> bool:
        """Whether `mb` will be a figure of this span (else None, and `scope` says why)."""
        return self.scope in ("task", SHARED_SCOPE)

    def start(self) -> None:
        """Reset the peak (or share the one running: tasks measured at once in one process)."""
        with _open_lock:
            if _open:
                unmeasured = [o.scope for o in _open if not o.measured]
                for o in (*_open, self):
                    if o.scope == "task":
                        o.scope = SHARED_SCOPE
                self.scope = unmeasured[0] if unmeasured else self.scope
            elif self.device.startswith("cuda"):
                import torch

                torch.cuda.reset_peak_memory_stats()
            else:
                trim_malloc()
                if not reset_hwm():
                    self.scope = (
                        "not measured: this system does not reset a process's peak resident set"
                        " (/proc/self/clear_refs), so the figure would be the worker's lifetime"
                        " peak"
                    )
            _open.append(self)
            self.open = True

    def stop(self) -> None:
        """The peak since `start`, once (later calls keep it)."""
        with _open_lock:
            if not self.open:
                return
            self.open = False
            _open.remove(self)
            if not self.measured:
                self.mb = None
            elif self.device.startswith("cuda"):
                import torch

                self.mb = torch.cuda.max_memory_allocated() / 2**20
            else:
                hwm = hwm_bytes()
                self.mb = None if hwm is None else hwm / 2**20


# what the figure covers when other measured tasks ran in the same process meanwhile (a worker with
# several Dask threads): their memory is in it, so it is an upper bound of this task's
SHARED_SCOPE = "task and the tasks beside it on the worker"
_open: list[PeakMemory] = []
_open_lock = threading.Lock()


@contextlib.contextmanager
def peak_memory(device: str):
    """The `PeakMemory` of the block (or until its `stop()`): VmHWM or torch's peak allocation,
    reset at the start, so a worker's earlier, larger tasks never show in a later run's figure."""
    m = PeakMemory(device)
    m.start()
    try:
        yield m
    finally:
        m.stop()


def device_for_worker() -> str:
    """The torch device for the current task: "cuda" where this process sees a GPU, else "cpu"."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def host_cores() -> int:
    """CPUs this process may use (affinity- and cgroup-aware, as Dask counts them)."""
    return max(1, int(CPU_COUNT))


def configured_threads(dask_worker=None) -> int:
    """The torch threads this worker was started with (never the load): `TorchThreads`'s, else
    OMP_NUM_THREADS, else the host's cores / its Dask threads."""
    for var in (THREADS_VAR, "OMP_NUM_THREADS"):
        v = os.environ.get(var, "")
        if v.isdigit() and int(v) >= 1:
            return int(v)
    nthreads = 1
    with contextlib.suppress(ValueError):  # not in a worker: one process, one task at a time
        nthreads = (dask_worker or get_worker()).state.nthreads
    return max(1, host_cores() // max(1, nthreads))


@contextlib.contextmanager
def torch_task(threads: int | None = None):
    """What every torch task does first; yields (device, threads). `threads`: the run's own (its
    identity on CPU), else the worker's configured ones."""
    import torch

    tune_malloc()
    n = int(threads or configured_threads())
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield device_for_worker(), n


class TorchThreads(WorkerPlugin):
    """Fix each worker's torch threads when it starts, without importing torch (conversion workers
    need none); threads=None: its container's CPUs / its Dask threads (k8s, gateway)."""

    name = "cryocube-torch-threads"

    def __init__(self, threads: int | None = None):
        self.threads = threads

    def setup(self, worker) -> None:
        """The variables, or torch's own count where it is imported (dask-cuda's pre_import)."""
        n = self.threads or max(1, host_cores() // max(1, worker.state.nthreads))
        os.environ.update({**thread_env(n), THREADS_VAR: str(n)})
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(n)


def _exit_now() -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


class FastExit(WorkerPlugin):
    """A local worker ends without Python's finalization (1.2 s once torch and timm are loaded,
    which every cluster close waits for), as the first exit handler, once the worker has closed."""

    name = "cryocube-fast-exit"

    def setup(self, worker) -> None:
        """Registers the exit last, so that it runs first."""
        atexit.register(_exit_now)
