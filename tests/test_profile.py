"""Measured compute profile (`cryocube list models --profile`): real encoders with random weights,
FLOPs against hand counts, the per-device cache, refusals before work, and the report's use of
measured figures.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from cryocube.cli import main
from cryocube.models import build_encoder
from cryocube.models import profile as prof
from cryocube.models.base import count_params


def vit_s_flops(
    size: int, chans: int = 13, dim: int = 384, depth: int = 12, mlp: int = 1536, patch: int = 16
) -> int:
    """ViT-S/16 forward FLOPs by hand (1 multiply-add = 2): patch conv, then per block qkv,
    attention (QK^T and AV), output projection and the two MLP layers."""
    g = (size // patch) ** 2
    n = g + 1  # + cls token
    conv = 2 * g * dim * chans * patch * patch
    block = 2 * n * dim * 3 * dim + 2 * 2 * n * n * dim + 2 * n * dim * dim + 2 * 2 * n * dim * mlp
    return conv + depth * block


def test_flop_counter_convention_on_known_layers():
    flops, by_op = prof.count_flops(nn.Linear(3, 5), torch.zeros(4, 3))
    assert flops == 2 * 4 * 3 * 5 and set(by_op) == {"addmm"}
    conv = nn.Conv2d(2, 8, kernel_size=3, padding=1, bias=False)
    flops, _ = prof.count_flops(conv, torch.zeros(1, 2, 6, 6))
    assert flops == 2 * (6 * 6) * 8 * 2 * 9
    flops, _ = prof.count_flops(
        nn.Sequential(nn.LayerNorm(16), nn.GELU(), nn.Softmax(-1)), torch.zeros(2, 16)
    )
    assert flops == 0  # elementwise, norms and softmax are not counted


def test_real_profile_counts_params_and_flops_and_caches(tmp_path):
    setups = prof.validate(["ssl4eo_moco", "unet"], 64, 2, "fp32", "cpu", iters=1)
    # U-Net: the bands of its published setup
    assert [s.input_text for s in setups] == ["13x64", "10x64"]
    p = prof.profile(setups, iters=1, root=tmp_path, progress=False)
    moco, unet = p.rows
    for row, s in zip(p.rows, setups):
        assert row["params"] == count_params(s.build())  # the module's own count
        assert row["cached"] is False and row["samples_per_s"] > 0 and row["batch"] == 2
        assert row["peak_memory_mb"] is not None and row["peak_memory_mb"] > 0
        # 64 px: not the published setup
        assert row["default_setup"] is False and row["published_setup"] is False
    assert moco["flops"] == vit_s_flops(64)
    # attention, counted through the math backend
    assert moco["flops_by_op"]["bmm"] == 12 * 2 * 2 * 17 * 17 * 384
    assert unet["flops"] == unet["flops_by_op"]["convolution"]
    # pangaea-models.md: MoCo 22,647,936
    assert count_params(build_encoder("ssl4eo_moco")) == 22_647_936
    assert p.path.parent == tmp_path and p.path.name.startswith("cpu-")

    again = prof.profile(setups, iters=1, root=tmp_path, progress=False)
    assert again.cached == 2
    # read back, not re-timed
    assert [r["samples_per_s"] for r in again.rows] == [r["samples_per_s"] for r in p.rows]
    other = prof.profile(
        prof.validate(["ssl4eo_moco"], 64, 1, "fp32", "cpu", iters=1),
        iters=1,
        root=tmp_path,
        progress=False,
    )
    assert other.cached == 0  # another batch is another key
    entries = json.loads(p.path.read_text())["entries"]
    assert len(entries) == 3 and all(f"torch {torch.__version__}" in k for k in entries)
    assert "10x64" in prof.table(again) and "(2 of 2 rows read" in prof.table(again)


def test_default_setup_is_the_published_one_and_full_size_flops_are_analytic():
    s = prof.setup_for("ssl4eo_moco", None, 1, "fp32", "cpu")
    assert s.default and s.input_size == 224
    flops, _, params = prof.dry_run(s)  # meta device: no memory, no arithmetic
    assert flops == vit_s_flops(224) and params == 22_647_936
    r = prof.setup_for("ramen", None, 1, "fp32", "cpu")
    assert (
        r.default
        and r.input_size == 128
        and dict(r.arch) == {"input_res": 40.0, "res": 80.0}
        and len(r.bands) == 3
    )


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--models", "nope"], "unknown model 'nope'"),
        (
            ["--models", "croma_optical", "--input-size", "100"],
            "does not accept input size 100: it must be a positive multiple of its patch size 8",
        ),
        (
            ["--models", "unet", "--input-size", "100"],
            "does not accept input size 100: unet: input side must be a multiple of 16",
        ),
        (["--models", "ssl4eo_moco", "--batch", "0"], "batch must be at least 1, got 0"),
        (["--models", "ssl4eo_moco", "--precision", "fp8"], "precision must be one of"),
        (["--models", "ssl4eo_moco", "--device", "tpu"], "device must be cpu or cuda"),
    ],
)
def test_bad_options_are_refused_in_one_sentence_before_work(
    tmp_path, monkeypatch, capsys, argv, says
):
    monkeypatch.setenv("CRYOCUBE_PROFILES", str(tmp_path))
    assert main(["list", "models", "--profile", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1
    assert not any(tmp_path.iterdir())  # nothing measured, nothing cached


def test_profile_options_need_profile(capsys):
    assert main(["list", "models", "--batch", "4"]) == 2
    assert "--batch only apply to `cryocube list models --profile`" in capsys.readouterr().err
    assert main(["list", "datasets", "--profile"]) == 2


def test_cli_prints_table_and_progress_when_piped(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CRYOCUBE_PROFILES", str(tmp_path))
    argv = [
        "list",
        "models",
        "--profile",
        "--models",
        "ssl4eo_mae_sar",
        "--input-size",
        "32",
        "--iters",
        "1",
        "--precision",
        "fp32",
    ]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "ssl4eo_mae_sar" in out and "1 multiply-add = 2 FLOPs" in out and "1 configs in" in out
    # plain lines when not a terminal
    assert "profile: started (1)" in err and "ssl4eo_mae_sar 2x32:" in err
    assert main(argv) == 0
    assert "(1 of 1 rows read from it)" in capsys.readouterr().out


def test_report_uses_measured_gflops_and_labels_them(tmp_path):
    from test_report import rec, write

    from cryocube.pages import build_report

    setups = prof.validate(["ssl4eo_moco"], None, 1, "fp32", "cpu", iters=1)
    flops, by_op, params = prof.dry_run(setups[0])
    # a measured default-setup entry as `profile` writes it (timings are not what this test checks)
    key = prof.cache_key(setups[0], 1, torch.__version__, prof.config_digest("ssl4eo_moco"))
    entry = {
        "model": "ssl4eo_moco",
        "input": "13x224",
        "default_setup": True,
        "precision": "fp32",
        "batch": 1,
        "gflops": flops / 1e9,
        "flops": flops,
        "params": params,
        "samples_per_s": 3.5,
        "device": "cpu test-box",
        "measured_at": "2026-12-04T16:00:00",
    }
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "cpu-test-box.json").write_text(
        json.dumps({"device": "cpu test-box", "entries": {key: entry}})
    )
    runs = write(
        tmp_path / "r" / "results.jsonl",
        [rec("ssl4eo_moco", "glid", 80.0, gflops=8.87), rec("dofa", "glid", 90.0, gflops=34.0)],
    )
    rep = build_report(runs, tmp_path / "out", formats=["json"], profiles=tmp_path / "profiles")
    t = rep.tables["frozen/cost"]
    by = {row[0]: row for row in t.rows}
    moco, dofa = by["S12-MoCo"], by["DOFA"]
    assert moco[t.col("gflops")] == pytest.approx(vit_s_flops(224) / 1e9)
    assert moco[t.col("gflops_source")] == "measured on cpu test-box"
    assert moco[t.col("encoder_samples_per_s")] == 3.5
    assert dofa[t.col("gflops")] == 34.0 and dofa[t.col("gflops_source")] == "catalog"
    assert any("'catalog': the published figure copied" in n for n in t.notes)
    assert any("miou_vs_gflops" in str(f) for f in rep.figures)
    assert any(
        "GFLOPs per sample catalog / measured on cpu test-box" in n
        for n in rep.tables["frozen/leaderboard"].notes
    )

    plain = build_report(runs, tmp_path / "out2", formats=["json"], profiles=tmp_path / "none")
    t2 = plain.tables["frozen/cost"]
    assert {row[0]: row[t2.col("gflops_source")] for row in t2.rows} == {
        "S12-MoCo": "catalog",
        "DOFA": "catalog",
    }


def test_difference_from_the_published_figure_is_explained_by_the_op_split():
    s = prof.setup_for("ssl4eo_moco", None, 1, "fp32", "cpu")
    flops, by_op, _ = prof.dry_run(s)
    row = {
        "gflops": flops / 1e9,
        "flops_by_op": by_op,
        "published_gflops": 8.87,
        "published_setup": True,
    }
    # 9.58 measured = 8.87 published + 0.715 of attention matmuls
    assert prof.difference(row) == "+attention"
    assert prof.difference({**row, "published_gflops": flops / 1e9}) == "="
    assert prof.difference({**row, "published_gflops": 2 * flops / 1e9}) == "other"
    # another size: no published figure applies
    assert prof.difference({**row, "published_setup": False}) == "-"
