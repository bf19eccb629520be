"""A loaded machine: the CLI's clusters wait longer than Dask's 30 s (`PATIENT`) and their workers
wake less often (`QUIET`); a wait that still ends says what timed out and what to change; a close
never fails work."""

from __future__ import annotations

import contextlib
import traceback
import warnings

import dask

# key: (cryocube's value, Dask's default); a value the user set stands
PATIENT = {
    "distributed.comm.timeouts.connect": ("120s", "30s"),
    "distributed.comm.timeouts.tcp": ("120s", "30s"),
}
# A worker's timers wake its process about 150 times a second (loop tick, profiler, monitors). With
# torch's threads on every core each wake-up stalls a thread team: in a 2-core worker a ViT-L
# fine-tuning step took 8.2-8.7 s with Dask's timers and 7.7-8.1 s with these (docs/performance.md).
QUIET = {
    "distributed.admin.tick.interval": ("1s", "20ms"),
    "distributed.admin.system-monitor.interval": ("2s", "500ms"),
    "distributed.worker.profile.enabled": (False, True),
    "distributed.worker.memory.monitor-interval": ("500ms", "100ms"),
}

# (where in the traceback, what it was waiting for, what to change): the first that matches names it
_WAITS = (
    (
        ("nanny.py", "deploy/spec.py", "wait_for_workers", "wait_first_worker"),
        "a worker to start",
        (
            "start fewer --workers, give them more --memory-limit, or wait until the machine is"
            " less busy"
        ),
    ),
    (
        ("comm/core.py", "comm/tcp.py", "connect"),
        "a connection between the client, scheduler and workers",
        (
            "raise DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT and ..._TCP (e.g. 300s) on a heavily"
            " loaded machine"
        ),
    ),
    (("close", "shutdown"), "the cluster to close", "nothing: the results were written before it"),
    (
        ("client.py",),
        "a task's result",
        "see OUT/logs/errors.log and the dashboard; fewer --workers on a loaded machine",
    ),
)


def patient():
    """dask config with the longer waits and quieter timers, where the user has not set their own:
    in a config file or DASK_ variable, or in code to a value other than Dask's (a local cluster's
    workers take the config of the process that starts them)."""
    files = dask.config.collect()
    mine = {
        k: v
        for k, (v, default) in (PATIENT | QUIET).items()
        if dask.config.get(k, None) == default and dask.config.get(k, None, config=files) is None
    }
    return dask.config.set(mine)


def explain_timeout(e: BaseException) -> str:
    """One sentence: what a TimeoutError waited for (where it was raised) and what to change."""
    frames = traceback.extract_tb(e.__traceback__) if e.__traceback__ else []
    where = " ".join(f"{f.filename} {f.name}" for f in reversed(frames))
    detail = f" ({e})" if str(e) else ""
    for keys, what, change in _WAITS:
        if any(k in where for k in keys):
            return f"timed out waiting for {what}{detail}; {change}"
    return (
        f"timed out{detail}; on a loaded machine raise DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT"
        " (e.g. 300s) or use fewer --workers"
    )


def close_quietly(stack: contextlib.ExitStack, name: str) -> None:
    """Close what `open_cluster` created; a failed close is a warning (the work is done)."""
    try:
        stack.close()
    except Exception as e:  # noqa: BLE001 (any close error: the command's own outcome stands)
        msg = explain_timeout(e) if isinstance(e, TimeoutError) else f"{type(e).__name__}: {e}"
        warnings.warn(
            f"the {name} cluster did not close cleanly ({msg}); what the command wrote is complete",
            stacklevel=3,
        )
