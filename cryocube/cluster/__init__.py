"""Where Dask work runs: the cluster backends (docs/usage.md) and what tasks know of workers. Only
the CLI creates clusters (`open_cluster`); library functions take the caller's Client."""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

from distributed import Client

from . import gateway, k8s, local, remote  # noqa: F401  (each registers its backend)
from .client import cluster_info, dashboard_link, get_client, gpu_resources  # noqa: F401
from .gateway import read_gateway_options  # noqa: F401
from .k8s import (  # noqa: F401
    DEFAULT_K8S_MANIFEST,
    ManifestError,
    k8s_cluster_spec,
    load_k8s_cluster_spec,
    read_k8s_manifests,
    validate_k8s_manifest,
)
from .local import local_sizing
from .registry import BACKENDS, ClusterError, ClusterRequest, parse_cluster_spec  # noqa: F401
from .runtime import configured_threads, device_for_worker, tune_malloc  # noqa: F401
from .timeouts import close_quietly, explain_timeout, patient
from .worker_logs import quiet_shutdown, quiet_task_errors


def planned_threads(
    spec: str,
    n_workers: int | None = None,
    threads_per_worker: int | None = None,
    torch_threads: int | None = None,
    parallel: int | None = None,
) -> int | None:
    """The torch threads per worker `open_cluster(spec, ..., parallel=...)` will configure, where
    known before it starts (a plan made before the cluster has the run ids made after), or None."""
    if torch_threads or parse_cluster_spec(spec)[0] != "local":
        return torch_threads or None
    return local_sizing(n_workers, threads_per_worker, None, parallel)[2]


def announce(spec: str, client: Client) -> None:
    """The line a command prints on stderr once its cluster is up (or its plan passed)."""
    n = len(client.scheduler_info(n_workers=-1)["workers"])
    print(
        f"cryocube: {parse_cluster_spec(spec)[0]} cluster, {n} workers, dashboard"
        f" {dashboard_link(client) or '(none)'}",
        file=sys.stderr,
    )


@contextlib.contextmanager
def open_cluster(spec: str = "local", quiet: bool = False, **sizes) -> Iterator[Client]:
    """Yield a Client on the cluster named by `spec`, sized by `ClusterRequest`'s fields; on exit
    close only what was created here. quiet: no cluster line."""
    name, target = parse_cluster_spec(spec)
    req = ClusterRequest(name, target, **sizes)
    stack = contextlib.ExitStack()
    try:
        stack.enter_context(patient())  # load alone must not fail a worker start or a connection
        client = BACKENDS[name](req, stack)
        quiet_task_errors(client)
        if not quiet:
            announce(spec, client)
    except TimeoutError as e:
        close_quietly(stack, name)
        raise ClusterError(f"--cluster {spec}: {explain_timeout(e)}") from e
    except BaseException:
        close_quietly(stack, name)
        raise
    try:
        yield client
    # an error or Ctrl-C: the cluster closes under busy workers; the CLI says what happened
    except BaseException:
        quiet_shutdown()
        raise
    finally:
        close_quietly(stack, name)  # a slow close is a warning: the command's work is done
