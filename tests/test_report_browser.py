"""The HTML report in a real headless browser (Debian's chromium, installed by the CI set-up).

No skip: without chromium this test fails and says how to install it.
"""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess

import pytest
from PIL import Image

from cryocube.pages import build_report

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
]


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail(
            "Debian's chromium is not installed: `apt-get update && apt-get install -y chromium` "
            "(listed in .ci/apt-packages.txt, which the CI set-up installs)"
        )
    return exe


def run_chromium(tmp_path, *args) -> subprocess.CompletedProcess:
    profile = tmp_path / "profile"
    profile.mkdir(exist_ok=True)
    p = subprocess.run(
        [chromium(), *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, f"chromium failed ({p.returncode}): {p.stderr[-2000:]}"
    return p


def rec(model, dataset, miou, seed=0, **kw):
    r = {
        "run_id": f"{model}-{dataset}-{seed}",
        "model": model,
        "dataset": dataset,
        "protocol": "frozen",
        "fraction": 1.0,
        "seed": seed,
        "status": "ok",
        "error": None,
        "metrics": {"mIoU": miou, "IoU": {"Background": miou + 3, "Target": miou - 3}},
        "timings": {"total_s": 10.0},
        "device": "cpu",
        "gflops": 12.0,
        "params": {"encoder": 10, "decoder": 5},
        "versions": {"torch": "2.14.1"},
        "cube": {"url": f"/c/{dataset}.zarr", "checksum": "sha256:feed"},
        "created": "2026-03-01T00:00:00",
    }
    r.update(kw)
    return r


def test_html_report_renders_tables_and_images_in_chromium(tmp_path):
    recs = [
        rec(m, d, v + s, seed=s)
        for m, base in (("dofa", 80), ("unet", 82), ("ssl4eo_moco", 70))
        for d, v in (("glid", base), ("gld", base - 5), ("caffe", base - 30))
        for s in (0, 1)
    ]
    recs.append(rec("spectralgpt", "glid", 0.0, status="error", error="RuntimeError: boom"))
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    rep = build_report(tmp_path / "runs", tmp_path / "out", published=True, formats=["html"])
    html_text = rep.html.read_text()
    assert "http://" not in html_text and "https://" not in html_text  # self-contained

    dom = run_chromium(tmp_path, "--dump-dom", rep.html.as_uri()).stdout
    assert dom.count('<table class="report"') == sum(1 for k in rep.tables) >= 8
    for table_id in (
        "table-frozen-leaderboard",
        "table-frozen-robustness",
        "table-published-leaderboard",
        "table-published-consistency",
        "table-frozen-published_comparison",
        "table-failures",
    ):
        assert f'id="{table_id}"' in dom
    assert re.search(r"<td[^>]*>S12-MoCo</td>", dom)
    assert "57.17 †" in dom  # RAMEN's printed average, flagged
    assert "RuntimeError: boom" in dom
    assert "sha256:feed" in dom  # run metadata
    uris = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', dom)
    assert len(uris) == len([p for p in rep.figures if p.suffix == ".png"]) >= 4
    for u in uris:
        with Image.open(io.BytesIO(base64.b64decode(u))) as im:
            assert im.format == "PNG" and im.size[0] > 100

    shot = tmp_path / "shot.png"
    run_chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,2400", rep.html.as_uri())
    with Image.open(shot) as im:
        assert im.size == (1280, 2400)
        rgb = im.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 20) or []
        assert len(colours) > 100, "screenshot is (nearly) blank"
        white = max((n for n, c in colours if c == (255, 255, 255)), default=0)
        assert white < 0.97 * im.size[0] * im.size[1]
