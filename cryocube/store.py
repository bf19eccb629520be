"""One way to reach storage from a path or URL (local, file://, any fsspec protocol), with options
resolved alike on the client and on Dask workers; options never enter graphs, records, messages."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import io
import json
import os
import uuid
from collections.abc import Iterator
from typing import IO, Any

import fsspec
import zarr
import zarr.storage
from distributed.diagnostics.plugin import WorkerPlugin

from .errors import DamagedStoreError, UserError

StorageOptions = dict[str, Any]
ENV = "CRYOCUBE_STORAGE_OPTIONS"
# "proto://bucket" or "proto://" -> options, in this process
_REGISTERED: dict[str, StorageOptions] = {}


def is_remote(url: str) -> bool:
    """Whether `url` goes through fsspec with storage options; file:// URLs count as local."""
    return "://" in str(url) and not str(url).startswith("file://")


def local_path(url: str) -> str:
    """A file:// URL as a plain path (any other string unchanged), for APIs that take only paths."""
    return str(url).removeprefix("file://")


def join(url: str, *parts: str) -> str:
    """URL parts joined with single slashes (not os.path: s3:// and local paths alike)."""
    return "/".join([str(url).rstrip("/"), *[p.strip("/") for p in parts]])


def _prefix(url: str) -> str:
    """ "s3://bucket" for s3://bucket/a/b (the scope options are registered under)."""
    proto, _, rest = str(url).partition("://")
    return f"{proto}://{rest.split('/', 1)[0]}"


def parse_options(text: str, what: str = "--storage-options") -> StorageOptions:
    """JSON storage options; the error never echoes the value (it may hold secrets)."""
    try:
        v = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(
            f"{what} is not valid JSON ({e.msg} at character {e.pos}); the value is not shown "
            "because it may hold credentials"
        ) from None
    if not isinstance(v, dict):
        raise UserError(f"{what} must be a JSON object of fsspec options, got a {type(v).__name__}")
    return v


def options_arg(text: str) -> StorageOptions:
    """argparse type for --storage-options (its error never echoes the value)."""
    try:
        return parse_options(text)
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def register_options(url: str, options: StorageOptions | None) -> None:
    """Use `options` for every URL in `url`'s bucket (or protocol, for "proto://")."""
    if options and is_remote(url):
        _REGISTERED[_prefix(url) if not str(url).endswith("://") else str(url)] = dict(options)


def options_for(url: str, given: StorageOptions | None = None) -> StorageOptions:
    """Given, else registered for the bucket/protocol, else $CRYOCUBE_STORAGE_OPTIONS."""
    if given:
        return dict(given)
    if not is_remote(url):
        return {}
    for key in (_prefix(url), str(url).split("://", 1)[0] + "://"):
        if key in _REGISTERED:
            return dict(_REGISTERED[key])
    if os.environ.get(ENV):
        return parse_options(os.environ[ENV], f"${ENV}")
    return {}


class StorageCredentials(WorkerPlugin):
    """Installs registered storage options in each worker process, once per worker."""

    name = "cryocube-storage-options"

    def __init__(self, options: dict[str, StorageOptions]):
        self.options = options

    def setup(self, worker) -> None:
        """Merges the client's options into this worker's registry."""
        _REGISTERED.update(self.options)

    def __repr__(self) -> str:  # never show the options themselves
        return f"StorageCredentials({sorted(self.options)})"


def share_with(client) -> None:
    """Give the client's workers the options registered in this process (no-op when none)."""
    if _REGISTERED:
        client.register_plugin(StorageCredentials(dict(_REGISTERED)), name=StorageCredentials.name)


# -- zarr ------------------------------------------------------------------------------------------
def make_store(url: str, storage_options: StorageOptions | None = None, read_only: bool = False):
    """The Zarr store at `url`; a writable local one creates its folder first."""
    url = str(url)
    if is_remote(url):
        return zarr.storage.FsspecStore.from_url(
            url, storage_options=options_for(url, storage_options), read_only=read_only
        )
    path = local_path(url)
    if not read_only:
        os.makedirs(path, exist_ok=True)
    return zarr.storage.LocalStore(path, read_only=read_only)


