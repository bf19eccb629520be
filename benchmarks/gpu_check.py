"""The GPU path seen working (issue 20): encoders and the UPerNet step against a matmul peak
measured in the same run, and `cryocube evaluate --cluster cuda` end to end, on one small generated
cube.

    # on a GPU machine: installs the carried wheels, then this
    benchmarks/gpu_check.sh --out DIR
    # the same sections, tiny, on a CPU
    python benchmarks/gpu_check.py --cluster local --dry --out DIR

Sections (each time-boxed; one that fails is reported and the others still run):
  env       device, versions, fp32/bf16 matmul peaks
  encoders  samples/s, TFLOP/s and % of the peak of their precision, batches sized as the engine
            sizes them
  upernet   UPerNet training step at two batches and a validation forward, bf16 and fp32, % of peak
  evaluate  one frozen and one fine-tuning run through the CLI on the cluster; every record must
            name the cluster's device (cuda on `--cluster cuda`: nothing may quietly run on the CPU)
  vqa       the tiny random VLM on synthetic interferograms (`evaluate --protocol vqa`) on the
            cluster, twice into two folders: questions/s, the device it generated on, and whether
            the two runs gave identical answers
  balance   the feature cache's share of the frozen run, and the chunk loader's rate against the
            encoder's
DIR/gpu_check.json holds every figure (rewritten after each section); a short table ends the output.
Exit status 1 when a section failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import torch  # noqa: E402

MODEL = "ssl4eo_moco"  # ViT-S: the smallest pretrained encoder, the one evaluated end to end
VLM = "transformers"  # with --allow-random-weights: the tiny random-config LLaVA (no downloads)


@dataclass(frozen=True)
class Profile:
    """Sizes of one check: `gpu` fills an H200 for a few seconds per figure, `dry` proves the code
    on a CPU."""

    tile: int
    n_train: int  # train tiles of the generated GLID-like cube (val, test: a quarter, at least 2)
    encoders: tuple  # (label, model id, build options beyond bench_models.PUBLISHED_SETUP)
    # None: sized to free memory by the engine's rule (extract_batch_size)
    encoder_batch: int | None
    encoder_iters: int
    upernet: dict  # input_size, decoder_channels, batches
    evaluate: tuple  # recipe overrides of the end-to-end runs
    loader_samples: int
    # pairs (synthetic interferograms), recipe overrides of the vqa runs
    vqa: dict = field(default_factory=dict)
    boxes: dict = field(default_factory=dict)  # seconds per section


PROFILES = {
    "gpu": Profile(
        tile=512,
        n_train=16,
        encoders=(
            ("ViT-S", "ssl4eo_moco", {}),
            ("ViT-B", "remoteclip", {}),
            ("ViT-L", "scalemae", {}),
            ("Swin", "satlasnet_si", {}),
            ("U-Net", "unet", {}),
        ),
        encoder_batch=None,
        encoder_iters=5,
        upernet={"input_size": 224, "decoder_channels": 512, "batches": (8, 32)},
        evaluate=(
            "epochs=10",
            "input_size=224",
            "decoder_channels=512",
            "val_every=5",
            "crops_per_sample=4",
            "batch_size=8",
            "normalization=cube",
        ),
        loader_samples=16,
        vqa={"pairs": 64, "sets": ("block_samples=16", "gen_batch=16")},
        boxes={
            "env": 30,
            "cube": 40,
            "evaluate": 150,
            "vqa": 60,
            "encoders": 80,
            "upernet": 50,
            "balance": 20,
        },
    ),
    "dry": Profile(
        tile=32,
        n_train=4,
        encoders=(
            ("ViT-S", "ssl4eo_moco", {"input_size": 32}),
            ("U-Net", "unet", {"input_size": 32}),
        ),
        encoder_batch=2,
        encoder_iters=1,
        upernet={"input_size": 32, "decoder_channels": 32, "batches": (2, 4)},
        evaluate=(
            "epochs=1",
            "input_size=32",
            "decoder_channels=32",
            "val_every=1",
            "crops_per_sample=2",
            "batch_size=2",
            "normalization=cube",
            "threads=1",
        ),
        loader_samples=4,
        vqa={
            "pairs": 4,
            "sets": ("block_samples=2", "gen_batch=4", "max_new_tokens=4", "threads=1"),
        },
        boxes={
            "env": 60,
            "cube": 60,
            "evaluate": 240,
            "vqa": 120,
            "encoders": 120,
            "upernet": 120,
            "balance": 60,
        },
    ),
}


# in the order they run
SECTIONS = ("env", "cube", "evaluate", "vqa", "encoders", "upernet", "balance")
NEEDS = {
    "evaluate": ("cube",),
    "encoders": ("env",),
    "upernet": ("env", "cube"),
    "balance": ("cube",),
}


class SectionFailed(Exception):
    """A section's verdict, with what it measured before failing (kept in the JSON)."""

    def __init__(self, message: str, partial: dict):
        super().__init__(message)
        self.partial = partial


