"""Downloads over real HTTP on loopback, checksum verification and safe archive extraction."""

from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile

import pytest

from cryocube.convert.download import DownloadError, fetch, safe_extract


def _tar(path, members: dict[str, bytes], links: dict[str, str] | None = None):
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tf.addfile(info)


def test_fetch_verifies_and_extracts(tmp_path, http_dir):
    root, base = http_dir
    _tar(
        root / "GLD.tar.gz",
        {"GLD/GLNet/train/image/a.tif": b"x" * 1000, "GLD/GLNet/train/mask/a.tif": b"y"},
    )
    sha = hashlib.sha256((root / "GLD.tar.gz").read_bytes()).hexdigest()
    dest = tmp_path / "dl"
    p = fetch(f"{base}/GLD.tar.gz", dest / "GLD.tar.gz", sha256=sha, progress=False)
    assert p.exists() and not (dest / "GLD.tar.gz.part").exists()
    safe_extract(p, dest)
    assert (dest / "GLD/GLNet/train/image/a.tif").read_bytes() == b"x" * 1000
    # a verified file is not downloaded again
    mtime = p.stat().st_mtime_ns
    fetch(f"{base}/GLD.tar.gz", p, sha256=sha, progress=False)
    assert p.stat().st_mtime_ns == mtime


def test_checksum_mismatch_keeps_nothing(tmp_path, http_dir):
    root, base = http_dir
    (root / "x.tar.gz").write_bytes(b"not what was published")
    with pytest.raises(DownloadError, match="checksum mismatch"):
        fetch(f"{base}/x.tar.gz", tmp_path / "x.tar.gz", sha256="0" * 64, progress=False)
    assert not (tmp_path / "x.tar.gz").exists() and not (tmp_path / "x.tar.gz.part").exists()


def test_missing_url(tmp_path, http_dir):
    _, base = http_dir
    with pytest.raises(DownloadError, match="missing.tar.gz"):
        fetch(f"{base}/missing.tar.gz", tmp_path / "m.tar.gz", progress=False)


@pytest.mark.parametrize(
    "members,links",
    [
        ({"../escape.txt": b"bad"}, None),
        ({"/abs/escape.txt": b"bad"}, None),
        ({"ok/file": b"1"}, {"ok/link": "../../outside"}),
        ({"ok/file": b"1"}, {"ok/abs": "/etc/passwd"}),
    ],
)
def test_unsafe_tar_refused(tmp_path, members, links):
    _tar(tmp_path / "evil.tar.gz", members, links)
    with pytest.raises(DownloadError, match="outside"):
        safe_extract(tmp_path / "evil.tar.gz", tmp_path / "out")
    assert not (tmp_path / "escape.txt").exists()


def test_unsafe_zip_refused_and_truncated_tar(tmp_path):
    with zipfile.ZipFile(tmp_path / "evil.zip", "w") as z:
        z.writestr("../evil.txt", "bad")
    with pytest.raises(DownloadError, match="outside"):
        safe_extract(tmp_path / "evil.zip", tmp_path / "out")
    _tar(tmp_path / "t.tar.gz", {"a/b": b"z" * 200_000})
    data = (tmp_path / "t.tar.gz").read_bytes()
    (tmp_path / "t.tar.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DownloadError, match="t.tar.gz"):
        safe_extract(tmp_path / "t.tar.gz", tmp_path / "out2")


def test_html_page_instead_of_archive_is_refused(tmp_path, http_dir):
    """Hosts answer with a sign-in/confirmation page at the archive's URL: never keep it as the
    archive."""
    root, base = http_dir
    (root / "GLID.zip").write_text("<!DOCTYPE html><html><body>Sign in to continue</body></html>")
    with pytest.raises(DownloadError, match="HTML page"):
        fetch(f"{base}/GLID.zip", tmp_path / "GLID.zip", progress=False)
    assert not list(tmp_path.glob("GLID.zip*"))
