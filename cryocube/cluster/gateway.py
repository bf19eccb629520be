"""`--cluster gateway`: a new cluster on the hub's dask-gateway."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import dask
from distributed import Client

from ..catalog import read_yaml
from ..errors import FieldError
from ..mapping import from_mapping, rule
from .registry import (
    WORKER_WAIT_S,
    ClusterError,
    ClusterRequest,
    backend,
    require,
    wait_first_worker,
)
from .runtime import TorchThreads


@dataclass(frozen=True)
class GatewayOptions:
    """deployments/pangeo/gateway-options.yaml's keys; address and auth default to dask config."""

    NOUN: ClassVar[str] = "gateway key"
    ERROR: ClassVar[type] = ClusterError
    HINT: ClassVar[str] = " (server-defined cluster options go under cluster_options)"

    address: str | None = None
    proxy_address: str | None = None
    public_address: str | None = None
    auth: str | dict[str, Any] | None = None  # a type (jupyterhub) or {type: basic, **kwargs}
    cluster_options: dict[str, Any] = field(default_factory=dict)
    workers: int | None = rule(None, lo=1)  # a fixed size (`--workers N` overrides)
    adapt: dict[str, int] | None = None  # {minimum, maximum}
    worker_timeout: float = rule(WORKER_WAIT_S, lo=0.0, unit="s")  # for the first worker

    def __post_init__(self):
        if self.workers is not None and self.adapt is not None:
            raise FieldError(
                "give either workers (fixed size) or adapt (minimum/maximum), not both"
            )


def read_gateway_options(path: str | os.PathLike) -> dict:
    """The gateway options YAML as given (its keys checked by `GatewayOptions`)."""
    doc = read_yaml(Path(path), ClusterError) or {}
    from_mapping(GatewayOptions, doc, str(path))
    return doc


def _gateway_auth(dask_gateway, auth):
    """None/str: dask-gateway resolves it from config; {"type": ..., **kwargs}: that auth."""
    if not isinstance(auth, dict):
        return auth
    kwargs = {k: v for k, v in auth.items() if k != "type"}
    with dask.config.set({"gateway.auth.kwargs": kwargs}):
        return dask_gateway.auth.get_auth(auth.get("type", "basic"))


def _no_second_close(gateway) -> None:
    """Keep a closed Gateway's __del__ from closing it again (a RuntimeError printed at exit)."""
    if gateway is not None:
        gateway.__dict__.pop("_loop_runner", None)  # what __del__ checks before closing


def _shutdown_gateway_cluster(cluster) -> None:
    cluster.shutdown()  # closes its gateway
    _no_second_close(getattr(cluster, "gateway", None))


@backend("gateway")
def gateway(req: ClusterRequest, stack: contextlib.ExitStack) -> Client:
    """A new cluster on the hub's dask-gateway (address and auth from the hub's dask config)."""
    dask_gateway = require("dask_gateway", "gateway", "gateway")
    from_mapping(GatewayOptions, req.gateway_options or {}, "gateway_options")
    given = read_gateway_options(req.target) if req.target else {}
    opts = from_mapping(GatewayOptions, {**given, **(req.gateway_options or {})}, "gateway options")
    try:
        gateway = dask_gateway.Gateway(
            address=opts.address,
            proxy_address=opts.proxy_address,
            public_address=opts.public_address,
            auth=_gateway_auth(dask_gateway, opts.auth),
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
        for key, value in opts.cluster_options.items():
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
        gateway.close()
        _no_second_close(gateway)
    stack.callback(_shutdown_gateway_cluster, cluster)
    if req.n_workers or opts.adapt is None:
        first = req.n_workers or opts.workers or 2
        cluster.scale(first)
    else:
        first = opts.adapt.get("minimum", 0)
        cluster.adapt(**opts.adapt)
    client = stack.enter_context(cluster.get_client(set_as_default=True))
    client.register_plugin(TorchThreads(req.torch_threads), name=TorchThreads.name)
    if first:  # an adaptive cluster with minimum 0 gets workers only once tasks arrive
        wait_first_worker(client, f"gateway cluster {cluster.name}", opts.worker_timeout)
    return client