class Check:
    """Runs sections in order, each in its time box, and keeps the JSON file current."""

    def __init__(self, out: Path, budget: float):
        self.out, self.budget, self.t0 = out, budget, time.perf_counter()
        self.result: dict = {
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "sections": {},
        }

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.t0)

    def section(self, name: str, box: float, fn, *args) -> dict | None:
        box = min(box, self.left())
        t = time.perf_counter()
        if box < 5:
            rec = {"status": "skipped", "error": f"no time left in the {self.budget:.0f} s budget"}
        else:
            print(f"gpu_check: {name} (box {box:.0f} s)", flush=True)
            try:
                rec = {"status": "ok", **fn(t + box, *args)}
            except Exception as e:  # a failed section is a result too; the others still run
                rec = {
                    **getattr(e, "partial", {}),
                    "status": "failed",
                    "error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc(),
                }
                print(f"gpu_check: {name} FAILED: {rec['error']}", flush=True)
        rec["seconds"] = round(time.perf_counter() - t, 2)
        if rec["status"] == "ok" and rec["seconds"] > box + 1:
            rec["over_box"] = True
        self.result["sections"][name] = rec
        self.save()
        return rec if rec["status"] == "ok" else None

    def save(self) -> None:
        self.result["wall_s"] = round(time.perf_counter() - self.t0, 1)
        (self.out / "gpu_check.json").write_text(json.dumps(self.result, indent=1, default=str))


# -- sections
# ---------------------------------------------------------------------------------------------


def env(deadline: float, device: str) -> dict:
    import importlib.metadata as md

    from bench_models import matmul_peak, peaks

    from cryocube.precision import resolve, this_device

    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "--cluster cuda but torch sees no CUDA device (torch.cuda.is_available() is False)"
        )
    info = this_device(device)
    if device == "cuda":  # big enough to keep the tensor cores busy for tens of milliseconds
        pk = {
            "fp32": matmul_peak(device, n=8192, iters=5),
            "bf16": matmul_peak(device, n=8192, iters=20, dtype=torch.bfloat16),
        }
        was = torch.backends.cuda.matmul.allow_tf32
        # what cuDNN's fp32 convolutions run on by default
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            pk["tf32"] = matmul_peak(device, n=8192, iters=10)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = was
        torch.cuda.empty_cache()  # the evaluate section's worker shares this GPU
    else:
        pk = peaks(device)
    versions = {}
    for d in (
        "torch",
        "dask",
        "distributed",
        "dask-cuda",
        "zarr",
        "numcodecs",
        "xarray",
        "timm",
        "numpy",
        "cuda-core",
    ):
        try:
            versions[d] = md.version(d)
        except md.PackageNotFoundError:
            versions[d] = None
    return {
        "device": info.describe(),
        "memory_gb": (info.memory_bytes or 0) / 2**30,
        "python": platform.python_version(),
        "precision_auto": resolve("auto", info),
        "peak_fp32_tflops": pk["fp32"] / 1e12,
        "peak_bf16_tflops": pk["bf16"] / 1e12,
        "peak_tf32_tflops": pk.get("tf32", pk["fp32"]) / 1e12,
        "tf32": {
            "matmul": torch.backends.cuda.matmul.allow_tf32,
            "cudnn": torch.backends.cudnn.allow_tf32,
        },
        "cpu_count": os.cpu_count(),
        "versions": versions,
        "peaks": pk,
    }


