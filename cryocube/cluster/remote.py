"""Existing schedulers: `--cluster tcp://host:port` (or any distributed protocol) and
`scheduler-file:PATH`. The Client is ours to close; the scheduler and its workers are not."""

from __future__ import annotations

import contextlib
from pathlib import Path

from distributed import Client
from distributed.comm.registry import backends as comm_backends

from .registry import CONNECT_TIMEOUT, ClusterError, ClusterRequest, backend
from .runtime import TorchThreads


def _connect(stack: contextlib.ExitStack, req: ClusterRequest, silent: str, **where) -> Client:
    """A Client of the scheduler at `where`; `silent` names it when it does not answer."""
    try:
        client = Client(**where, timeout=CONNECT_TIMEOUT)
    except (OSError, TimeoutError) as e:
        raise ClusterError(f"{silent} within {CONNECT_TIMEOUT} ({e})") from e
    stack.callback(client.close)
    if req.torch_threads:  # someone else's workers: only when asked
        client.register_plugin(TorchThreads(req.torch_threads), name=TorchThreads.name)
    return client


@backend("address")
def address(req: ClusterRequest, stack: contextlib.ExitStack) -> Client:
    """`--cluster tcp://host:port` (any protocol distributed knows)."""
    scheme = req.target.split("://", 1)[0]
    if scheme not in comm_backends:
        raise ClusterError(
            f"--cluster {req.target}: unknown protocol {scheme!r} (known:"
            f" {', '.join(sorted(comm_backends))})"
        )
    return _connect(stack, req, f"no Dask scheduler answers at {req.target}", address=req.target)


@backend("scheduler-file")
def scheduler_file(req: ClusterRequest, stack: contextlib.ExitStack) -> Client:
    """`--cluster scheduler-file:PATH` (or PATH.json) of `dask scheduler --scheduler-file`."""
    path = Path(req.target).expanduser()
    if not path.is_file():
        raise ClusterError(
            f"scheduler file {path} does not exist (written by `dask scheduler --scheduler-file`)"
        )
    silent = f"the scheduler named in {path} does not answer"
    return _connect(stack, req, silent, scheduler_file=str(path))
