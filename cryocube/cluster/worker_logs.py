"""What workers print: a task's failure reaches the user once, from the client (a UserError's
sentence, a run's traceback in OUT/logs/errors.log), so a worker plugin drops distributed's."""

from __future__ import annotations

import logging
import os
import sys

from distributed.diagnostics.plugin import WorkerPlugin

from ..errors import UserError

# every cryocube task key starts so; their failures are reported by the client
TASK_PREFIX = "cryocube-"


def user_error_names(cls: type = UserError) -> set[str]:
    """Class names of UserError and its subclasses imported in this process (a task's error was)."""
    return {cls.__name__}.union(*map(user_error_names, cls.__subclasses__()))


def reported_by_client(record: logging.LogRecord) -> bool:
    """A worker log line the client reports better: a failed cryocube task, a user error, an
    interrupt, a cancellation by a closing cluster."""
    args = record.args
    if str(record.msg).startswith("Compute Failed") and isinstance(args, tuple) and len(args) >= 4:
        key, exc = str(args[0]), str(args[3])
        kind = exc.split("(", 1)[0].rsplit(".", 1)[-1]
        return key.startswith(TASK_PREFIX) or kind in user_error_names() | {"KeyboardInterrupt"}
    text = record.getMessage()
    if os.environ.get(LOCAL_WORKER) and any(m in text for m in SCHEDULER_GONE + PEER_GONE):
        # a local worker's scheduler lives in the client's process: it is ending, and says why
        return True
    return "ended with CancelledError" in text


# set in the environment of a local cluster's worker processes
LOCAL_WORKER = "CRYOCUBE_LOCAL_WORKER"
SCHEDULER_GONE = (
    "Failed to communicate with scheduler during heartbeat",
    "Connection to scheduler broken",
)
# a local peer closed while this worker sent it a result (Ctrl-C while a reduce moves partial scores
# between workers); a worker that dies on its own is reported by its nanny and the scheduler
PEER_GONE = ("failed during get data with",)


class _Filter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not reported_by_client(record)


LOGGERS = ("distributed.worker", "distributed.worker.state_machine")
# Dask's memory monitor: the worker's (unmanaged memory high, pausing, resuming: every few seconds
# while it lasts) and the nanny's (a worker past the terminate fraction, restarted)
MEMORY_LOGGERS = ("distributed.worker.memory", "distributed.nanny.memory")


class _MemoryLine(logging.Filter):
    """Dask's memory warnings as one line per process (torch tasks hold nothing Dask could spill,
    so the rest would repeat it), and each restart (it costs its task)."""

    def __init__(self):
        super().__init__()
        self.said = False

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "memory budget" in text and "Restarting" in text:
            line = (
                f"a worker passed its memory limit and is restarted ({text.split(' (pid')[0]});"
                " give it more with --memory-limit, fewer workers with --workers, or a smaller"
                " batch_size"
            )
        elif self.said:
            return False
        else:
            usage = text.split("--", 1)[-1].strip() if "--" in text else text
            line = (
                f"a worker's memory is high ({usage}); Dask pauses it at 80 % of its limit and"
                " restarts it at 95 % (further memory warnings of this worker are not shown)"
            )
        self.said = True
        print(f"cryocube: {line}", file=sys.stderr, flush=True)
        return False


def install() -> None:
    """The filters, in this process (a worker, or the client's for in-process clusters)."""
    for names, kind in ((LOGGERS, _Filter), (MEMORY_LOGGERS, _MemoryLine)):
        for lg in map(logging.getLogger, names):
            if not any(isinstance(f, kind) for f in lg.filters):
                lg.addFilter(kind())


class QuietTaskErrors(WorkerPlugin):
    """Installs the filter on every worker, including workers that join later."""

    name = "cryocube-quiet-task-errors"

    def setup(self, worker) -> None:
        """Installs the filter where the worker logs."""
        install()


def quiet_task_errors(client) -> None:
    """Register the plugin on the client's cluster (idempotent: the name replaces a copy)."""
    install()
    client.register_plugin(QuietTaskErrors(), name=QuietTaskErrors.name)


def quiet_shutdown() -> None:
    """On an error or Ctrl-C closing busy workers is expected, not worth a warning."""
    for name in ("distributed.nanny", "distributed.core", "distributed.client"):
        logging.getLogger(name).setLevel(logging.ERROR)
    logging.getLogger("distributed.scheduler").setLevel(logging.CRITICAL)