def encoders(deadline: float, prof: Profile, device: str, peaks: dict) -> dict:
    from bench_models import PUBLISHED_SETUP, measure

    from cryocube.families.encoders import extract_batch_size
    from cryocube.precision import resolve, this_device

    precision = resolve("auto", this_device(device))

    def batch(enc):  # what extraction would use on this device
        spec = SimpleNamespace(input_size=enc.input_size, precision=precision)
        return extract_batch_size(enc, spec, device, prof.encoder_batch)

    rows, left_out = [], []
    for label, model, setup in prof.encoders:
        if time.perf_counter() > deadline:
            left_out.append(label)
            continue
        r = measure(
            model,
            {**PUBLISHED_SETUP.get(model, {}), **setup},
            batch,
            prof.encoder_iters,
            device,
            precision,
            kernels=True,
        )
        r.update(
            label=label, tflops=r["flops_s"] / 1e12, pct_peak=100 * r["flops_s"] / peaks[precision]
        )
        del r["peak"]  # measure's own small probe; pct_peak is against the run's peak
        rows.append(r)
        k = r.get("kernels") or {}
        print(
            f"  {label} ({model}): batch {r['batch']}, {r['sps']:.1f} samples/s, {r['tflops']:.2f}"
            f" TFLOP/s, {r['pct_peak']:.0f}% of the {precision} peak"
            + (
                f"; GPU busy {100 * k['gpu_busy_share']:.0f}% of the forward, tensor-core kernels "
                f"{100 * k['tensor_core_share']:.0f}% of GPU time, most other: {k['top_other'][:2]}"
                if k.get("tensor_core_share") is not None
                else f"; kernels: {k.get('error', 'not profiled')}"
            ),
            flush=True,
        )
        if device == "cuda":
            torch.cuda.empty_cache()
    if left_out:
        raise TimeoutError(
            f"time box spent before {', '.join(left_out)} (measured: {[r['label'] for r in rows]})"
        )
    return {"precision": precision, "rows": rows}


def upernet(deadline: float, prof: Profile, cube: str, device: str, peaks: dict) -> dict:
    from bench_engine import upernet_step

    from cryocube.families.recipes import load_recipe

    u, rows = prof.upernet, []
    for bs in u["batches"]:
        if time.perf_counter() > deadline:
            raise TimeoutError(f"time box spent before batch {bs}")
        cfg = load_recipe(
            None,
            [
                f"input_size={u['input_size']}",
                f"decoder_channels={u['decoder_channels']}",
                f"batch_size={bs}",
                "normalization=cube",
            ],
        )
        s = upernet_step(
            cube,
            MODEL,
            cfg,
            torch.get_num_threads(),
            device,
            precisions=("bf16", "fp32"),
            peaks=peaks,
        )
        for prec in ("bf16", "fp32"):
            # fp32 convolutions run on TF32 tensor cores where cuDNN allows it (torch's default):
            # that is their peak
            against = (
                "tf32"
                if prec == "fp32"
                and device == "cuda"
                and torch.backends.cudnn.allow_tf32
                and "tf32" in peaks
                else prec
            )
            for what in ("step", "val"):
                sec, gf = s[f"{what}_{prec}_s"], s[f"gflop_per_{what}"]
                rows.append(
                    {
                        "what": what,
                        "batch": bs,
                        "precision": prec,
                        "seconds": sec,
                        "gflop": gf,
                        "tflops": gf / sec / 1e3,
                        "pct_peak": 100 * gf * 1e9 / sec / peaks[against],
                        "peak": against,
                        "memory_format": s["memory_format"],
                    }
                )
        print(
            f"  batch {bs}: "
            + ", ".join(
                f"{r['what']} {r['precision']} {r['pct_peak']:.0f}%"
                for r in rows
                if r["batch"] == bs
            ),
            flush=True,
        )
        if device == "cuda":
            torch.cuda.empty_cache()
    return {"input_size": u["input_size"], "decoder_channels": u["decoder_channels"], "rows": rows}


