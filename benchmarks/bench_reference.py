"""cryocube against the real Cryo-Bench code (issue 26), side by side in one invocation, figures
printed.

The reference is github Sk-2103/Cryo-Bench run by the peer harness (../shared/peer/peer.py `train`:
the reference's own Hydra configs, GLID dataset class, SegUPerNet, SegTrainer and SegEvaluator, one
CPU process). cryocube is the `cryocube evaluate` command. Both read the same synthetic raw GLID
tiles (`cryocube.synthetic.make_raw`; cryocube converts them to a cube first, timed apart as a
one-off), both run as fresh processes given every core, one after the other; wall time, test mIoU
and the cores each really used (child CPU seconds / wall) are printed with the ratio, then a time
budget of both sides: start-up, reads, feature extraction, per-epoch decoder
forward/backward/optimiser, validation and test inference, writing, each compute phase with its
FLOPs beside the fp32/bf16 matmul peaks measured here.

Rows: frozen (SSL4EO-MAE ViT-S + UPerNet-512, frozen; the headline), vitb (DOFA ViT-B/16, frozen),
fewshot (10 % of 40 training tiles), finetune (SSL4EO-MAE ViT-S trained end to end), and the grid's
largest part: frozen_large / finetune_large (TerraMind-L, a ViT-L: 24 blocks of 1024; the
reference's config with `encoder.encoder_weights=null` for random weights) and frozen_swin /
finetune_swin (GFM-Swin-B, window 6, 192 px), at 3 epochs each unless --epochs is given.
cryocube's bf16 run (precision auto on a CPU with AMX/AVX512-BF16) is also run in fp32 on the same
data and seed (the accuracy check: within 1 mIoU point), and with `--workers 2` (1 worker with every
core against 2 workers with one thread each). The load average is printed beside each run: other
processes on the cores show there.

    python benchmarks/bench_reference.py          # frozen row, 20 epochs, validation every 5
    python benchmarks/bench_reference.py --rows frozen,vitb,fewshot,finetune
    # minutes, for a smoke check
    python benchmarks/bench_reference.py --epochs 4 --val-every 2 --rows frozen
    python benchmarks/bench_reference.py --rows finetune_large,frozen_large --budget-out budget.json
    # the unit costs of rows kept by several invocations (--keep DIR), merged into one budget
    python benchmarks/bench_reference.py --budget-from DIR1,DIR2 --budget-out budget.json

Needs the reference and its venv: fetch github Sk-2103/Cryo-Bench (the search tool's `fetch`) and
point PEER_REF_MIRROR at the git directory it returns; PEER_VENV is a Python 3.11 venv with torch,
timm, hydra-core 1.3, omegaconf, einops, fvcore, matplotlib, wandb, scikit-learn, rasterio (see
../shared/peer/README.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))


@dataclass(frozen=True)
class Row:
    name: str
    ref_encoder: str
    model: str
    protocol: str = "frozen"
    train_tiles: int = 4
    fraction: float | None = None
    # Hydra overrides of the reference's run (TerraMind's config names a weights file its factory
    # loads itself: null gives random weights, as every other row)
    ref_overrides: tuple[str, ...] = ()
    # the row's own epochs / validation interval when --epochs / --val-every are not given (the
    # same on both sides): a ViT-L fine-tune at 20 epochs is most of an hour of 2 shared cores; at
    # 3 (3 steps, 2 validations and the test of 18 windows each) it is minutes
    epochs: int | None = None
    val_every: int | None = None


TERRAMIND_RANDOM = ("encoder.encoder_weights=null",)
ROWS = {
    "frozen": Row("frozen", "ssl4eo_mae_optical", "ssl4eo_mae_optical"),
    "vitb": Row("vitb", "dofa", "dofa"),
    "fewshot": Row("fewshot", "ssl4eo_mae_optical", "ssl4eo_mae_optical", "fewshot", 40, 0.1),
    "finetune": Row("finetune", "ssl4eo_mae_optical", "ssl4eo_mae_optical", "finetune"),
    # the grid's largest part: a ViT-L-sized encoder (TerraMind-L, 24 x 1024), a Swin (GFM-Swin-B)
    "frozen_large": Row(
        "frozen_large",
        "terramind_large",
        "terramind_large",
        ref_overrides=TERRAMIND_RANDOM,
        epochs=3,
        val_every=3,
    ),
    "finetune_large": Row(
        "finetune_large",
        "terramind_large",
        "terramind_large",
        "finetune",
        ref_overrides=TERRAMIND_RANDOM,
        epochs=3,
        val_every=3,
    ),
    # the grid's most numerous fine-tunes: a ViT-B (DOFA, 12 x 768)
    "finetune_vitb": Row("finetune_vitb", "dofa", "dofa", "finetune", epochs=3, val_every=3),
    "frozen_swin": Row("frozen_swin", "gfmswin", "gfmswin", epochs=3, val_every=3),
    "finetune_swin": Row("finetune_swin", "gfmswin", "gfmswin", "finetune", epochs=3, val_every=3),
    # the B class's largest encoder (SpectralGPT), which the grid scales from DOFA by GFLOPs
    "finetune_spectralgpt": Row(
        "finetune_spectralgpt", "spectralgpt", "spectralgpt", "finetune", epochs=3, val_every=3
    ),
}


def row_args(row: Row, a) -> argparse.Namespace:
    """The arguments of one row: --epochs / --val-every when given, else the row's own, else 20 /
    5; both sides of the row run with these."""
    return argparse.Namespace(
        **{
            **vars(a),
            "epochs": a.epochs or row.epochs or 20,
            "val_every": a.val_every or row.val_every or 5,
        }
    )


def peer_paths() -> tuple[Path, Path, Path, str]:
    """(peer.py, the venv's python, the reference mirror, its cache); exits with one sentence when
    missing."""
    peer = Path(os.environ.get("PEER_PY", REPO.parent / "shared" / "peer" / "peer.py"))
    venv = Path(os.environ.get("PEER_VENV", "/work/peervenv"))
    mirror = Path(os.environ.get("PEER_REF_MIRROR", "/work/.mirror/Sk-2103+Cryo-Bench/repo"))
    cache = os.environ.get("PEER_REF_CACHE", str(Path(tempfile.gettempdir()) / "peer_ref"))
    py = venv / "bin" / "python"
    missing = [
        what
        for what, ok in (
            ("peer.py", peer.is_file()),
            ("the reference's venv", py.is_file()),
            ("the reference snapshot", (mirror / "HEAD").is_file() or (mirror / ".git").exists()),
        )
        if not ok
    ]
    if missing:
        sys.exit(
            f"bench_reference: {', '.join(missing)} missing ({peer}, {py}, {mirror}): fetch github"
            " Sk-2103/Cryo-Bench and set PEER_REF_MIRROR to its git directory, and make a Python"
            " 3.11 venv with the packages of ../shared/peer/README.md (`Setup`) at PEER_VENV"
            " (PEER_PY names peer.py if it lives elsewhere)."
        )
    return peer, py, mirror, cache


def timed(cmd: list[str], env: dict, log: Path) -> dict:
    """Run a fresh process; wall seconds and the cores it used (CPU seconds of it and its children /
    wall)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_before = os.getloadavg()[0]
    t = time.perf_counter()
    with open(log, "w") as err:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if p.returncode:
        tail = log.read_text()[-2000:]
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {p.returncode}; end of {log}:\n{tail}")
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "cores_used": cpu / wall,
        "stdout": p.stdout,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }


