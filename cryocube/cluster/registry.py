"""The registry of cluster backends (`--cluster NAME[:TARGET]`) and what every backend shares."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import socket
import warnings
from dataclasses import dataclass
from typing import Callable

from dask.utils import parse_bytes
from distributed import Client

from ..errors import ClusterError
from ..plugins import Registry
from .runtime import TorchThreads

CONNECT_TIMEOUT = "10s"  # to an existing scheduler
WORKER_WAIT_S = 600  # for the first worker of a remote cluster (image pulls, node scale-up)


@dataclass(frozen=True)
class ClusterRequest:
    """What `open_cluster` was asked for; `target` follows "NAME:" in the spec (or the address).
    The sizes fit local and cuda clusters and override k8s manifests and gateway options; parallel:
    runs the plan trains at once (a local cluster gets no more workers)."""

    backend: str
    target: str
    n_workers: int | None = None
    threads_per_worker: int | None = None
    memory_limit: str | None = None
    gateway_options: dict | None = None
    k8s_spec: str | None = None
    dashboard: bool = True
    torch_threads: int | None = None
    parallel: int | None = None

    def __post_init__(self):
        """Counts of at least 1 and a memory limit Dask reads, before anything starts."""
        for label in ("n_workers", "threads_per_worker", "torch_threads"):
            if (v := getattr(self, label)) is not None and v < 1:
                raise ClusterError(f"{label} must be >= 1, got {v}")
        if self.memory_limit not in (None, "auto"):
            try:
                parse_bytes(self.memory_limit)
            except (ValueError, TypeError):
                raise ClusterError(
                    f"--memory-limit {self.memory_limit!r} is not a size (e.g. 4GB, 4GiB, 500MB or"
                    " auto)"
                ) from None


Backend = Callable[[ClusterRequest, contextlib.ExitStack], Client]
# no entry-point group: cluster/__init__ imports every backend module
BACKENDS: Registry[Backend] = Registry("cluster backend")


def backend(name: str) -> Callable[[Backend], Backend]:
    """Registers a backend under its `--cluster` name (a taken name is refused)."""
    return functools.partial(BACKENDS.add, name)


def parse_cluster_spec(spec: str) -> tuple[str, str]:
    """(backend name, target) for a --cluster value."""
    spec = spec.strip()
    if "://" in spec:
        return "address", spec
    name, _, target = spec.partition(":")
    if name in BACKENDS and name != "address":
        return name, target
    if spec.endswith(".json"):
        return "scheduler-file", spec
    raise ClusterError(
        f"unknown cluster {spec!r}: use one of local, cuda, k8s[:MANIFEST.yaml],"
        " gateway[:OPTIONS.yaml], tcp://HOST:PORT (or tls://...), scheduler-file:PATH"
    )


def require(module: str, extra: str, what: str):
    """Import an optional backend package, or say which extra installs it or why it fails."""
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if importlib.util.find_spec(top) is None:
            raise ClusterError(
                f"--cluster {what} needs the {top} package: pip install 'cryocube[{extra}]'"
            ) from e
        raise ClusterError(
            f"--cluster {what}: {top} is installed but does not import ({e}); install the versions "
            f"it requires (pip check; pip install -U 'cryocube[{extra}]')"
        ) from e


DASHBOARD_PORT = 8787  # Dask's usual port, kept where it is free


def dashboard_port() -> int:
    """DASHBOARD_PORT where free on every interface, else one the system picks: another Dask
    cluster on the machine (a shared hub node) costs no warning, only another link."""
    for port in (DASHBOARD_PORT, 0):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as tornado listens
            with contextlib.suppress(OSError):
                s.bind(("", port))
                return s.getsockname()[1]
    raise ClusterError("no free port for the Dask dashboard")


def dashboard_kwargs(dashboard: bool) -> dict:
    """The dashboard on a free port, or none, with the scheduler's HTTP endpoints on a free port."""
    # a port taken between the choice and the listen: Dask moves it, and the cluster line says where
    warnings.filterwarnings("ignore", message=r"Port \d+ is already in use", category=UserWarning)
    if dashboard:
        return {"dashboard_address": f":{dashboard_port()}"}
    return {"dashboard_address": None, "scheduler_kwargs": {"dashboard_address": ":0"}}


def own_client(stack: contextlib.ExitStack, cluster, torch_threads: int | None) -> Client:
    """The Client of a cluster cryocube started, closed with the command, with `TorchThreads`."""
    client = stack.enter_context(Client(cluster))
    client.register_plugin(TorchThreads(torch_threads), name=TorchThreads.name)
    return client


def wait_first_worker(client: Client, what: str, timeout: float = WORKER_WAIT_S) -> None:
    """Remote clusters start empty: a hint after `timeout` s, not a task waiting in `no-worker`."""
    try:
        client.wait_for_workers(1, timeout=timeout)
    except TimeoutError:
        raise ClusterError(
            f"{what}: no worker joined within {timeout:.0f} s (image pull, quota or "
            "scheduling problem? see the dashboard / kubectl describe)"
        ) from None


# for worker processes to stop on a loaded machine (the default 30 s ends runs in a traceback)
CLOSE_TIMEOUT_S = 120


def own_cluster(stack: contextlib.ExitStack, cluster):
    """Close `cluster` when the command ends, giving its workers CLOSE_TIMEOUT_S to stop."""
    stack.callback(cluster.close, timeout=CLOSE_TIMEOUT_S)
    return cluster