def cli(cmd: list[str], log_path: Path, deadline: float, mode: str = "w"):
    """Run a cryocube command until the deadline, its output into `log_path`; its exit status, or
    "timeout"."""
    env = {
        **os.environ,
        "PYTHONPATH": (
            os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        ),
    }
    with open(log_path, mode) as log:
        # its own process group: at the time box, its cluster's worker processes (holding the GPU)
        # go with it
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=max(5.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            rc = "timeout"
            for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, None)):
                os.killpg(proc.pid, sig)
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
    return rc


# what the same run must repeat exactly
REPEATED = ("metrics", "confusion_matrix", "val_curve", "best_epoch", "steps")


def evaluate(
    deadline: float, prof: Profile, cube: str, cluster: str, device: str, out: Path, work: Path
) -> dict:
    """The frozen and fine-tuning runs through the CLI, then the same command again into a second
    folder (no cache hit): every record on the cluster's device, and the second run's metrics,
    confusion matrix and curve equal to the first's bit for bit."""
    res = work / "evaluate"
    cmd = [
        sys.executable,
        "-m",
        "cryocube.cli",
        "evaluate",
        "--cubes",
        cube,
        "--models",
        MODEL,
        "--protocol",
        "frozen,finetune",
        "--allow-random-weights",
        "--out",
        str(res),
        "--cluster",
        cluster,
        "--workers",
        "1",
        "--quiet",
    ]
    for s in prof.evaluate:
        cmd += ["--set", s]
    t = time.perf_counter()
    rc = cli(cmd, out / "evaluate.log", deadline)
    wall = time.perf_counter() - t
    again = work / "evaluate-again"
    rc2 = (
        cli([str(again) if c == str(res) else c for c in cmd], out / "evaluate.log", deadline, "a")
        if rc == 0
        else None
    )
    # the records and tracebacks come back with the JSON
    for f in ("results.jsonl", "logs/errors.log"):
        if (res / f).exists():
            shutil.copy(res / f, out / f"evaluate-{Path(f).name}")
    lines = (
        (res / "results.jsonl").read_text().splitlines() if (res / "results.jsonl").exists() else []
    )
    recs = {r["protocol"]: r for r in map(json.loads, lines)}
    runs = {}
    for proto, r in recs.items():
        runs[proto] = {
            k: r.get(k)
            for k in (
                "status",
                "error",
                "device",
                "feature_devices",
                "precision",
                "memory_format",
                "timings",
                "samples_per_s",
                "peak_memory_mb",
                "encoder_forward_items",
                "threads",
                "steps",
            )
        }
        runs[proto]["mIoU"] = (r.get("metrics") or {}).get("mIoU")
        runs[proto]["cluster"] = {
            k: (r.get("cluster") or {}).get(k) for k in ("n_workers", "gpu", "resources")
        }
    result = {"command": " ".join(cmd), "rc": rc, "wall_s": wall, "runs": runs, "rerun_rc": rc2}
    problems = ([f"the CLI exited {rc} (see evaluate.log)"] if rc != 0 else []) + device_problems(
        runs, device
    )
    if rc2 is not None:
        lines2 = (
            (again / "results.jsonl").read_text().splitlines()
            if (again / "results.jsonl").exists()
            else []
        )
        recs2 = {r["protocol"]: r for r in map(json.loads, lines2)}
        result["repeated_bits"] = {
            p: {k: recs2.get(p, {}).get(k) == r.get(k) for k in REPEATED} for p, r in recs.items()
        }
        for p, same in result["repeated_bits"].items():
            if not all(same.values()):
                a, b = recs[p].get("metrics", {}), recs2.get(p, {}).get("metrics", {})
                problems.append(
                    f"{p}: the same run again differs in {[k for k, v in same.items() if not v]} "
                    f"(mIoU {a.get('mIoU')} then {b.get('mIoU')})"
                )
        if rc2 != 0:
            problems.append(f"the second run exited {rc2} (see evaluate.log)")
    if problems:
        result["log_tail"] = (out / "evaluate.log").read_text()[-3000:]
        raise SectionFailed("; ".join(problems), result)
    return result