def make_data(root: Path, row: Row, cc_env: dict) -> tuple[Path, str, float]:
    """Raw GLID tiles in the published layout (the reference reads these) and their cube (cryocube
    reads it)."""
    from cryocube.synthetic import make_raw

    raw = root / f"raw-{row.train_tiles}" / "glid"
    cube = root / f"glid-{row.train_tiles}.zarr"
    if not cube.exists():
        make_raw("glid", raw, n={"train": row.train_tiles, "val": 2, "test": 2}, size=512, seed=0)
        t = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "cryocube.cli",
                "convert",
                "glid",
                "--raw",
                str(raw),
                "--out",
                str(cube),
                "--quiet",
                "--workers",
                "1",
            ],
            env=cc_env,
            check=True,
            capture_output=True,
        )
        return raw.parent, str(cube), time.perf_counter() - t
    return raw.parent, str(cube), 0.0


def subset_raw(row: Row, raw: Path, cube: str, a) -> tuple[Path, list[int]]:
    """The reference's raw folder for a label-fraction row: the train tiles of cryocube's own 10 %
    draw, linked (val and test whole). peer.py builds the reference's datasets itself and does not
    apply `limited_label_train` (pangaea/run.py does), so without this the reference trained on
    every tile: the same samples on both sides, drawn once (cryocube's stratified draw), instead of
    two different draws.
    """
    from cryocube.cube import open_cube
    from cryocube.engine.plan import plan_runs
    from cryocube.families import PlanContext, RunSpec
    from cryocube.families.recipes import load_recipe

    recipe = load_recipe(
        None,
        [f"batch_size={a.batch_size}", f"epochs={a.epochs}", f"val_every={a.val_every}"],
        families=("segmentation",),
    )
    p = plan_runs(
        [RunSpec(row.model, cube, row.protocol, row.fraction)],
        recipe,
        PlanContext(out=str(raw.parent / "unused"), allow_random_weights=True),
    )[0]
    subset = [int(i) for i in p.record.fields["subset"]]
    names = [str(n) for n in open_cube(cube)["source"].values[subset]]
    dst = raw.parent / f"{raw.name}-{row.name}"
    if not dst.exists():
        src = raw / "glid"
        for split in ("train", "val", "test"):
            for kind in ("images", "masks"):
                (dst / "glid" / split / kind).mkdir(parents=True, exist_ok=True)
                for f in sorted((src / split / kind).iterdir()):
                    if split != "train" or f.name in names:
                        (dst / "glid" / split / kind / f.name).symlink_to(f.resolve())
    got = sorted(f.name for f in (dst / "glid" / "train" / "images").iterdir())
    if got != sorted(names):
        raise RuntimeError(f"{dst}: train tiles {got} are not cryocube's draw {sorted(names)}")
    return dst, subset