def open_group(
    url: str, mode: str = "r", storage_options: StorageOptions | None = None
) -> zarr.Group:
    """The Zarr group at `url`; metadata that is not JSON is named, not a traceback."""
    store = make_store(url, storage_options, read_only=(mode == "r"))
    try:
        return zarr.open_group(store=store, mode=mode)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise DamagedStoreError(
            f"{join(url, 'zarr.json')}: not valid JSON: the store's metadata is damaged "
            "(truncated or overwritten); write it again (a cube: `cryocube convert --overwrite`)"
        ) from None


def exists(url: str, storage_options: StorageOptions | None = None) -> bool:
    """Whether a Zarr group is at `url`."""
    return file_exists(join(url, "zarr.json"), storage_options)


def remove(url: str, storage_options: StorageOptions | None = None) -> None:
    """Deletes a whole store or file, recursively; nothing there is not an error."""
    fs, path = fs_path(url, storage_options)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def size_on_disk(url: str, storage_options: StorageOptions | None = None) -> int:
    """Bytes under `url` (0 when nothing is there), for `cryocube inspect`'s size line."""
    fs, path = fs_path(url, storage_options)
    return int(fs.du(path)) if fs.exists(path) else 0


# -- files (records, logs, summaries) ------------------------------------------------------------
def fs_path(url: str, storage_options: StorageOptions | None = None):
    """(filesystem, path) for `url` with its options resolved here: every file helper's way in."""
    url = str(url)
    return fsspec.core.url_to_fs(url, **options_for(url, storage_options))


def file_exists(url: str, storage_options: StorageOptions | None = None) -> bool:
    """Whether anything (a file or a folder) is at `url`, on any storage."""
    fs, path = fs_path(url, storage_options)
    return fs.exists(path)


def read_bytes(url: str, storage_options: StorageOptions | None = None) -> bytes:
    """A whole file's bytes; a missing file raises FileNotFoundError."""
    fs, path = fs_path(url, storage_options)
    return fs.cat_file(path)


def read_text(url: str, storage_options: StorageOptions | None = None) -> str:
    """A whole file as UTF-8 text (records, logs, kept answers)."""
    return read_bytes(url, storage_options).decode("utf-8")


@contextlib.contextmanager
def atomic_file(
    url: str, storage_options: StorageOptions | None = None, durable: bool = True
) -> Iterator[IO[bytes]]:
    """A binary file that becomes `url` only when the block ends without error: old content or new,
    never half (a temporary sibling, fsynced and renamed, locally; one PUT on object stores).
    `durable=False` renames once the kernel holds the bytes and has started writing them out: a
    process crash keeps the file, a machine crash may not until `make_durable(url)` returns."""
    if is_remote(url):
        buf = io.BytesIO()
        yield buf
        fs, path = fs_path(url, storage_options)
        fs.pipe_file(path, buf.getvalue())
        return
    path = local_path(url)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{uuid.uuid4().hex[:8]}.part"
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            (os.fsync if durable else _start_writeback)(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start writing the dirty pages out, do not wait


def _start_writeback(fd: int) -> bool:
    """The disk writes while the caller computes: a 1.4 GB checkpoint's fsync waited 1.4-4.3 s,
    this returns in 0.4 s and a later fsync finds it done (Linux; elsewhere that fsync waits)."""
    with contextlib.suppress(AttributeError, OSError):
        whole = ctypes.c_longlong(0)  # from offset 0, length 0: to the end
        return ctypes.CDLL(None).sync_file_range(fd, whole, whole, SYNC_FILE_RANGE_WRITE) == 0
    return False


def make_durable(url: str) -> None:
    """Waits until a local file written with `atomic_file(durable=False)` is on the disk."""
    if not is_remote(url):  # an object store's PUT already was
        with open(local_path(url), "rb") as f:
            os.fsync(f.fileno())


def write_atomic(
    url: str, data: bytes | str, storage_options: StorageOptions | None = None
) -> None:
    """Old content or new, never half (`atomic_file`)."""
    with atomic_file(url, storage_options) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def append_text(url: str, text: str, storage_options: StorageOptions | None = None) -> None:
    """A real append (fsynced) locally; a rewrite on object stores, which cannot append."""
    if not is_remote(url):
        path = local_path(url)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "ab") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        return
    old = read_text(url, storage_options) if file_exists(url, storage_options) else ""
    write_atomic(url, old + text, storage_options)


def list_dir(url: str, storage_options: StorageOptions | None = None) -> list[str]:
    """Names directly under `url` (empty when it does not exist)."""
    fs, path = fs_path(url, storage_options)
    if not fs.exists(path):
        return []
    return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(path, detail=False))
