"""Every error class of cryocube. A UserError is one the user can act on: the CLI prints its message
as one sentence (no traceback) and exits 2."""

import traceback
from collections.abc import Iterator


class UserError(Exception):
    """Bad input, configuration or state; the message names the file/band/sample/run at fault."""

    def __reduce__(self):
        # the message only, across processes: a chained library cause may not unpickle
        return (type(self), self.args)


# --- inputs: catalogs, recipes, raw files, labels, downloads -------------------------------------
class CatalogError(UserError, ValueError):
    """A catalog file (datasets, models, protocols) lacks a field or has a wrong kind of value."""


class FieldError(UserError, ValueError):
    """A value one field cannot take; `mapping.from_mapping` names the file or option and field."""


class PluginError(UserError, ValueError):
    """A registry's name is taken twice (the modules of both named) or names nothing registered."""


class RecipeError(UserError, ValueError):
    """Raised when a recipe field (from --config or --set) has a value it cannot take."""


class ConvertError(UserError, ValueError):
    """Raised by `convert` on bad raw input; names the file (and band/sample) at fault."""


class WindowError(UserError, ValueError):
    """A read asks for a window outside a raw image: the file changed size since its scan."""


class LabelError(UserError, ValueError):
    """Raised when a label folder or file would give a score other than the one its labels mean."""


class DownloadError(UserError):
    """A download fails, is not the file (an HTML page) or does not match its checksum."""


# --- cubes and caches ----------------------------------------------------------------------------
class DamagedCubeError(UserError):
    """A cube's stored pixels do not match their digests (a chunk deleted, truncated, altered)."""


class IncompleteCubeError(UserError):
    """A cube has no completion marker: its conversion is still running or was interrupted."""


class DamagedStoreError(UserError, ValueError):
    """A Zarr store's metadata (zarr.json) is not valid JSON: truncated or overwritten."""


class DamagedCacheError(UserError):
    """A feature cache holds unwritten or damaged items; removing it makes it rebuild."""


# --- models --------------------------------------------------------------------------------------
class BandMatchError(UserError):
    """Raised when a dataset has no band that any input slot of the encoder can take."""


class WeightsError(UserError):
    """A checkpoint is missing, corrupt, has the wrong checksum or does not fit the model."""


class NonFiniteLoss(UserError, FloatingPointError):
    """A run's training loss becomes NaN or infinite (the run fails; its group goes on)."""


# --- embeddings and probes -----------------------------------------------------------------------
class ProbeError(UserError):
    """A task's labels, embeddings or probe settings are ones a probe cannot work with."""


class NeuCoError(UserError):
    """A task name, embedding matrix or score table is one the NeuCo-Bench protocol cannot use."""


class SubmissionError(UserError):
    """A submission CSV the challenge's validator (or NeuCo-Bench) would not accept."""


# --- results and reports -------------------------------------------------------------------------
class RecordError(UserError, ValueError):
    """A run record cannot be read: a required field missing or mistyped, or a newer version."""


class ResultsError(UserError, ValueError):
    """A results file is missing, unreadable or holds a record without a required field."""


class TuneError(UserError, ValueError):
    """A study cannot run: an option it cannot take, an untunable protocol, no trial completed."""


class ReportError(UserError, ValueError):
    """Raised when there is nothing to report, or an option the report cannot honour."""


class CubeReadError(UserError, ValueError):
    """Raised when a cube or predictions store lacks what a qualitative report panel needs."""


# --- clusters ------------------------------------------------------------------------------------
class ClusterError(UserError):
    """A cluster cannot be created or reached; the message says which and what to install or fix."""


class ManifestError(UserError):
    """A Kubernetes manifest does not match its schema; the message names the file and fields."""


def yaml_problem(e: BaseException) -> str:
    """A YAML parse error in one line (where, then what): PyYAML's own text spans several lines."""
    mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
    if mark is not None and problem:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return " ".join(str(e).split())


class RunFailed(Exception):
    """Internal, never raised: one failed run of a group as its worker saw it; evaluate logs it."""

    def __init__(self, kind: str, message: str, tb: str = ""):
        super().__init__(message)
        self.kind, self.tb = kind, tb


def failure(e: BaseException) -> dict:
    """What a task returns for a run of it that failed (picklable, traceback kept for the log)."""
    tb = "".join(traceback.format_exception(e))
    return {"failed": {"kind": type(e).__name__, "message": str(e), "traceback": tb}}


# connection-level failures, by class name (botocore, aiohttp, urllib3, requests, the socket
# module): the libraries are optional, and their exceptions arrive wrapped (fsspec turns a refused
# HTTP connection into FileNotFoundError) or re-raised from a worker
_NETWORK = {
    "EndpointConnectionError": "",
    "ConnectTimeoutError": "timed out",
    "ConnectionClosedError": "connection closed",
    "ClientConnectorDNSError": "host name not resolved",
    "ClientConnectorError": "",
    "ServerTimeoutError": "timed out",
    "ServerDisconnectedError": "server disconnected",
    "NewConnectionError": "",
    "NameResolutionError": "host name not resolved",
    "MaxRetryError": "",
    "ConnectionRefusedError": "connection refused",
    "ConnectionResetError": "connection reset",
    "gaierror": "host name not resolved",
    "URLError": "",
}


def causes(e: BaseException | None) -> Iterator[BaseException]:
    """`e`, then what it was raised from or during, each once."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def unreachable(e: BaseException) -> tuple[str, str] | None:
    """(where, why) when `e` (or an exception it came from) is a failure to connect; else None."""
    hits = [x for x in causes(e) if type(x).__name__ in _NETWORK]
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
    whys = [_NETWORK[type(x).__name__] for x in reversed(hits)]  # the innermost that says one
    return where or str(hits[0]), next(filter(None, whys), "could not connect")


def network_message(e: BaseException, url: str | None = None) -> str | None:
    """One sentence for a connection failure, naming what was unreachable; else None."""
    if (hit := unreachable(e)) is None:
        return None
    return (
        f"cannot reach {url or hit[0]} ({hit[1]}): check the address or endpoint"
        " (--storage-options, $CRYOCUBE_STORAGE_OPTIONS) and the network"
    )
