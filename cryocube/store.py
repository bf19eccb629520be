"""One way to reach a Zarr store from a path or URL (local, file://, s3://, any fsspec protocol).

Every module opens cubes and caches through here so storage options and read-only mode are handled
once, and the same URL works on the client and on Dask workers.
"""
from __future__ import annotations

import json
import os
from typing import Any

import fsspec
import zarr
import zarr.storage

StorageOptions = dict[str, Any]


def is_remote(url: str) -> bool:
    return "://" in str(url) and not str(url).startswith("file://")


def storage_options_from_env(url: str, given: StorageOptions | None = None) -> StorageOptions:
    """Storage options: those given, else $CRYOCUBE_STORAGE_OPTIONS (JSON) for remote URLs.

    Workers read the same variable, so credentials never travel inside task graphs.
    """
    if given:
        return dict(given)
    if is_remote(url) and os.environ.get("CRYOCUBE_STORAGE_OPTIONS"):
        return json.loads(os.environ["CRYOCUBE_STORAGE_OPTIONS"])
    return {}


def make_store(url: str, storage_options: StorageOptions | None = None, read_only: bool = False):
    url = str(url)
    if is_remote(url):
        opts = storage_options_from_env(url, storage_options)
        return zarr.storage.FsspecStore.from_url(url, storage_options=opts, read_only=read_only)
    path = url.removeprefix("file://")
    if not read_only:
        os.makedirs(path, exist_ok=True)
    return zarr.storage.LocalStore(path, read_only=read_only)


def open_group(url: str, mode: str = "r", storage_options: StorageOptions | None = None) -> zarr.Group:
    store = make_store(url, storage_options, read_only=(mode == "r"))
    return zarr.open_group(store=store, mode=mode)


def exists(url: str, storage_options: StorageOptions | None = None) -> bool:
    url = str(url)
    fs, path = fsspec.core.url_to_fs(url, **storage_options_from_env(url, storage_options))
    return fs.exists(path.rstrip("/") + "/zarr.json")


def remove(url: str, storage_options: StorageOptions | None = None) -> None:
    url = str(url)
    fs, path = fsspec.core.url_to_fs(url, **storage_options_from_env(url, storage_options))
    if fs.exists(path):
        fs.rm(path, recursive=True)


def size_on_disk(url: str, storage_options: StorageOptions | None = None) -> int:
    url = str(url)
    fs, path = fsspec.core.url_to_fs(url, **storage_options_from_env(url, storage_options))
    return int(fs.du(path)) if fs.exists(path) else 0