def run_reference(row: Row, raw: Path, out: Path, a, cores: int) -> dict:
    peer, py, mirror, cache = peer_paths()
    env = {**os.environ, "PEER_REF_MIRROR": str(mirror), "PEER_REF_CACHE": cache}
    env.pop("PYTHONPATH", None)
    cmd = [
        str(py),
        str(peer),
        "train",
        "glid",
        str(raw),
        "--encoder",
        row.ref_encoder,
        "--epochs",
        str(a.epochs),
        "--eval-interval",
        str(a.val_every),
        "--batch-size",
        str(a.batch_size),
        "--threads",
        str(cores),
        "--out",
        str(out),
        "--finetune" if row.protocol == "finetune" else "--frozen",
    ]
    for o in row.ref_overrides:
        cmd += ["--override", o]
    r = timed(cmd, env, out.parent / f"{out.name}.log")
    res = json.loads((out / "peer_result.json").read_text())
    return {**r, "mIoU": float(res["test_mIoU"]), "result": res}


def run_cryocube(
    row: Row, cube: str, out: Path, a, precision: str, env: dict, extra: tuple = ()
) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "cryocube.cli",
        "evaluate",
        "--cubes",
        cube,
        "--models",
        row.model,
        "--protocol",
        row.protocol,
        "--epochs",
        str(a.epochs),
        "--set",
        f"val_every={a.val_every}",
        "--set",
        f"batch_size={a.batch_size}",
        "--set",
        f"precision={precision}",
        "--allow-random-weights",
        "--out",
        str(out),
        "--quiet",
        "--cluster",
        "local",
        # the machine's memory, as the reference's one process has it: Dask's automatic limit gives
        # a single worker started with one thread half of it, and a ViT-L fine-tune's worker was
        # restarted at 95 % of that (issue 40)
        "--memory-limit",
        str(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")),
    ]
    if row.fraction:
        cmd += ["--fraction", str(row.fraction)]
    r = timed([*cmd, *extra], env, out.parent / f"{out.name}.log")
    recs = [
        json.loads(line)
        for line in (out / "results.jsonl").read_text().splitlines()
        if line.strip()
    ]
    rec = [x for x in recs if x.get("status") == "ok"][-1]
    return {**r, "mIoU": float(rec["metrics"]["mIoU"]), "record": rec}


# -- FLOPs and peaks
# ---------------------------------------------------------------------------------------