def vqa(deadline: float, prof: Profile, cluster: str, device: str, out: Path, work: Path) -> dict:
    """The same vqa run twice (two results folders, so neither is a cache hit): questions/s inside
    generate() and over the whole answer phase, where it generated, and whether the two gave
    identical answers.
    """
    from bench_engine import cluster as local_cluster

    from cryocube.convert.writer import convert
    from cryocube.insar_synthetic import make_interferograms

    make_interferograms(work / "vqa-raw", n=prof.vqa["pairs"], size=32, seed=0)
    cl, c = local_cluster(1)
    try:
        convert("insar", str(work / "vqa-raw"), str(work / "vqa-cube"), client=c, progress=False)
    finally:
        c.close()
        cl.close()
    runs, result = [], {"pairs": prof.vqa["pairs"], "runs": []}
    for k in (1, 2):
        res = work / f"vqa{k}"
        cmd = [
            sys.executable,
            "-m",
            "cryocube.cli",
            "evaluate",
            "--cubes",
            str(work / "vqa-cube"),
            "--models",
            VLM,
            "--protocol",
            "vqa",
            "--allow-random-weights",
            "--out",
            str(res),
            "--cluster",
            cluster,
            "--workers",
            "1",
            "--quiet",
        ]
        for s in prof.vqa["sets"]:
            cmd += ["--set", s]
        result["command"] = " ".join(cmd)
        # one file: what comes back is counted
        rc = cli(cmd, out / "vqa.log", deadline, "w" if k == 1 else "a")
        lines = (
            (res / "results.jsonl").read_text().splitlines()
            if (res / "results.jsonl").exists()
            else []
        )
        if rc != 0 or len(lines) != 1:
            result["log_tail"] = (out / "vqa.log").read_text()[-3000:]
            raise SectionFailed(
                f"run {k}: the CLI exited {rc} with {len(lines)} record(s) (see vqa.log)", result
            )
        r = json.loads(lines[0])
        g, t = r["generation_stats"], r["timings"]
        result["runs"].append(
            {
                "run_id": r["run_id"],
                "status": r["status"],
                "error": r.get("error"),
                "precision": r["precision"],
                "devices": g.get("devices"),
                "gpu": (r.get("cluster") or {}).get("gpu"),
                "questions": g["questions"],
                "generate_s": t["generate_s"],
                "answer_s": t["test_s"],
                "questions_per_s": g["questions_per_s"],
                "tokens_per_s": g["tokens_per_s"],
                "answer_phase_questions_per_s": g["questions"] / t["test_s"],
                "parsed": r["metrics"]["parsed"],
            }
        )
        runs.append(
            (res / "runs" / r["run_id"] / "answers.jsonl").read_text()
            if r["status"] == "ok"
            else None
        )
    a, b = result["runs"]
    result["identical_answers"] = runs[0] is not None and runs[0] == runs[1]
    problems = [
        f"run {i + 1}: {x['status']}: {x['error']}"
        for i, x in enumerate(result["runs"])
        if x["status"] != "ok"
    ]
    problems += [
        f"run {i + 1} generated on {x['devices']}, not {device}"
        for i, x in enumerate(result["runs"])
        if x["status"] == "ok" and x["devices"] != [device]
    ]
    if device == "cuda":
        problems += [
            f"run {i + 1}: the cluster's workers advertise no GPU resource"
            for i, x in enumerate(result["runs"])
            if not x["gpu"]
        ]
    if a["run_id"] != b["run_id"]:
        problems.append(f"the same command planned two run ids ({a['run_id']}, {b['run_id']})")
    if not problems and not result["identical_answers"]:
        problems.append("the two runs gave different answers")
    if problems:
        raise SectionFailed("; ".join(problems), result)
    return result


