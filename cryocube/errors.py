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