def flops(row: Row, cube: str, a) -> dict:
    """FLOPs of one encoder forward (one 224 window), one decoder training step (batch, forward +
    backward), one decoder forward (one window), counted by torch's FlopCounterMode on cryocube's
    modules (the same architectures as the reference's)."""
    from torch.utils.flop_counter import FlopCounterMode

    import cryocube.decoders.upernet as upernet
    from cryocube.engine.plan import plan_runs
    from cryocube.families import PlanContext, RunSpec
    from cryocube.families.recipes import load_recipe
    from cryocube.families.segmentation.train import build_model
    from cryocube.models import build_encoder

    recipe = load_recipe(
        None, [f"batch_size={a.batch_size}", "precision=fp32"], families=("segmentation",)
    )
    p = plan_runs(
        [RunSpec(row.model, cube, "frozen")],
        recipe,
        PlanContext(out="unused", allow_random_weights=True),
    )[0]
    w = p.work
    e = w.encoder
    enc = build_encoder(
        e.model, bands=list(e.bands), weights=None, input_size=e.input_size, rule=e.rule
    )
    dec, _ = build_model(w, "cpu")
    S, bs = e.input_size, a.batch_size
    x = torch.randn(1, len(w.inputs.index), S, S)
    with torch.no_grad(), FlopCounterMode(display=False) as fe:
        feats = enc(x)
    y = torch.randint(0, w.num_classes, (bs, S, S))
    composed, apart = upernet.up_lateral, lambda op, lateral, x: lateral(op(x))

    def decoder_flops(layout) -> tuple[int, int]:
        """(training step, inference window): channels_last takes UPerNet's cat-form fusion, and
        with the lateral convs apart from the neck it is the reference's; NCHW on CPU is what
        cryocube runs (decoders/upernet.py: fused_conv, up_lateral)."""
        d = dec.to(memory_format=layout).train()
        upernet.up_lateral = composed if layout == torch.contiguous_format else apart
        fb = [f.repeat(bs, 1, 1, 1).contiguous(memory_format=layout) for f in feats]
        with FlopCounterMode(display=False) as fs:
            torch.nn.functional.cross_entropy(d(fb, (S, S)), y).backward()
        d.eval()  # inference (BatchNorm on running statistics), one window
        with torch.no_grad(), FlopCounterMode(display=False) as fd:
            d([f.contiguous(memory_format=layout) for f in feats], (S, S))
        return fs.get_total_flops(), fd.get_total_flops()

    try:
        (step, item), (ref_step, ref_item) = map(
            decoder_flops, (torch.contiguous_format, torch.channels_last)
        )
    finally:
        upernet.up_lateral = composed
    from cryocube.families.encoders import window_offsets

    return {
        "encoder_item": fe.get_total_flops(),
        "decoder_step": step,
        "decoder_item": item,
        "ref_decoder_step": ref_step,
        "ref_decoder_item": ref_item,
        "windows": len(window_offsets(w.tile, S)),
        "tile": w.tile,
        "S": S,
    }


def machine_peaks(cores: int) -> dict:
    from bench_models import peaks

    torch.set_num_threads(cores)
    return peaks("cpu")


# -- the budget
# --------------------------------------------------------------------------------------------


def ref_budget(ref: dict, fl: dict, row: Row, a) -> list[tuple]:
    """(phase, seconds, FLOPs or None, precision) of the reference run, from its peer_result.json
    timings."""
    t = ref["result"]["timing"]
    enc_calls = ref["result"]["encoder_forward"]
    epochs = t["train_epochs"]
    vals = t["validations"]
    train_samples = enc_calls["train"]["samples"]
    steps = sum(e["iterations"] for e in epochs)
    train_fl = train_samples * fl["encoder_item"] * (
        3 if row.protocol == "finetune" else 1
    ) + steps * fl.get("ref_decoder_step", fl["decoder_step"])
    item_fl = fl["encoder_item"] + fl.get("ref_decoder_item", fl["decoder_item"])
    val_fl = enc_calls["val"]["samples"] * item_fl
    test_fl = enc_calls["test"]["samples"] * item_fl
    saves = t.get("seconds_checkpoint_saves_total", 0.0)
    val_s = sum(v["seconds"] for v in vals)
    rest = (
        ref["wall_s"]
        - t["setup_seconds"]
        - sum(e["seconds"] for e in epochs)
        - val_s
        - saves
        - t["test_seconds"]
    )
    return [
        (
            "start-up (process, imports, model, datasets)",
            t["setup_seconds"] + max(rest, 0.0),
            None,
            "",
        ),
        ("cube/raw reads", None, None, "inside the epochs (DataLoader, num_workers 0)"),
        ("feature extraction", None, None, "none: the encoder runs in every step and validation"),
        (
            (
                f"training: {len(epochs)} epochs x {steps // max(1, len(epochs))} steps (encoder"
                " fwd + decoder fwd/bwd/opt)"
            ),
            sum(e["seconds"] for e in epochs),
            train_fl,
            "fp32",
        ),
        (f"validation: {len(vals)} x encoder + decoder on the windows", val_s, val_fl, "fp32"),
        ("test: encoder + decoder on the windows", t["test_seconds"], test_fl, "fp32"),
        ("writing (checkpoints)", saves, None, ""),
    ]


