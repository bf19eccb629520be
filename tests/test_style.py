"""The repository's one style: ruff's lint and format, as configured in pyproject.toml."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def ruff(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert exe, "ruff is a test dependency (pip install -e '.[test]')"
    return subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_lint_passes():
    r = ruff("check", "--no-cache", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_leaves_every_file_as_it_is():
    r = ruff("format", "--check", "--no-cache", ".")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize(
    "planted, rule",
    [
        ("import os\n", "F401"),
        ("def public_helper():\n    return 1\n", "D103"),
        ("class Public:\n    def method(self):\n        return 1\n", "D102"),
        ("X = '" + "x" * 120 + "'\n", "E501"),
    ],
)
def test_the_configuration_catches_what_it_is_for(tmp_path, planted, rule):
    """The rules are really on: a planted module breaking one is refused under the repo's config."""
    mod = ROOT / "cryocube" / "planted_style_probe.py"  # public: D1 rules skip private modules
    mod.write_text('"""Planted by tests/test_style.py."""\n\n' + planted)
    try:
        r = ruff("check", "--no-cache", "--output-format", "concise", str(mod))
    finally:
        mod.unlink()
    assert r.returncode == 1 and rule in r.stdout, r.stdout


def test_no_blanket_noqa_and_no_per_file_ignores_outside_tests():
    """Exceptions are named one rule at a time, where they are; only tests and benchmarks skip the
    docstring rules."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert set(cfg.get("per-file-ignores", {})) <= {"tests/**", "benchmarks/**"}
    assert all(set(v) <= {"D102", "D103"} for v in cfg.get("per-file-ignores", {}).values())
    files = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    # a noqa, or a file-level ruff noqa, naming no rule (pieces joined: this file stays clean)
    blanket_re = re.compile("#" + r" *(noqa(?!:)|ruff: *noqa(?!:))")
    blanket = [
        f"{f}:{i}"
        for f in files
        for i, line in enumerate((ROOT / f).read_text().splitlines(), 1)
        if blanket_re.search(line)
    ]
    assert not blanket, blanket
