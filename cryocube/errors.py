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