def cc_budget(cc: dict, fl: dict, row: Row) -> list[tuple]:
    """(phase, seconds, FLOPs or None, precision) of a cryocube run, from its record's timings;
    start-up is the wall time that no task accounts for (process start, imports, planning, cluster,
    records)."""
    rec = cc["record"]
    tm = rec["timings"]
    fp, fe = tm.get("fit_phases", {}), tm.get("feature_phases", {})
    prec = rec["precision"]["effective"]
    steps = rec["steps"] - rec.get("unlabelled_steps", 0)
    n_val = len(rec.get("val_curve", []))
    ft = row.protocol == "finetune"
    bs = rec["config"]["batch_size"]
    step_fl = fl["decoder_step"] + (3 * bs * fl["encoder_item"] if ft else 0)
    per_split = 2 * fl["windows"]  # the benchmark's val and test splits: 2 tiles each
    item_fl = fl["decoder_item"] + (fl["encoder_item"] if ft else 0)
    rest = (
        cc["wall_s"]
        - tm.get("features_wall_s", 0.0)
        - tm.get("train_s", 0.0)
        - tm.get("test_s", 0.0)
    )
    return [
        ("start-up (process, imports, planning, cluster) + records", max(rest, 0.0), None, ""),
        (
            "fit task set-up (decoder build, feature cache into worker memory)",
            tm.get("setup_s"),
            None,
            "",
        ),
        (
            (
                "cube reads for the feature cache (on a 2nd thread; waited for)"
                if not ft
                else "cube reads + crops"
            ),
            fe.get("read_wait_s") if not ft else fp.get("batches_s"),
            None,
            f"{fe.get('read_s', 0.0):.2f} s in all" if not ft else "",
        ),
        (
            "feature extraction (encoder, inference mode, once)",
            fe.get("encode_s") if not ft else None,
            rec.get("encoder_forward_items", 0) * fl["encoder_item"] if not ft else None,
            prec,
        ),
        ("feature cache writes", fe.get("write_s") if not ft else None, None, ""),
        (
            f"training: {steps} steps, forward" + (" (encoder + decoder)" if ft else " (decoder)"),
            fp.get("forward_s"),
            steps * step_fl / 3,
            prec,
        ),
        ("training: backward", fp.get("backward_s"), steps * step_fl * 2 / 3, prec),
        ("training: optimiser (AdamW, fp32 master weights)", fp.get("optimizer_s"), None, ""),
        (
            "training: batches from the in-memory cache",
            fp.get("batches_s") if not ft else None,
            None,
            "",
        ),
        (
            (
                f"validation: {n_val} x {'encoder + ' if ft else ''}decoder on"
                f" {'windows' if ft else 'cached windows'}"
            ),
            fp.get("validate_s"),
            n_val * per_split * item_fl,
            prec,
        ),
        ("test (scoring task, predictions written)", tm.get("test_s"), per_split * item_fl, prec),
        ("writing (best checkpoint)", fp.get("checkpoint_write_s"), None, ""),
    ]


def unit_kind(row: Row) -> str | None:
    """The budget unit a row measures ("<model>/<protocol>": two rows of one size class, DOFA's
    and SpectralGPT's fine-tunes, both kept; the estimate costs the class's other models from the
    nearest in GFLOPs), None for rows that measure none (fewshot: a frozen run whose cache covers
    draws it does not train on)."""
    if row.protocol not in ("frozen", "finetune"):
        return None
    return f"{row.model}/{row.protocol}"


def unit_budget(row: Row, ref: dict, cc: dict, fl: dict, a) -> dict:
    """One unit of `evaluate --dry-run --budget` (cryocube/engine/estimate.py) from a row's two
    runs: what a planned step, window and encoder item cost on each side, the fixed costs, and the
    encoder's share of a step and a window (FLOPs counted on the modules), by which the estimate
    scales a unit to another encoder."""
    from cryocube.models import model_spec

    ft = row.protocol == "finetune"
    rec, tm = cc["record"], cc["record"]["timings"]
    fp = tm["fit_phases"]
    bs = a.batch_size
    steps = max(1, rec["steps"])
    val_windows = max(1, fp["validations"] * 2 * fl["windows"])
    window_s = fp["validate_s"] / val_windows
    enc, dstep, ditem = fl["encoder_item"], fl["decoder_step"], fl["decoder_item"]
    train_enc = (3 if ft else 1) * bs * enc
    # the extraction's own seconds scale with its items; the rest of its wall (the encoder's build,
    # a first call's set-up) is paid once, like start-up: per item it made a 52-item extraction
    # look 2-3x slower than the encoder computes, and large encoders' fine-tuning estimates with it
    rest = cc["wall_s"] - tm.get("features_s", 0.0) - tm["train_s"] - tm["test_s"]
    t = ref["result"]["timing"]
    rv = ref["result"]["encoder_forward"]["val"]["samples"]
    ref_steps = max(1, sum(e["iterations"] for e in t["train_epochs"]))
    ref_rest = (
        ref["wall_s"]
        - sum(e["seconds"] for e in t["train_epochs"])
        - sum(v["seconds"] for v in t["validations"])
        - t["test_seconds"]
        - t.get("seconds_checkpoint_saves_total", 0.0)
    )
    return {
        "model": row.model,
        "encoder_gflops": model_spec(row.model).gflops,
        "batch_size": bs,
        "date": str(datetime.date.today()),
        "measured_with": {
            "row": row.name,
            "epochs": a.epochs,
            "val_every": a.val_every,
            "precision": rec["precision"]["effective"],
            "torch_threads": rec["torch_threads"],
            "load_1min_after": [round(ref["load_after"], 2), round(cc["load_after"], 2)],
            "wall_s": [round(ref["wall_s"], 1), round(cc["wall_s"], 1)],
        },
        "cryocube": {
            "startup_s": max(rest, 0.0),
            "fit_setup_s": tm["setup_s"],
            "encoder_s_per_item": (
                0.0 if ft else tm["features_s"] / max(1, rec["encoder_forward_items"])
            ),
            "step_s": (
                (fp["forward_s"] + fp["backward_s"] + fp["optimizer_s"] + fp["batches_s"]) / steps
            ),
            "window_s": window_s,
            "test_fixed_s": max(tm["test_s"] - 2 * fl["windows"] * window_s, 0.0),
            "step_encoder_share": train_enc / (train_enc + dstep) if ft else 0.0,
            "window_encoder_share": enc / (enc + ditem) if ft else 0.0,
        },
        "reference": {
            "setup_s": max(ref_rest, 0.0),
            "step_s": sum(e["seconds"] for e in t["train_epochs"]) / ref_steps,
            "window_s": sum(v["seconds"] for v in t["validations"]) / max(1, rv),
            "step_encoder_share": train_enc / (train_enc + fl.get("ref_decoder_step", dstep)),
            "window_encoder_share": enc / (enc + fl.get("ref_decoder_item", ditem)),
        },
    }


