"""Errors the user can act on. The CLI prints their message (no traceback) and exits 2."""


class UserError(Exception):
    """Bad input, configuration or state; the message names the file/band/sample/run at fault."""

    def __reduce__(self):
        # Cross process boundaries (Dask workers -> client) with the message only: the chained cause
        # may be a library exception that cannot be unpickled (e.g. rasterio's CPLE errors).
        return (type(self), self.args)


def task_boundary(fn):
    """Decorate functions that run as Dask tasks: a UserError leaves the worker as a clean copy.

    distributed pickles an exception together with its chained causes (tblib); a library cause that
    cannot be unpickled (rasterio's CPLE errors) would turn our clear message into a bare Exception.
    """
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            clean = type(e)(*e.args)
        raise clean  # outside the except block: no __context__ to drag along

    return wrapper


class RunFailed(Exception):
    """One run of a group failed inside a task that went on with the others (its error, as the worker saw it)."""

    def __init__(self, kind: str, message: str, tb: str = ""):
        super().__init__(message)
        self.kind, self.tb = kind, tb

    def __str__(self) -> str:
        return self.args[0]


def failure(e: BaseException) -> dict:
    """What a task returns for one of its runs that failed (picklable, traceback kept for the log)."""
    import traceback

    return {"failed": {"kind": type(e).__name__, "message": str(e), "traceback": "".join(traceback.format_exception(e))}}


# connection-level failures, by class name (botocore, aiohttp, urllib3, requests, the socket module): the
# libraries are optional, and their exceptions arrive wrapped (fsspec turns a refused HTTP connection into
# FileNotFoundError) or re-raised from a worker
_NETWORK = {"EndpointConnectionError": "", "ConnectTimeoutError": "timed out", "ConnectionClosedError": "connection closed",
            "ClientConnectorDNSError": "host name not resolved", "ClientConnectorError": "", "ServerTimeoutError": "timed out",
            "ServerDisconnectedError": "server disconnected", "NewConnectionError": "", "NameResolutionError":
            "host name not resolved", "MaxRetryError": "", "ConnectionRefusedError": "connection refused",
            "ConnectionResetError": "connection reset", "gaierror": "host name not resolved", "URLError": ""}


def _chain(e: BaseException | None):
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def unreachable(e: BaseException) -> tuple[str, str] | None:
    """(where, why) when `e` (or an exception it came from) is a failure to connect; else None."""
    hits = [x for x in _chain(e) if type(x).__name__ in _NETWORK]
    if not hits:
        return None
    where = ""
    for x in hits:
        kw = getattr(x, "kwargs", None) or {}
        if kw.get("endpoint_url"):  # botocore: the URL it tried, bucket and key included
            where = str(kw["endpoint_url"])
            break
        if getattr(x, "host", None):  # aiohttp
            where = f"{x.host}:{x.port}" if getattr(x, "port", None) else str(x.host)
            break
    why = next((_NETWORK[type(x).__name__] for x in reversed(list(_chain(e))) if _NETWORK.get(type(x).__name__)),
               "could not connect")
    return where or str(hits[0]), why


def network_message(e: BaseException, url: str | None = None) -> str | None:
    """One sentence for a connection failure (None if `e` is not one), naming what was unreachable."""
    hit = unreachable(e)
    if hit is None:
        return None
    where, why = hit
    where = url or where
    return (f"cannot reach {where} ({why}): check the address or endpoint (--storage-options, "
            "$CRYOCUBE_STORAGE_OPTIONS) and the network")
