"""`--cluster gateway`: a new cluster on the hub's dask-gateway (address and auth from the hub's
dask config)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import yaml_problem
from .registry import (
    WORKER_WAIT_S,
    ClusterError,
    ClusterRequest,
    backend,
    require,
    wait_first_worker,
)
from .runtime import TorchThreads

if TYPE_CHECKING:
    from distributed import Client

GATEWAY_KEYS = {
    "address",
    "proxy_address",
    "public_address",
    "auth",
    "cluster_options",
    "workers",
    "adapt",
    "worker_timeout",
}


def read_gateway_options(path: str | os.PathLike) -> dict:
    """The gateway options YAML (see deployments/pangeo/gateway-options.yaml), checked for unknown
    keys."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ClusterError(f"gateway options file {p} does not exist")
    try:
        doc = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ClusterError(f"{p}: not valid YAML ({yaml_problem(e)})") from None
    if not isinstance(doc, dict):
        raise ClusterError(f"{p}: expected a mapping of gateway options")
    _check_gateway_keys(doc, str(p))
    return doc


def _check_gateway_keys(doc: dict, source: str) -> None:
    unknown = set(doc) - GATEWAY_KEYS
    if unknown:
        raise ClusterError(
            f"{source}: unknown gateway keys {sorted(unknown)} (known: {sorted(GATEWAY_KEYS)}; "
            "server-defined cluster options go under cluster_options)"
        )
    if "workers" in doc and "adapt" in doc:
        raise ClusterError(
            f"{source}: give either workers (fixed size) or adapt (minimum/maximum), not both"
        )


def _gateway_auth(dask_gateway, auth):
    """None/str → dask-gateway resolves it from config; {"type": ..., **kwargs} → that auth with
    kwargs."""
    if not isinstance(auth, dict):
        return auth
    import dask

    kwargs = {k: v for k, v in auth.items() if k != "type"}
    with dask.config.set({"gateway.auth.kwargs": kwargs}):
        return dask_gateway.auth.get_auth(auth.get("type", "basic"))


def _close_gateway(gateway) -> None:
    """Close a dask_gateway.Gateway once: its __del__ would close it again and, since distributed
    raises on a stopped LoopRunner's loop, print a RuntimeError at garbage collection."""
    gateway.close()
    gateway.__dict__.pop("_loop_runner", None)  # what __del__ checks before closing


def _shutdown_gateway_cluster(cluster) -> None:
    cluster.shutdown()
    gw = getattr(cluster, "gateway", None)
    if gw is not None:  # shutdown closed it; keep its __del__ from closing it again
        gw.__dict__.pop("_loop_runner", None)


@backend("gateway")
def gateway(req: ClusterRequest, stack: contextlib.ExitStack) -> "Client":
    """A new cluster on the hub's dask-gateway (address and auth come from the hub's dask
    config)."""
    dask_gateway = require("dask_gateway", "gateway", "gateway")
    opts = read_gateway_options(req.target) if req.target else {}
    _check_gateway_keys(req.gateway_options or {}, "gateway_options")
    opts = {**opts, **(req.gateway_options or {})}
    try:
        gateway = dask_gateway.Gateway(
            address=opts.get("address"),
            proxy_address=opts.get("proxy_address"),
            public_address=opts.get("public_address"),
            auth=_gateway_auth(dask_gateway, opts.get("auth")),
        )
    except ValueError as e:  # "No dask-gateway address provided or found in configuration"
        raise ClusterError(
            f"--cluster gateway: {e} (hubs set gateway.address in dask config; else give address:)"
        ) from e
    try:  # this Gateway only validates options and submits; the cluster keeps its own connection
        try:
            options = gateway.cluster_options()
        except Exception as e:  # aiohttp ClientConnectorError, GatewayServerError, 401
            raise ClusterError(
                f"--cluster gateway: cannot reach the gateway at {gateway.address}: "
                f"{type(e).__name__}: {e}"
            ) from e
        for key, value in (opts.get("cluster_options") or {}).items():
            try:
                options[key] = value
            except (KeyError, AttributeError, TypeError, ValueError) as e:
                raise ClusterError(
                    f"gateway cluster option {key}={value!r} rejected: {e} "
                    f"(this gateway offers: {', '.join(options)})"
                ) from e
        cluster = gateway.new_cluster(options, shutdown_on_close=True)
    finally:
        # before the cluster's: they share one event loop, stopped by the last close
        _close_gateway(gateway)
    stack.callback(_shutdown_gateway_cluster, cluster)
    if req.n_workers or "adapt" not in opts:
        first = req.n_workers or opts.get("workers", 2)
        cluster.scale(first)
    else:
        first = opts["adapt"].get("minimum", 0)
        cluster.adapt(**opts["adapt"])
    client = stack.enter_context(cluster.get_client(set_as_default=True))
    client.register_plugin(TorchThreads(req.torch_threads), name=TorchThreads.name)
    if first:  # an adaptive cluster with minimum 0 gets workers only once tasks arrive
        wait_first_worker(
            client, f"gateway cluster {cluster.name}", opts.get("worker_timeout", WORKER_WAIT_S)
        )
    return client