def write_budget(path: str, units: dict, cores: int) -> None:
    """Write (or merge into an existing version-2 file: units of other invocations are kept,
    those measured now replace theirs) the budget of `evaluate --dry-run --budget`."""
    from cryocube.engine.estimate import BUDGET_VERSION

    old = {}
    if Path(path).is_file():
        try:
            prev = json.loads(Path(path).read_text())
            old = prev.get("units", {}) if prev.get("version") == BUDGET_VERSION else {}
        except ValueError:
            old = {}
    Path(path).write_text(
        json.dumps(
            {
                "version": BUDGET_VERSION,
                "date": str(datetime.date.today()),
                "machine": {
                    "cpu": cpu_name(),
                    "matrix_units": cpu_flags(),
                    "cores": cores,
                    "torch": torch.__version__,
                },
                "units": {**old, **units},
            },
            indent=1,
        )
    )
    print(
        f"\nunit costs ({', '.join(sorted(units))}; in all {', '.join(sorted({**old, **units}))})"
        f" written to {path}: cryocube evaluate --dry-run --budget {path} ..."
    )


def budget_from_kept(folders: list[str]) -> dict:
    """Units from the rows kept by earlier invocations (`--keep DIR` writes row-<name>.json)."""
    units = {}
    for d in folders:
        for f in sorted(Path(d).glob("row-*.json")):
            k = json.loads(f.read_text())
            row = ROWS[k["row"]]
            kind = unit_kind(row)
            if kind is None:
                continue
            a = argparse.Namespace(batch_size=k["batch_size"], **k["args"])
            units[kind] = unit_budget(row, k["ref"], k["cc"], k["flops"], a)
    return units


def print_budget(title: str, rows: list[tuple], wall: float, pk: dict) -> None:
    print(f"\n  {title} (wall {wall:.1f} s)")
    print(
        f"    {'phase':<76} {'s':>7} {'% wall':>7} {'GFLOP':>8} {'TFLOP/s':>8} {'% peak':>7}  note"
    )
    for name, s, fl, note in rows:
        if s is None and fl is None:
            if not note:
                continue
            print(f"    {name:<76} {'-':>7} {'':>7} {'':>8} {'':>8} {'':>7}  {note}")
            continue
        pct = f"{100 * s / wall:6.1f}%" if s is not None else ""
        rate = fl / s if (fl and s) else None
        peak = pk.get(note) if note in ("fp32", "bf16") else None
        sec = f"{s:7.2f}" if s is not None else f"{'-':>7}"
        gfl = f"{fl / 1e9:8.1f}" if fl else ""
        tfs = f"{rate / 1e12:8.3f}" if rate else ""
        share = f"{100 * rate / peak:6.1f}%" if rate and peak else ""
        print(f"    {name:<76} {sec} {pct:>7} {gfl:>8} {tfs:>8} {share:>7}  {note}")


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> str:
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return "?"
    return (
        "AMX"
        if "amx_bf16" in flags
        else ("AVX512-BF16" if "avx512_bf16" in flags else "AVX2/other")
    )


