"""Fetch a dataset's published archive (through `cryocube.fetch`, checksum verified) and extract it,
refusing any member that would land outside the target folder."""

from __future__ import annotations

import os
import posixpath
import shutil
import tarfile
import zipfile
from pathlib import Path

from ..catalog import load_dataset
from ..fetch import DownloadError, fetch

__all__ = ["DownloadError", "download", "fetch", "safe_extract"]
ARCHIVES = (".tar.gz", ".tgz", ".tar", ".zip", ".tar.xz", ".tar.bz2")


def _inside(root: Path, name: str) -> bool:
    target = (root / name).resolve()
    return target == root or root in target.parents


def safe_extract(archive: str | Path, target: str | Path) -> Path:
    """Extract a tar(.gz/.bz2/.xz) or zip archive into `target`, refusing members that escape it."""
    archive, target = Path(archive), Path(target)
    target.mkdir(parents=True, exist_ok=True)
    root = target.resolve()
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            for m in z.infolist():
                if m.filename.startswith("/") or not _inside(root, m.filename):
                    raise DownloadError(
                        f"{archive}: member {m.filename!r} would be written outside {target}"
                    )
            z.extractall(target)
        return target
    try:
        tf = tarfile.open(archive)
    except tarfile.TarError as e:
        raise DownloadError(f"{archive}: not a readable tar or zip archive ({e})") from None
    with tf:
        try:
            members = tf.getmembers()
        except (tarfile.TarError, EOFError, OSError) as e:
            raise DownloadError(
                f"{archive}: cannot list members ({e}); the archive is truncated or corrupt"
            ) from None
        for m in members:
            if m.name.startswith("/") or not _inside(root, m.name):
                raise DownloadError(
                    f"{archive}: member {m.name!r} would be written outside {target}"
                )
            if m.issym() or m.islnk():
                # a hard link names a member; a symbolic one is relative to its folder
                link = posixpath.join("" if m.islnk() else posixpath.dirname(m.name), m.linkname)
                if m.linkname.startswith("/") or not _inside(root, link):
                    raise DownloadError(
                        f"{archive}: link {m.name!r} -> {m.linkname!r} points outside {target}"
                    )
            if m.isdev():
                raise DownloadError(f"{archive}: member {m.name!r} is a device file")
        try:
            tf.extractall(target, members=members, filter="data")
        except (tarfile.TarError, EOFError, OSError) as e:
            raise DownloadError(
                f"{archive}: extraction failed ({e}); the archive is truncated or corrupt"
            ) from None
    return target


def download(
    dataset: str, dest: str | Path, source: str = "cryobench", extract=True, progress=True
) -> Path:
    """Download and extract the dataset's archive(s) from the catalog source; the raw root."""
    spec = load_dataset(dataset)
    if source not in spec.sources:
        raise DownloadError(
            f"dataset {spec.id!r} has no source {source!r}; known: {sorted(spec.sources)}"
        )
    src = spec.sources[source]
    dest = Path(dest)
    files = src.get("files") or [
        {"name": posixpath.basename(src["url"]), "sha256": src.get("sha256"), "md5": src.get("md5")}
    ]
    base = src["url"] if src.get("files") else posixpath.dirname(src["url"]) + "/"
    paths = [
        fetch(base + f["name"], dest / f["name"], f.get("sha256"), f.get("md5"), progress)
        for f in files
    ]
    if not extract:
        return dest
    archives = [p for p in paths if p.name.endswith(ARCHIVES)]
    parts = sorted(p for p in paths if ".tar.gza" in p.name)
    if parts:  # split archive (AI4Arctic train.tar.gzaa + ab): byte-concatenate first
        whole = dest / parts[0].name[: parts[0].name.index(".tar.gz") + 7]
        if not whole.exists():
            with open(whole.with_suffix(".part"), "wb") as out:
                for p in parts:
                    with open(p, "rb") as f:
                        shutil.copyfileobj(f, out)
            os.replace(whole.with_suffix(".part"), whole)
        archives.append(whole)
    for a in archives:
        safe_extract(a, dest)
    return dest / src.get("root", "") if src.get("root") else dest
