"""The wheel carries what an installed cryocube reads at run time: catalogs, k8s manifests,
published tables."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_package_list_matches_the_source_tree():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = cfg["package-dir"]
    code = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "cryocube").rglob("__init__.py")
    }
    data = {
        f"{pkg}.{d.name}"
        for pkg, src in mapped.items()
        for d in (ROOT / src).iterdir()
        if d.is_dir()
    }
    data |= {"cryocube.report.data"}
    assert set(cfg["packages"]) == code | set(mapped) | data


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            str(ROOT),
            "-w",
            str(out),
        ],
        check=True,
        cwd=out,
    )
    return next(out.glob("cryocube-*.whl"))


def test_wheel_carries_the_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in (
        "cryocube/catalogs/datasets/gld.yaml",
        "cryocube/catalogs/models/dofa.yaml",
        "cryocube/catalogs/benchmarks/cryobench.yaml",
        "cryocube/k8s/daskcluster.yaml",
        "cryocube/report/data/cryobench-published.csv",
        "cryocube/report/data/report.css",
    ):
        assert f in names


def test_installed_wheel_finds_its_catalogs_outside_the_repository(wheel, tmp_path):
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    code = (
        "from cryocube.catalog import CATALOG_DIR, load_dataset; from cryocube.models import"
        " model_spec; from cryocube.cluster import DEFAULT_K8S_MANIFEST; from"
        " cryocube.report.published import PUBLISHED_CSV; print(CATALOG_DIR); assert"
        " load_dataset('gld').tile_size and model_spec('dofa'); assert"
        " DEFAULT_K8S_MANIFEST.is_file() and PUBLISHED_CSV.is_file(), (DEFAULT_K8S_MANIFEST,"
        " PUBLISHED_CSV)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / "site" / "cryocube" / "catalogs")