def main(argv=None) -> None:
    from dask.system import CPU_COUNT

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="frozen", help=f"comma-separated: {', '.join(ROWS)}")
    ap.add_argument(
        "--epochs", type=int, default=None, help="every row (default: the row's own, else 20)"
    )
    ap.add_argument(
        "--val-every", type=int, default=None, help="every row (default: the row's own, else 5)"
    )
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument(
        "--no-fp32", action="store_true", help="skip cryocube's fp32 run (the accuracy check)"
    )
    ap.add_argument(
        "--workers-too",
        type=int,
        default=2,
        help=(
            "also run cryocube with this many workers (1 torch thread each when it equals the"
            " cores; 0: not)"
        ),
    )
    ap.add_argument(
        "--fp32-rows",
        default=None,
        metavar="ROWS",
        help="run cryocube's fp32 check for these rows only (default: every row; --no-fp32: none)",
    )
    ap.add_argument("--keep", default=None, help="keep the data and outputs in this folder")
    ap.add_argument(
        "--budget-out",
        default=None,
        metavar="FILE",
        help=(
            "write (merge into) this machine's unit costs, one per frozen/finetune row, for"
            " `cryocube evaluate --dry-run --budget FILE`"
        ),
    )
    ap.add_argument(
        "--budget-from",
        default=None,
        metavar="DIRS",
        help=(
            "with --budget-out and no runs: the units of rows kept by earlier invocations (--keep"
            " DIR), comma-separated folders"
        ),
    )
    args = a = ap.parse_args(argv)
    if a.budget_from:
        if not a.budget_out:
            sys.exit("bench_reference: --budget-from needs --budget-out FILE")
        units = budget_from_kept(a.budget_from.split(","))
        if not units:
            sys.exit(f"bench_reference: --budget-from {a.budget_from}: no kept row-*.json there")
        write_budget(a.budget_out, units, max(1, int(CPU_COUNT)))
        return
    unknown = [r.strip() for r in a.rows.split(",") if r.strip() and r.strip() not in ROWS]
    if unknown:
        sys.exit(f"bench_reference: --rows {', '.join(unknown)}: not a row ({', '.join(ROWS)})")
    rows = [ROWS[r.strip()] for r in a.rows.split(",") if r.strip()]
    peer_paths()  # missing reference: one sentence before any work
    cores = max(1, int(CPU_COUNT))
    root = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="bench-ref-"))
    root.mkdir(parents=True, exist_ok=True)
    cc_env = {
        **os.environ,
        "PYTHONPATH": (
            os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        ),
    }
    print(
        "cryocube vs the real Cryo-Bench code (github Sk-2103/Cryo-Bench via peer.py),"
        f" {datetime.date.today()}, {cpu_name()} ({cpu_flags()}), {cores} cores, torch"
        f" {torch.__version__}; batch {a.batch_size}, synthetic GLID 512 px tiles, random encoder"
        f" weights; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )
    pk = machine_peaks(cores)
    print(
        f"matmul peaks measured now on {cores} cores: fp32 {pk['fp32'] / 1e12:.3f} TFLOP/s, bf16"
        f" {pk['bf16'] / 1e12:.3f} TFLOP/s ({pk['bf16'] / pk['fp32']:.1f}x)",
        flush=True,
    )
    table = []
    try:
        for row in rows:
            a = row_args(row, args)
            print(
                f"[{row.name}] {row.protocol}, {row.model}: {a.epochs} epochs, validation every"
                f" {a.val_every}, batch {a.batch_size}",
                flush=True,
            )
            raw, cube, conv_s = make_data(root, row, cc_env)
            fl = flops(row, cube, a)
            subset = None
            if row.fraction:
                raw, subset = subset_raw(row, raw, cube, a)
            ref = run_reference(row, raw, root / f"ref-{row.name}", a, cores)
            print(
                f"[{row.name}] reference: {ref['wall_s']:.1f} s, mIoU {ref['mIoU']:.2f}, load"
                f" {ref['load_before']:.2f} -> {ref['load_after']:.2f}",
                flush=True,
            )
            cc = run_cryocube(row, cube, root / f"cc-{row.name}", a, "auto", cc_env)
            if subset is not None and cc["record"]["subset"] != subset:
                raise RuntimeError(
                    f"[{row.name}] cryocube trained on samples {cc['record']['subset']}, not the"
                    f" planned draw {subset} the reference was given"
                )
            print(
                f"[{row.name}] cryocube ({cc['record']['precision']['effective']}):"
                f" {cc['wall_s']:.1f} s, mIoU {cc['mIoU']:.2f}, load {cc['load_before']:.2f} ->"
                f" {cc['load_after']:.2f}",
                flush=True,
            )
            c32 = None
            fp32_rows = args.fp32_rows.split(",") if args.fp32_rows else [row.name]
            if (
                not a.no_fp32
                and row.name in fp32_rows
                and cc["record"]["precision"]["effective"] != "fp32"
            ):
                c32 = run_cryocube(row, cube, root / f"cc32-{row.name}", a, "fp32", cc_env)
                print(
                    f"[{row.name}] cryocube (fp32): {c32['wall_s']:.1f} s, mIoU {c32['mIoU']:.2f},"
                    f" load {c32['load_before']:.2f} -> {c32['load_after']:.2f}",
                    flush=True,
                )
            cw = None
            if a.workers_too and a.workers_too != cc["record"]["cluster"]["n_workers"]:
                cw = run_cryocube(
                    row,
                    cube,
                    root / f"ccw-{row.name}",
                    a,
                    "auto",
                    cc_env,
                    ("--workers", str(a.workers_too)),
                )
                print(
                    f"[{row.name}] cryocube ({cw['record']['precision']['effective']},"
                    f" {a.workers_too} workers): {cw['wall_s']:.1f} s, mIoU {cw['mIoU']:.2f}",
                    flush=True,
                )
            table.append((row, ref, cc, c32, fl, conv_s, cw, a))
            if args.keep:  # the row's figures, for --budget-out from rows of other invocations
                (root / f"row-{row.name}.json").write_text(
                    json.dumps(
                        {
                            "row": row.name,
                            "args": {"epochs": a.epochs, "val_every": a.val_every},
                            "batch_size": a.batch_size,
                            "cores": cores,
                            "peaks": pk,
                            "flops": fl,
                            **{
                                k: ({x: y for x, y in v.items() if x != "stdout"} if v else None)
                                for k, v in (("ref", ref), ("cc", cc), ("c32", c32), ("cw", cw))
                            },
                        },
                        default=str,
                    )
                )
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)

    print(
        f"\n{'row':<10} {'side':<34} {'wall s':>8} {'mIoU':>7} {'cores':>6}"
        f" {'threads x workers':>18} {'ratio':>7} {'load 1-min after':>17}"
    )
    for row, ref, cc, c32, fl, conv_s, cw, a in table:
        print(
            f"{row.name:<10} {'reference (fp32, 1 process)':<34} {ref['wall_s']:8.1f}"
            f" {ref['mIoU']:7.2f} {ref['cores_used']:6.2f}"
            f" {ref['result']['machine']['torch_threads']:>14} x 1 {'1.00x':>7}"
            f" {ref['load_after']:17.2f}"
        )
        for label, r in (
            (f"cryocube ({cc['record']['precision']['effective']})", cc),
            ("cryocube (fp32)", c32),
            (f"cryocube ({cc['record']['precision']['effective']}, --workers {a.workers_too})", cw),
        ):
            if r is None:
                continue
            rec = r["record"]
            print(
                f"{'':<10} {label:<34} {r['wall_s']:8.1f} {r['mIoU']:7.2f} {r['cores_used']:6.2f}"
                f" {rec['torch_threads']:>14} x {rec['cluster']['n_workers']}"
                f" {ref['wall_s'] / r['wall_s']:6.2f}x {r['load_after']:17.2f}"
            )
        if c32 is not None:
            d = cc["mIoU"] - c32["mIoU"]
            print(
                f"{'':<10} bf16 - fp32 mIoU: {d:+.2f} points"
                f" ({'within' if abs(d) <= 1 else 'NOT within'} 1 point); fp32 is"
                f" {c32['wall_s'] / cc['wall_s']:.2f}x the bf16 wall"
            )
        if conv_s:
            print(
                f"{'':<10} (one-off, not in the ratio: converting the raw tiles to a cube took"
                f" {conv_s:.1f} s)"
            )
    for row, ref, cc, c32, fl, conv_s, cw, a in table:
        print(
            f"\n[{row.name}] time budget; FLOPs counted on the modules, peaks fp32"
            f" {pk['fp32'] / 1e12:.3f} / bf16 {pk['bf16'] / 1e12:.3f} TFLOP/s; encoder"
            f" {fl['encoder_item'] / 1e9:.1f} GFLOP per window, decoder step"
            f" {fl['decoder_step'] / 1e9:.0f} GFLOP (batch {a.batch_size}, fwd+bwd; the"
            f" reference's cat form {fl.get('ref_decoder_step', fl['decoder_step']) / 1e9:.0f})"
        )
        print_budget("reference", ref_budget(ref, fl, row, a), ref["wall_s"], pk)
        print_budget(
            f"cryocube ({cc['record']['precision']['effective']})",
            cc_budget(cc, fl, row),
            cc["wall_s"],
            pk,
        )
        if c32 is not None:
            print_budget("cryocube (fp32)", cc_budget(c32, fl, row), c32["wall_s"], pk)
    if args.budget_out:
        units = {
            unit_kind(row): unit_budget(row, ref, cc, fl, a)
            for row, ref, cc, c32, fl, conv_s, cw, a in table
            if unit_kind(row)
        }
        if units:
            write_budget(args.budget_out, units, cores)


if __name__ == "__main__":
    main()
