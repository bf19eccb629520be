"""Downloads of dataset archives and checkpoints: any fsspec URL streamed into a `.part` file,
renamed only once its checksum matches; a sign-in page served instead of the file is refused."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import fsspec

from .errors import DownloadError, UserError, unreachable
from .progress import progress_bar

CHUNK = 8 << 20


def file_digest(path: str | Path, algo: str = "sha256") -> str:
    """The hex digest, streamed (checkpoints run to gigabytes)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, algo).hexdigest()


def _stream(url: str, part: Path, h, progress: bool, error: type[UserError]) -> int:
    """Copies `url` into `part`, hashing it; an HTML page instead of the file is refused."""
    n = 0
    with fsspec.open(url, "rb") as src, open(part, "wb") as out:
        total = getattr(src, "size", None) or 0
        with progress_bar(f"download {part.name[: -len('.part')]}", total or 1, progress) as bar:
            while block := src.read(CHUNK):
                if n == 0 and block[:512].lstrip().lower().startswith(
                    (b"<!doctype html", b"<html")
                ):
                    raise error(
                        f"{url} returned an HTML page, not the file (a sign-in or"
                        " download-confirmation page, e.g. Google Drive or OneDrive): download"
                        " it in a browser and pass the local path"
                    )
                h.update(block)
                out.write(block)
                n += len(block)
                bar.advance(len(block) if total else 0)
    return n


def fetch(
    url: str,
    dest: str | Path,
    sha256: str | None = None,
    md5: str | None = None,
    progress: bool = True,
    force: bool = False,
    error: type[UserError] = DownloadError,
) -> Path:
    """`url` to `dest` unless a verified copy is there; checksummed while streaming."""
    algo, want = ("md5", md5) if md5 and not sha256 else ("sha256", sha256 or None)
    want = want and want.lower()
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists() and not force and (want is None or file_digest(dest, algo) == want):
        return dest
    part = dest.with_name(dest.name + ".part")
    h = hashlib.new(algo)
    try:
        n = _stream(url, part, h, progress, error)
        if n == 0:
            raise error(f"{url}: empty download")
    except UserError:
        part.unlink(missing_ok=True)
        raise
    # fsspec says FileNotFoundError also when the server was never reached
    except (OSError, ValueError) as e:
        part.unlink(missing_ok=True)
        net = unreachable(e)
        if net is not None:
            raise error(
                f"{url}: the server could not be reached ({net[1]}); the file may exist: check the"
                " network (offline?) or the URL, then fetch again"
            ) from None
        if isinstance(e, FileNotFoundError):
            raise error(
                f"{url}: not found (the server answered that there is no such file)"
            ) from None
        raise error(f"{url}: download failed: {e}") from None
    got = h.hexdigest()
    if want is not None and got != want:
        part.unlink()
        raise error(
            f"{url}: checksum mismatch: {algo} {got} does not match the catalog's {want}; the file"
            " was discarded"
        )
    os.replace(part, dest)
    return dest