def device_problems(runs: dict, device: str) -> list[str]:
    """What in the frozen and fine-tuning records did not run where the cluster's device is (one
    line each)."""
    problems = []
    for proto in ("frozen", "finetune"):
        r = runs.get(proto)
        if r is None:
            problems.append(f"no {proto} record")
            continue
        if r["status"] != "ok":
            problems.append(f"{proto}: {r['status']}: {r['error']}")
            continue
        where = {
            "fit": r["device"],
            "precision": (r["precision"] or {}).get("device", "").split(" ")[0],
        }
        if proto == "frozen":  # the feature cache was extracted in this run (a fresh --out)
            where["features"] = ",".join(r["feature_devices"] or []) or "none"
        wrong = {k: v for k, v in where.items() if v != device}
        if wrong:
            problems.append(f"{proto}: ran on {wrong}, not {device}")
        if device == "cuda" and not r["cluster"]["gpu"]:
            problems.append(f"{proto}: the cluster's workers advertise no GPU resource")
    return problems


def balance(
    deadline: float, prof: Profile, cube: str, device: str, run: dict, enc_sps: float | None
) -> dict:
    """Cache share of the frozen run, and whether one loader thread (extraction's prefetch) keeps up
    with the encoder."""
    import numpy as np

    from cryocube.engine.plan import plan_runs
    from cryocube.families import PlanContext, RunSpec
    from cryocube.families.recipes import load_recipe
    from cryocube.families.segmentation.data import crop_offsets
    from cryocube.families.segmentation.features import _windows, _windows_threaded
    from cryocube.precision import this_device

    out: dict = {}
    if run:
        t = run["timings"]
        work = t["features_wall_s"] + t["train_s"] + t["test_s"]
        out["cache"] = {
            "features_wall_s": t["features_wall_s"],
            "decoder_train_s": t["train_s"],
            "test_s": t["test_s"],
            "features_share": t["features_wall_s"] / work if work else None,
            "extraction_items_per_s": (
                run["encoder_forward_items"] / t["features_wall_s"]
                if t["features_wall_s"]
                else None
            ),
        }
        ph = t.get("feature_phases") or {}
        # the extraction's wall beyond its own reads, encodes and writes: encoder build, CUDA start,
        # scheduling
        if ph:
            out["cache"]["phases"] = ph
            out["cache"]["outside_read_encode_write_s"] = (
                t["features_wall_s"]
                - ph.get("read_wait_s", 0)
                - ph.get("encode_s", 0)
                - ph.get("write_s", 0)
            )
        if enc_sps and out["cache"]["extraction_items_per_s"]:
            out["cache"]["extraction_over_encoder"] = (
                out["cache"]["extraction_items_per_s"] / enc_sps
            )
    cfg = load_recipe(None, list(prof.evaluate))
    p = plan_runs(
        [RunSpec(MODEL, cube)],
        cfg,
        PlanContext(
            out=str(Path(cube).parent / "plan"),
            allow_random_weights=True,
            device=this_device(device),
        ),
    )[0]
    cache = p.work.cache
    samples = np.asarray(p.work.train_samples)[: prof.loader_samples]
    per = cfg.crops_per_sample
    offsets = crop_offsets(samples.size, per, cache.tile, cache.encoder.input_size, 0)
    _windows(cache, samples[:1], offsets[:per], per)  # first open of the cube
    t0 = time.perf_counter()
    x, _, nbytes, _ = _windows(cache, samples, offsets, per)
    sec = time.perf_counter() - t0
    out["loader"] = {
        "items": int(x.shape[0]),
        "seconds": sec,
        "items_per_s": x.shape[0] / sec,
        "mb_per_s": nbytes / sec / 2**20,
    }
    # the same reads on several threads, as extraction reads on a GPU (features._windows_threaded)
    threaded = {}
    for n in sorted({2, 4, os.cpu_count() or 1}):
        t0 = time.perf_counter()
        x = _windows_threaded(cache, samples, offsets, per, n)[0]
        threaded[n] = round(x.shape[0] / (time.perf_counter() - t0), 1)
    out["loader"]["items_per_s_by_threads"] = threaded
    if enc_sps:
        out["encoder_items_per_s"] = enc_sps
        out["loader_over_encoder"] = out["loader"]["items_per_s"] / enc_sps
        out["gpu_waits_for_chunks"] = out["loader_over_encoder"] < 1
    return out


