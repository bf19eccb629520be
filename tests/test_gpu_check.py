"""benchmarks/gpu_check.sh, the GPU check of issue 20, run on this CPU so that it cannot rot unseen:
the dry check (--cluster local, tiny sizes) measures every section, and asking for cuda where there
is none fails loudly instead of running on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("env", "cube", "evaluate", "vqa", "encoders", "upernet", "balance")


def gpu_check(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    # the venv has them
    env = {**os.environ, "PY": sys.executable, "CRYOCUBE_GPU_WHEELS": str(tmp_path / "no-wheels")}
    p = subprocess.run(
        [
            "bash",
            str(ROOT / "benchmarks" / "gpu_check.sh"),
            "--out",
            str(tmp_path / "out"),
            "--work",
            str(tmp_path / "work"),
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
    )
    found = tmp_path / "out" / "gpu_check.json"
    assert found.exists(), (
        f"no gpu_check.json (rc {p.returncode}): {p.stdout[-3000:]} {p.stderr[-3000:]}"
    )
    return p, json.loads(found.read_text())


def test_dry_check_measures_every_section(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check import device_problems

    p, r = gpu_check(tmp_path, "--cluster", "local")
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert {n: s["status"] for n, s in r["sections"].items()} == dict.fromkeys(SECTIONS, "ok")
    assert r["profile"] == "dry" and r["device"] == "cpu"

    env = r["sections"]["env"]
    assert env["peak_fp32_tflops"] > 0 and env["peak_bf16_tflops"] > 0 and env["versions"]["dask"]

    enc = r["sections"]["encoders"]
    assert [row["label"] for row in enc["rows"]] == ["ViT-S", "U-Net"]
    for row in enc["rows"]:
        assert (
            row["batch"] == 2 and row["sps"] > 0 and row["gflops"] > 0 and 0 < row["pct_peak"] < 200
        )
        assert row["precision"] == env["precision_auto"]

    rows = r["sections"]["upernet"]["rows"]
    assert {(x["what"], x["batch"], x["precision"]) for x in rows} == {
        (w, b, p) for w in ("step", "val") for b in (2, 4) for p in ("bf16", "fp32")
    }
    gflop = {(x["what"], x["batch"]): x["gflop"] for x in rows}
    # FLOPs are counted, not assumed: twice the batch, more work but at most twice (UPerNet's
    # up_lateral composes a weight once a call, where the larger batch makes that pay)
    for what in ("step", "val"):
        assert 1.2 < gflop[(what, 4)] / gflop[(what, 2)] < 2.2
    assert all(x["seconds"] > 0 and x["pct_peak"] > 0 for x in rows)

    runs = r["sections"]["evaluate"]["runs"]
    assert set(runs) == {"frozen", "finetune"}
    for proto, run in runs.items():
        assert run["status"] == "ok" and run["device"] == "cpu" and 0 <= run["mIoU"] <= 100
        assert (
            run["precision"]["effective"] == env["precision_auto"]
            and run["cluster"]["gpu"] is False
        )
    assert (
        runs["frozen"]["feature_devices"] == ["cpu"] and runs["frozen"]["encoder_forward_items"] > 0
    )
    assert device_problems(runs, "cpu") == []
    # the same command into a second folder: the same bits
    again = r["sections"]["evaluate"]["repeated_bits"]
    assert set(again) == {"frozen", "finetune"} and all(all(v.values()) for v in again.values())
    assert (
        "evaluate again: " in p.stdout
        and "frozen same bits" in p.stdout
        and "finetune same bits" in p.stdout
    )
    # the same records judged as a GPU run's: every place they ran is wrong
    cuda = device_problems(runs, "cuda")
    assert len(cuda) == 4 and "'fit': 'cpu'" in cuda[0] and "'features': 'cpu'" in cuda[0]
    assert "advertise no GPU" in cuda[1]

    # the tiny random VLM through `evaluate --protocol vqa`, twice: one run id, same answers
    vqa = r["sections"]["vqa"]
    assert vqa["identical_answers"] is True and len({x["run_id"] for x in vqa["runs"]}) == 1
    for x in vqa["runs"]:
        assert x["status"] == "ok" and x["devices"] == ["cpu"] and x["gpu"] is False
        assert (
            x["questions"] >= 2 * vqa["pairs"]
            and x["questions_per_s"] > 0
            and x["answer_phase_questions_per_s"] > 0
        )
    assert "vqa: two runs gave identical answers" in p.stdout

    bal = r["sections"]["balance"]
    assert 0 < bal["cache"]["features_share"] < 1
    # 4 train tiles x 2 crops
    assert bal["loader"]["items"] == 8 and bal["loader"]["items_per_s"] > 0
    assert bal["gpu_waits_for_chunks"] == (bal["loader_over_encoder"] < 1)
    assert {int(n) for n in bal["loader"]["items_per_s_by_threads"]} >= {2, 4} and all(
        v > 0 for v in bal["loader"]["items_per_s_by_threads"].values()
    )
    assert bal["cache"]["outside_read_encode_write_s"] >= 0
    assert "evaluate frozen" in p.stdout and "% peak" in p.stdout
    # what comes back from a device run: the JSON, the log and the records, not the cube
    back = tmp_path / "out"
    assert (
        len((back / "evaluate-results.jsonl").read_text().splitlines()) == 2
        and (back / "evaluate.log").exists()
    )
    assert (tmp_path / "work" / "cube").is_dir() and not list(back.glob("*.zarr"))


def test_cuda_without_a_gpu_fails_loudly(tmp_path):
    p, r = gpu_check(tmp_path, "--cluster", "cuda", "--dry")
    assert p.returncode == 1
    s = r["sections"]
    assert s["env"]["status"] == "failed" and "torch sees no CUDA device" in s["env"]["error"]
    assert s["evaluate"]["status"] == "failed" and "evaluate.log" in s["evaluate"]["error"]
    assert "--cluster cuda" in s["evaluate"]["log_tail"]  # the CLI's one-sentence reason
    # no peak to compare with: not run at all, not run on the CPU
    assert "encoders" not in s and "upernet" not in s
    assert s["balance"]["status"] == "failed"
    assert "env       failed" in p.stdout


def test_the_gpu_profile_names_what_exists():
    """The sizes only a GPU runs are checked here too: known models, recipe fields the engine
    accepts."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check import PROFILES

    from cryocube.families.recipes import load_recipe
    from cryocube.models import list_models

    gpu = PROFILES["gpu"]
    assert [label for label, _, _ in gpu.encoders] == ["ViT-S", "ViT-B", "ViT-L", "Swin", "U-Net"]
    assert {m for _, m, _ in gpu.encoders} <= set(list_models())
    cfg = load_recipe(None, list(gpu.evaluate))
    assert (
        cfg.input_size == gpu.upernet["input_size"]
        and cfg.decoder_channels == gpu.upernet["decoder_channels"] == 512
    )
    # memory-sized on the GPU
    assert gpu.upernet["batches"] == (8, 32) and gpu.encoder_batch is None
    assert sum(gpu.boxes.values()) < 8 * 60


def test_sections_rerun_only_what_was_asked(tmp_path):
    """A second device call reruns only the failed sections (plus env/cube they need), and a typo is
    refused."""
    p, r = gpu_check(tmp_path, "--cluster", "local", "--sections", "upernet")
    assert p.returncode == 0, p.stdout[-2000:]
    assert list(r["sections"]) == ["env", "cube", "upernet"] == r["sections_chosen"]
    bad = subprocess.run(
        [
            "bash",
            str(ROOT / "benchmarks" / "gpu_check.sh"),
            "--out",
            str(tmp_path / "o2"),
            "--sections",
            "upernet,vqq",
        ],
        env={
            **os.environ,
            "PY": sys.executable,
            "CRYOCUBE_GPU_WHEELS": str(tmp_path / "no-wheels"),
        },
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "unknown section(s) ['vqq']" in bad.stderr
