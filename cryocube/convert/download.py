"""Fetch a dataset's published archive (Hugging Face / Zenodo / PANGAEA), verify it, extract it safely.

Downloads stream through fsspec (http(s), s3, file, ...) into a `.part` file that is renamed only after
its checksum matches, so a crash never leaves a file that looks complete. Extraction refuses any
archive member that would land outside the target folder (absolute paths, `..`, links pointing out).
"""
from __future__ import annotations

import hashlib
import os
import posixpath
import tarfile
import zipfile
from pathlib import Path

import fsspec

from ..catalog import load_dataset
from ..errors import UserError

CHUNK = 1 << 20


class DownloadError(UserError):
    pass


def file_digest(path: str | Path, algo: str = "sha256") -> str:
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def fetch(url: str, dest: str | Path, sha256: str | None = None, md5: str | None = None, progress: bool = True) -> Path:
    """Download `url` to `dest` unless a verified copy is already there; returns the path."""
    from ..progress import progress_bar

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists() and _verified(dest, sha256, md5):
        return dest
    part = dest.with_name(dest.name + ".part")
    try:
        with fsspec.open(url, "rb") as src:
            total = getattr(src, "size", None) or 0
            with open(part, "wb") as out, progress_bar(f"download {dest.name}", total or 1, progress) as bar:
                for block in iter(lambda: src.read(CHUNK), b""):
                    out.write(block)
                    bar.advance(len(block) if total else 0)
    except FileNotFoundError:
        raise DownloadError(f"{url}: not found") from None
    except OSError as e:
        raise DownloadError(f"{url}: download failed: {e}") from None
    if not _verified(part, sha256, md5):
        got = file_digest(part, "sha256" if sha256 else "md5")
        part.unlink()
        raise DownloadError(f"{url}: checksum mismatch (expected {sha256 or md5}, got {got}); the file was discarded")
    os.replace(part, dest)
    return dest


def _verified(path: Path, sha256: str | None, md5: str | None) -> bool:
    if sha256:
        return file_digest(path, "sha256") == sha256.lower()
    if md5:
        return file_digest(path, "md5") == md5.lower()
    return True  # nothing published to check against


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
                    raise DownloadError(f"{archive}: member {m.filename!r} would be written outside {target}")
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
            raise DownloadError(f"{archive}: cannot list members ({e}); the archive is truncated or corrupt") from None
        for m in members:
            if m.name.startswith("/") or not _inside(root, m.name):
                raise DownloadError(f"{archive}: member {m.name!r} would be written outside {target}")
            if m.issym() or m.islnk():
                link = m.linkname if m.islnk() else posixpath.join(posixpath.dirname(m.name), m.linkname)
                if m.linkname.startswith("/") or not _inside(root, link):
                    raise DownloadError(f"{archive}: link {m.name!r} -> {m.linkname!r} points outside {target}")
            if m.isdev():
                raise DownloadError(f"{archive}: member {m.name!r} is a device file")
        try:
            tf.extractall(target, members=members, filter="data")
        except (tarfile.TarError, EOFError, OSError) as e:
            raise DownloadError(f"{archive}: extraction failed ({e}); the archive is truncated or corrupt") from None
    return target


def download(dataset: str, dest: str | Path, source: str = "cryobench", extract: bool = True, progress: bool = True) -> Path:
    """Download the dataset's archive(s) from the catalog source and extract; returns the raw root."""
    spec = load_dataset(dataset)
    if source not in spec.sources:
        raise DownloadError(f"dataset {spec.id!r} has no source {source!r}; known: {sorted(spec.sources)}")
    src = spec.sources[source]
    dest = Path(dest)
    files = src.get("files") or [{"name": posixpath.basename(src["url"]), "sha256": src.get("sha256"), "md5": src.get("md5")}]
    base = src["url"] if src.get("files") else posixpath.dirname(src["url"]) + "/"
    paths = [fetch(base + f["name"], dest / f["name"], f.get("sha256"), f.get("md5"), progress) for f in files]
    if not extract:
        return dest
    archives = [p for p in paths if p.name.endswith((".tar.gz", ".tgz", ".tar", ".zip", ".tar.xz", ".tar.bz2"))]
    parts = sorted(p for p in paths if ".tar.gza" in p.name)
    if parts:  # split archive (AI4Arctic train.tar.gzaa + ab): byte-concatenate first
        whole = dest / parts[0].name[: parts[0].name.index(".tar.gz") + 7]
        if not whole.exists():
            with open(whole.with_suffix(".part"), "wb") as out:
                for p in parts:
                    with open(p, "rb") as f:
                        for block in iter(lambda: f.read(CHUNK), b""):
                            out.write(block)
            os.replace(whole.with_suffix(".part"), whole)
        archives.append(whole)
    for a in archives:
        safe_extract(a, dest)
    return dest / src.get("root", "") if src.get("root") else dest
