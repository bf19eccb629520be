"""Errors the user can act on. The CLI prints their message (no traceback) and exits 2."""


class UserError(Exception):
    """Bad input, configuration or state; the message names the file/band/sample/run at fault."""