# -- table
# ------------------------------------------------------------------------------------------------


def table(result: dict) -> str:
    s = result["sections"]
    lines = [
        f"gpu_check {result['profile']} on {s.get('env', {}).get('device', '?')}, --cluster"
        f" {result['cluster']}, {result['wall_s']:.0f} s"
    ]
    for name, sec in s.items():
        lines.append(
            f"  {name:9s} {sec['status']:8s} {sec['seconds']:6.1f} s"
            + (f"  {sec['error'][:200]}" if "error" in sec else "")
        )
    e = s.get("env", {})
    if e.get("status") == "ok":
        lines.append(
            f"peaks: fp32 {e['peak_fp32_tflops']:.2f} TFLOP/s, tf32"
            f" {e.get('peak_tf32_tflops', 0):.2f}, bf16 {e['peak_bf16_tflops']:.2f} TFLOP/s (tf32"
            f" {e['tf32']})"
        )
    if s.get("encoders", {}).get("status") == "ok":
        lines.append(
            f"{'encoder':8s} {'model':14s} {'batch':>5s} {'samples/s':>10s} {'TFLOP/s':>8s}"
            f" {'% peak':>7s}"
        )
        for r in s["encoders"]["rows"]:
            lines.append(
                f"{r['label']:8s} {r['model']:14s} {r['batch']:5d} {r['sps']:10.1f}"
                f" {r['tflops']:8.2f} {r['pct_peak']:6.0f}%"
            )
    if s.get("upernet", {}).get("status") == "ok":
        lines.append(
            f"{'UPerNet':8s} {'batch':>5s} {'prec':>5s} {'seconds':>8s} {'TFLOP/s':>8s}"
            f" {'% peak':>7s}"
        )
        for r in s["upernet"]["rows"]:
            lines.append(
                f"{r['what']:8s} {r['batch']:5d} {r['precision']:>5s} {r['seconds']:8.4f}"
                f" {r['tflops']:8.2f} {r['pct_peak']:6.0f}% of {r.get('peak', r['precision'])}"
            )
    ev = s.get("evaluate", {})
    for proto, r in (ev.get("runs") or {}).items():
        t = r.get("timings") or {}
        lines.append(
            f"evaluate {proto:9s} {r['status']} device {r['device']} features"
            f" {r.get('feature_devices')} precision {(r.get('precision') or {}).get('effective')}"
            f" mIoU {r.get('mIoU')} features {t.get('features_wall_s', 0):.1f} s train"
            f" {t.get('train_s', 0):.1f} s test {t.get('test_s', 0):.1f} s"
        )
    if "repeated_bits" in ev:
        lines.append(
            "evaluate again: "
            + ", ".join(
                f"{p} {'same bits' if all(v.values()) else 'DIFFERENT'}"
                for p, v in ev["repeated_bits"].items()
            )
        )
    for i, r in enumerate(s.get("vqa", {}).get("runs") or []):
        lines.append(
            f"vqa run {i + 1}  {r['status']} on {r['devices']} {r['precision']['effective']}:"
            f" {r['questions']} questions, {r['questions_per_s'] or 0:.1f}/s in generate(),"
            f" {r['answer_phase_questions_per_s']:.1f}/s over the answer phase, parsed"
            f" {r['parsed']:.0f}%"
        )
    if "identical_answers" in s.get("vqa", {}):
        lines.append(
            f"vqa: two runs gave {'identical' if s['vqa']['identical_answers'] else 'DIFFERENT'}"
            " answers"
        )
    b = s.get("balance", {})
    if b.get("status") == "ok":
        if "cache" in b:
            lines.append(
                f"cache: extraction {100 * (b['cache']['features_share'] or 0):.0f}% of the frozen"
                " run's work"
                + (
                    f", of it {b['cache']['outside_read_encode_write_s']:.1f} s outside reads,"
                    " encodes and writes"
                    if "outside_read_encode_write_s" in b["cache"]
                    else ""
                )
            )
        ratio = b.get("loader_over_encoder")
        lines.append(
            f"loader: {b['loader']['items_per_s']:.0f} items/s on one thread"
            + (
                f", {ratio:.2f}x the encoder's {b['encoder_items_per_s']:.0f}/s: "
                f"{'the GPU waits for chunks' if ratio < 1 else 'the GPU is not kept waiting'}"
                if ratio
                else ""
            )
            + f"; by threads {b['loader'].get('items_per_s_by_threads')}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--cluster", default="cuda", help="cuda (the check) or local (a dry run on a CPU)"
    )
    ap.add_argument(
        "--dry",
        action="store_true",
        help="tiny sizes (the CPU dry check); default with --cluster local",
    )
    ap.add_argument(
        "--out",
        default=os.environ.get("OUT") or "gpu-check-out",
        help="folder of gpu_check.json (default $OUT)",
    )
    ap.add_argument(
        "--work",
        help=(
            "scratch folder for the cube and the runs (default: a new temporary one, removed "
            "at the end; only the JSON, logs and records go to --out)"
        ),
    )
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for all sections together")
    ap.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=(
            "comma-separated sections to run (a rerun of what failed); env and cube run too when a "
            "chosen section needs them"
        ),
    )
    a = ap.parse_args(argv)
    chosen = set(filter(None, a.sections.split(",")))
    if chosen - set(SECTIONS):
        ap.error(
            f"unknown section(s) {sorted(chosen - set(SECTIONS))}; choose from"
            f" {', '.join(SECTIONS)}"
        )
    chosen |= {need for s in chosen for need in NEEDS.get(s, ())}
    device = "cuda" if a.cluster == "cuda" else "cpu"
    prof_name = "dry" if a.dry or a.cluster != "cuda" else "gpu"
    prof = PROFILES[prof_name]
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = (
        Path(a.work).resolve() if a.work else Path(tempfile.mkdtemp(prefix="cryocube-gpu-check-"))
    )
    # this script's own folders: a rerun measures again
    for mine in ("cube", "evaluate", "evaluate-again", "vqa-raw", "vqa-cube", "vqa1", "vqa2"):
        shutil.rmtree(work / mine, ignore_errors=True)
    check = Check(out, a.budget)
    check.result.update(profile=prof_name, cluster=a.cluster, device=device, argv=sys.argv[1:])

    def make_cube(deadline: float) -> dict:
        from bench_engine import cluster, make_cube

        cl, c = cluster(1)
        try:
            return {"cube": make_cube(work / "cube", prof.n_train, prof.tile, client=c)}
        finally:
            c.close()
            cl.close()

    check.result["sections_chosen"] = [s for s in SECTIONS if s in chosen]
    e = check.section("env", prof.boxes["env"], env, device) if "env" in chosen else None
    peaks = e["peaks"] if e else None
    c = check.section("cube", prof.boxes["cube"], make_cube) if "cube" in chosen else None
    cube = c["cube"] if c else None
    # evaluate first: it is the claim to see working; its cluster's worker gets the GPU to itself
    ev = None
    if cube and "evaluate" in chosen:
        ev = check.section(
            "evaluate", prof.boxes["evaluate"], evaluate, prof, cube, a.cluster, device, out, work
        )
    if "vqa" in chosen:
        check.section("vqa", prof.boxes["vqa"], vqa, prof, a.cluster, device, out, work)
    enc = (
        check.section("encoders", prof.boxes["encoders"], encoders, prof, device, peaks)
        if peaks and "encoders" in chosen
        else None
    )
    if peaks and cube and "upernet" in chosen:
        check.section("upernet", prof.boxes["upernet"], upernet, prof, cube, device, peaks)
    vit_s = next((r["sps"] for r in (enc or {}).get("rows", []) if r["model"] == MODEL), None)
    if cube and "balance" in chosen:
        check.section(
            "balance",
            prof.boxes["balance"],
            balance,
            prof,
            cube,
            device,
            (ev or {}).get("runs", {}).get("frozen"),
            vit_s,
        )
    check.save()
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    print(table(check.result), flush=True)
    print(f"gpu_check: figures in {out / 'gpu_check.json'}", flush=True)
    return 0 if all(s["status"] == "ok" for s in check.result["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
