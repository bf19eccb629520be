"""The client side of a cluster: which Client to use (never one started behind the user's back),
what its workers offer, what a record says of it."""

from __future__ import annotations

from collections import Counter

from distributed import Client, default_client

from ..errors import ClusterError
from .runtime import GPU, configured_threads
from .worker_logs import quiet_task_errors


def get_client(client: Client | None = None) -> Client:
    """The given client, else the default one (a notebook's or `open_cluster`'s), made quiet."""
    try:
        client = default_client() if client is None else client
    except ValueError:
        raise ClusterError(
            "no Dask client: pass client=Client(...) (e.g. the one your notebook or hub created),"
            " or run through the `cryocube` CLI, which starts a cluster with --cluster"
            " local|cuda|k8s|gateway|tcp://..."
        ) from None
    quiet_task_errors(client)
    return client


def gpu_resources(client: Client) -> dict | None:
    """{"GPU": 1} when every worker offers a GPU, else None (such a task would wait forever)."""
    workers = client.scheduler_info(n_workers=-1)["workers"]
    if workers and all(w.get("resources", {}).get(GPU, 0) >= 1 for w in workers.values()):
        return {GPU: 1}
    return None


def cluster_threads(client: Client) -> int:
    """The torch threads the workers started with (the fewest): the default of runs planned."""
    return min(client.run(configured_threads).values(), default=1)


def dashboard_link(client: Client) -> str | None:
    """None where the scheduler serves no dashboard: records and the banner never fail on it."""
    try:
        return client.dashboard_link
    except (KeyError, AttributeError):  # scheduler without a dashboard (no bokeh, or disabled)
        return None


def cluster_info(client: Client) -> dict:
    """What the run ran on, for result records (workers, threads, memory, resources, dashboard)."""
    info = client.scheduler_info(n_workers=-1)
    workers = list(info["workers"].values())
    resources: Counter[str] = Counter()
    for w in workers:
        resources.update(w.get("resources") or {})
    return {
        "n_workers": len(workers),
        "threads": sum(w.get("nthreads", 0) for w in workers),
        "memory": int(sum(w.get("memory_limit") or 0 for w in workers)),
        "resources": dict(resources),
        "gpu": gpu_resources(client) is not None,
        "scheduler": info.get("address"),
        "dashboard": dashboard_link(client),
    }
