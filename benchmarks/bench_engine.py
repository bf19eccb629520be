"""Engine benchmarks (issues 4 and 10), figures printed.

1. Fixed costs a small run pays whatever its size: cluster start, encoder build on a worker, a task
   round trip, planning, a record write.
2. The reference recipe (224 px, UPerNet 512 channels, validation every 5 epochs, sliding-window
   test) on a generated GLID-like cube of 512 px tiles: one cryocube run against a "reference loop"
   written the reference's way (fp32, the encoder on a fresh crop every step and in every
   validation, one process using all cores). Then one (model, dataset)'s set of 3 seeds x {frozen
   100 %, few-shot 10 %}: cryocube runs the set for real; the reference loop's set is its measured
   per-step, per-validation and test costs times the set's step and validation counts (each
   reference run would repeat the same work).
3. The UPerNet training step against the matmul peaks (fp32 and bf16) measured in the same run.
4. Feature extraction with 1 vs 2 worker processes, and peak worker memory for a cube 4x larger.

    python benchmarks/bench_engine.py --short         # minutes: 64 px, small decoder, 10 epochs
    python benchmarks/bench_engine.py --epochs 80     # the reference recipe (hours on a 2-core CPU)
    python benchmarks/bench_engine.py --epochs 10 --skip-scaling
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def make_cube(root: Path, n_train: int, tile: int, name: str = "glid", client=None) -> str:
    from cryocube.convert.writer import convert
    from cryocube.synthetic import make_raw

    make_raw(
        name,
        root / f"raw{n_train}-{tile}",
        n={"train": n_train, "val": max(2, n_train // 4), "test": max(2, n_train // 4)},
        size=tile,
        seed=3,
    )
    url = str(root / f"{name}{n_train}-{tile}.zarr")
    convert(
        name, str(root / f"raw{n_train}-{tile}"), url, client=client, tile_size=tile, progress=False
    )
    return url


def cluster(workers: int):
    from distributed import Client, LocalCluster

    cl = LocalCluster(
        n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
    )
    return cl, Client(cl)


def run_set(cube: str, out: str, runs, cfg, client) -> dict:
    from cryocube.engine.evaluate import evaluate

    t = time.perf_counter()
    res = evaluate(runs, out, cfg, client=client, progress=False, allow_random_weights=True)
    wall = time.perf_counter() - t
    bad = [r.get("error") for r in res.records if r["status"] != "ok"]
    assert not bad, bad
    return {"wall_s": wall, "records": res.records, "items": sum(res.encoder_items.values())}


# -- the reference loop
# ------------------------------------------------------------------------------


def reference_loop(
    cube: str, model: str, cfg, protocol: str = "frozen", fraction=None, seed: int = 0
) -> dict:
    """The reference's way, in one process with every core: every step crops fresh windows and runs
    the frozen encoder on them; every validation runs encoder + decoder on every window. fp32
    throughout.
    """
    from dask.system import CPU_COUNT

    from cryocube.cube import read_samples
    from cryocube.decoders import Segmenter
    from cryocube.engine.plan import plan_runs
    from cryocube.families import PlanContext, RunSpec
    from cryocube.families.encoders import window_offsets
    from cryocube.families.segmentation.data import pad_to
    from cryocube.families.segmentation.metrics import metrics_from_confusion
    from cryocube.families.segmentation.train import build_model, eval_cube_tiles

    torch.set_num_threads(CPU_COUNT)
    p = plan_runs(
        [RunSpec(model, cube, protocol, fraction, seed)],
        cfg.replace(precision="fp32"),
        PlanContext(out="unused", allow_random_weights=True),
    )[0]
    run = p.work
    t0 = time.perf_counter()
    dec, enc = build_model(run, "cpu")
    seg = Segmenter(enc, dec)
    opt = torch.optim.AdamW(dec.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-1)
    rng = np.random.default_rng(run.seed)
    S, bs, train = run.encoder.input_size, cfg.batch_size, np.asarray(run.train_samples)
    side = max(run.tile, S)
    windows = len(window_offsets(run.tile, S))
    step_s, val_s, forwards, steps, vals = [], [], 0, 0, 0
    for epoch in range(cfg.epochs + 1):
        if epoch % cfg.val_every == 0 or epoch == cfg.epochs:
            t = time.perf_counter()
            eval_cube_tiles(seg, run, np.asarray(run.val_samples), "cpu")
            val_s.append(time.perf_counter() - t)
            forwards += len(run.val_samples) * windows
            vals += 1
        if epoch == cfg.epochs:
            break
        dec.train()
        order = rng.permutation(train)
        for b in range(max(1, train.size // bs)):
            t = time.perf_counter()
            idx = np.sort(order[b * bs : (b + 1) * bs])
            idx = np.repeat(idx, 2) if idx.size == 1 else idx
            image, label = read_samples(cube, idx)
            x, lab = pad_to(run.inputs.apply(image), label, S)
            ys, xs = rng.integers(0, side - S + 1, size=(2, idx.size))
            xb = torch.stack(
                [x[j, :, ys[j] : ys[j] + S, xs[j] : xs[j] + S] for j in range(idx.size)]
            )
            lb = torch.from_numpy(
                np.stack([lab[j, ys[j] : ys[j] + S, xs[j] : xs[j] + S] for j in range(idx.size)])
            ).long()
            with torch.no_grad():
                feats = enc(xb)  # the expensive part, recomputed every step
            loss = loss_fn(dec(feats, (S, S)), lb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            forwards += idx.size
            steps += 1
            step_s.append(time.perf_counter() - t)
    t = time.perf_counter()
    cm = eval_cube_tiles(seg, run, np.asarray(run.test_samples), "cpu")
    test_s = time.perf_counter() - t
    forwards += len(run.test_samples) * windows
    return {
        "wall_s": time.perf_counter() - t0,
        "mIoU": metrics_from_confusion(cm)["mIoU"],
        "items": forwards,
        "step_s": float(np.median(step_s)),
        "val_s": float(np.median(val_s)),
        "test_s": test_s,
        "steps": steps,
        "validations": vals,
    }


# -- 1. fixed costs
# -------------------------------------------------------------------------------------


def _noop():
    return 1


def fixed_costs(root: Path, cube: str, model: str, cfg) -> dict:
    from cryocube.engine.plan import plan_runs
    from cryocube.families import PlanContext, RunSpec
    from cryocube.families.encoders import encoder_facts
    from cryocube.record import write_record

    t = time.perf_counter()
    cl, c = cluster(2)
    out = {"cluster_start_s": time.perf_counter() - t}
    try:
        c.submit(_noop, pure=False).result()
        t = time.perf_counter()
        for _ in range(20):
            c.submit(_noop, pure=False).result()
        out["task_round_trip_ms"] = (time.perf_counter() - t) / 20 * 1e3
        t = time.perf_counter()
        p = plan_runs(
            [RunSpec(model, cube)],
            cfg,
            PlanContext(out=str(root / "fixed"), allow_random_weights=True),
        )[0]
        out["plan_s"] = time.perf_counter() - t
        t = time.perf_counter()
        c.submit(encoder_facts, p.work.encoder, pure=False).result()
        out["encoder_build_s"] = time.perf_counter() - t
        t = time.perf_counter()
        for i in range(10):
            write_record(
                str(root / "fixed"), {"run_id": f"r{i}", "status": "ok", "metrics": {"mIoU": 1.0}}
            )
        out["record_write_ms"] = (time.perf_counter() - t) / 10 * 1e3
        small = cfg.replace(epochs=1)
        t = time.perf_counter()
        run_set(cube, str(root / "fixed-run"), [RunSpec(model, cube)], small, c)
        out["one_epoch_run_s"] = time.perf_counter() - t
    finally:
        c.close()
        cl.close()
    return out


# -- 3. the decoder step against the peaks
# -------------------------------------------------------------------


def upernet_step(
    cube: str,
    model: str,
    cfg,
    threads: int,
    device: str = "cpu",
    precisions=None,
    peaks=None,
    iters: int = 2,
) -> dict:
    """One UPerNet training step (AdamW, on frozen features of one batch) and one validation forward
    of the decoder over the same batch, timed in each precision, with their FLOPs and the matmul
    peaks to compare.

    precisions: default fp32, and bf16 where the device computes it fast; peaks: {"fp32", "bf16"}
    FLOP/s measured by the caller (default: measured here, CPU-sized)."""
    from bench_models import matmul_peak, sync  # benchmarks/ is on sys.path when run as a script
    from torch.utils.flop_counter import FlopCounterMode

    from cryocube.engine.plan import plan_runs
    from cryocube.families import PlanContext, RunSpec
    from cryocube.families.segmentation.train import build_model
    from cryocube.precision import autocast, fast_bf16, this_device

    torch.set_num_threads(threads)
    info = this_device(device)
    p = plan_runs(
        [RunSpec(model, cube)],
        cfg,
        PlanContext(out="unused", allow_random_weights=True, device=info),
    )[0]
    dec, enc = build_model(p.work, device)
    S, bs = p.work.encoder.input_size, cfg.batch_size
    x = torch.randn(bs, len(p.work.inputs.index), S, S, device=device)
    y = torch.randint(0, p.work.num_classes, (bs, S, S), device=device)
    with torch.no_grad():
        feats = enc(x)
        sync(device)
        enc_t = time.perf_counter()
        enc(x)
        sync(device)
        enc_s = time.perf_counter() - enc_t
    if p.work.memory_format == "channels_last":  # as the engine feeds it
        feats = [f.contiguous(memory_format=torch.channels_last) for f in feats]
    opt = torch.optim.AdamW(dec.parameters())

    def step(prec):
        with autocast(device, prec):
            out = dec(feats, (S, S))
        loss = torch.nn.functional.cross_entropy(out.float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    def val(prec):
        with torch.no_grad(), autocast(device, prec):
            dec(feats, (S, S))

    def best(fn, prec):
        fn(prec)  # warm-up
        ts = []
        for _ in range(iters):
            sync(device)
            t = time.perf_counter()
            fn(prec)
            sync(device)
            ts.append(time.perf_counter() - t)
        return min(ts)

    with FlopCounterMode(display=False) as fc:
        step("fp32")
    with FlopCounterMode(display=False) as fv:
        val("fp32")
    res = {
        "gflop_per_step": fc.get_total_flops() / 1e9,
        "gflop_per_val": fv.get_total_flops() / 1e9,
        "encoder_fwd_s": enc_s,
        "threads": threads,
        "batch": bs,
        "device": info.describe(),
        "memory_format": p.work.memory_format,
    }
    for prec in precisions or (("fp32", "bf16") if fast_bf16(info) else ("fp32",)):
        res[f"step_{prec}_s"] = best(step, prec)
        res[f"val_{prec}_s"] = best(val, prec)
    if peaks is None:
        peaks = {
            "fp32": matmul_peak(device),
            "bf16": matmul_peak(
                device,
                n=1536 if fast_bf16(info) else 256,
                iters=3 if fast_bf16(info) else 1,
                trials=3 if fast_bf16(info) else 1,
                dtype=torch.bfloat16,
            ),
        }
    res["peak_fp32"], res["peak_bf16"] = peaks["fp32"], peaks["bf16"]
    res["fast_bf16"] = fast_bf16(info)
    return res


# -- 4. scaling and memory
# --------------------------------------------------------------------------------------


def _warm(spec) -> None:
    from cryocube.families.encoders import get_encoder

    get_encoder(spec, "cpu")


def scaling(root: Path, model: str, cfg, n: int, tile: int) -> dict:
    from cryocube.engine.plan import plan_runs
    from cryocube.families import PlanContext, RunSpec

    out = {}
    cl, c = cluster(2)
    try:
        big = make_cube(root, 4 * n, tile, client=c)
        small = make_cube(root, n, tile, client=c)
    finally:
        c.close()
        cl.close()
    for w in (1, 2):
        cl, c = cluster(w)
        try:
            spec = plan_runs(
                [RunSpec(model, big)], cfg, PlanContext(out="x", allow_random_weights=True)
            )[0].work.encoder
            c.run(_warm, spec)
            r = run_set(big, str(root / f"w{w}"), [RunSpec(model, big)], cfg.replace(epochs=1), c)
            out[f"features_{w}w_s"] = r["records"][0]["timings"]["features_wall_s"]
            out["items"] = r["items"]
        finally:
            c.close()
            cl.close()
    for name, cube in (("small", small), ("big", big)):
        cl, c = cluster(1)
        try:
            r = run_set(
                cube, str(root / f"m-{name}"), [RunSpec(model, cube)], cfg.replace(epochs=2), c
            )
            out[f"peak_{name}_mb"] = r["records"][0]["peak_memory_mb"]
        finally:
            c.close()
            cl.close()
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--short", action="store_true", help="64 px tiles, UPerNet 64 channels, 10 epochs: minutes"
    )
    ap.add_argument("--model", default="ssl4eo_moco")
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--tiles", type=int, default=None, help="training tiles of the benchmark cube")
    ap.add_argument("--skip-scaling", action="store_true")
    a = ap.parse_args(argv)
    from dask.system import CPU_COUNT

    from cryocube.families import RunSpec
    from cryocube.families.recipes import load_recipe

    if a.short:
        tile, size, channels, epochs, tiles = 64, 64, 64, a.epochs or 10, a.tiles or 16
    else:
        tile, size, channels, epochs, tiles = 512, 224, 512, a.epochs or 80, a.tiles or 4
    cfg = load_recipe(
        None,
        [
            f"epochs={epochs}",
            f"decoder_channels={channels}",
            f"input_size={size}",
            "val_every=5",
            "crops_per_sample=4",
            "batch_size=8",
            "normalization=cube",
        ],
    )
    tmp = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    out: dict = {}
    try:
        cl, c = cluster(2)
        try:
            cube = make_cube(tmp, tiles, tile, client=c)
        finally:
            c.close()
            cl.close()
        print(
            f"bench_engine: {a.model}, {tiles} train tiles of {tile} px, input {size}, UPerNet"
            f" {channels} channels, {epochs} epochs, validation every 5, batch 8, {CPU_COUNT}"
            " cores",
            flush=True,
        )

        out["fixed"] = f = fixed_costs(tmp, cube, a.model, cfg)
        print(
            f"1. fixed costs: cluster start {f['cluster_start_s']:.1f} s, task round trip"
            f" {f['task_round_trip_ms']:.1f} ms, planning {f['plan_s']:.2f} s, encoder build on a"
            f" worker {f['encoder_build_s']:.1f} s, record write {f['record_write_ms']:.1f} ms; a"
            f" whole 1-epoch run {f['one_epoch_run_s']:.1f} s",
            flush=True,
        )

        ref = reference_loop(cube, a.model, cfg)
        cl, c = cluster(2)
        try:
            one = run_set(cube, str(tmp / "one"), [RunSpec(a.model, cube)], cfg, c)
            set_runs = [
                RunSpec(a.model, cube, p, None, s) for p in ("frozen", "fewshot") for s in range(3)
            ]
            full = run_set(cube, str(tmp / "set"), set_runs, cfg, c)
        finally:
            c.close()
            cl.close()
        r1 = one["records"][0]
        ref_set = sum(
            r["steps"] * ref["step_s"] + len(r["val_curve"]) * ref["val_s"] + ref["test_s"]
            for r in full["records"]
        )
        spread = float(
            np.ptp([r["metrics"]["mIoU"] for r in full["records"] if r["protocol"] == "frozen"])
        )
        out["reference"] = {
            "one_run": {
                "cryocube_s": one["wall_s"],
                "reference_s": ref["wall_s"],
                "speedup": ref["wall_s"] / one["wall_s"],
                "mIoU_cryocube": r1["metrics"]["mIoU"],
                "mIoU_reference": ref["mIoU"],
                "threads": r1["threads"],
                "precision": r1["precision"]["effective"],
            },
            "set": {
                "cryocube_s": full["wall_s"],
                "reference_projected_s": ref_set,
                "speedup": ref_set / full["wall_s"],
                "seed_spread": spread,
                "encoder_items_cryocube": full["items"],
            },
            "reference_costs": {
                k: ref[k] for k in ("step_s", "val_s", "test_s", "steps", "validations")
            },
        }
        print(
            f"2. reference recipe, one run: cryocube {one['wall_s']:.0f} s (precision"
            f" {r1['precision']['effective']}, threads {r1['threads']['fit']}), reference loop"
            f" {ref['wall_s']:.0f} s => {ref['wall_s'] / one['wall_s']:.2f}x (target >= 4x); mIoU"
            f" {r1['metrics']['mIoU']:.2f} vs {ref['mIoU']:.2f}",
            flush=True,
        )
        print(
            f"   reference loop per step {ref['step_s']:.2f} s, per validation {ref['val_s']:.2f}"
            f" s, test {ref['test_s']:.2f} s",
            flush=True,
        )
        print(
            f"   set of 3 seeds x {{frozen, fewshot 10 %}}: cryocube {full['wall_s']:.0f} s for"
            f" real, reference loop {ref_set:.0f} s projected from its measured costs =>"
            f" {ref_set / full['wall_s']:.2f}x (target >= 10x); frozen seed spread {spread:.2f}"
            " mIoU",
            flush=True,
        )

        out["step"] = s = upernet_step(cube, a.model, cfg, CPU_COUNT)
        gf = s["gflop_per_step"]
        line = (
            f"3. UPerNet step (batch 8, {CPU_COUNT} threads): {gf:.0f} GFLOP; fp32"
            f" {s['step_fp32_s']:.2f} s = {gf / s['step_fp32_s']:.0f} GFLOP/s,"
            f" {100 * gf * 1e9 / s['step_fp32_s'] / s['peak_fp32']:.0f}% of the fp32 matmul peak"
            f" ({s['peak_fp32'] / 1e9:.0f} GFLOP/s)"
        )
        if "step_bf16_s" in s:
            line += (
                f"; bf16 {s['step_bf16_s']:.2f} s ="
                f" {100 * gf * 1e9 / s['step_bf16_s'] / s['peak_bf16']:.0f}% of the bf16 peak"
                f" ({s['peak_bf16'] / 1e9:.0f} GFLOP/s)"
            )
        else:
            line += (
                f"; this CPU has no bf16 matrix units (bf16 matmul peak {s['peak_bf16'] / 1e9:.1f}"
                " GFLOP/s, emulated), so `auto` runs fp32"
            )
        line += f"; the encoder forward it removes costs {s['encoder_fwd_s']:.2f} s"
        print(line, flush=True)

        if not a.skip_scaling:
            cfg_s = load_recipe(
                None,
                [
                    "epochs=1",
                    "decoder_channels=64",
                    "input_size=64",
                    "val_every=5",
                    "crops_per_sample=4",
                    "batch_size=8",
                    "threads=1",
                    "normalization=cube",
                ],
            )
            out["scaling"] = sc = scaling(tmp, a.model, cfg_s, 16 if a.short else 48, 64)
            print(
                f"4. feature extraction, {sc['items']} encoder items, encoders built beforehand: 1"
                f" worker {sc['features_1w_s']:.1f} s, 2 workers {sc['features_2w_s']:.1f} s =>"
                f" {sc['features_1w_s'] / sc['features_2w_s']:.2f}x (threads follow the work: a"
                " lone 1-worker task already uses every core, so ~1x is expected); peak worker"
                f" memory {sc['peak_small_mb']:.0f} MB vs {sc['peak_big_mb']:.0f} MB for a 4x cube"
                f" => {sc['peak_big_mb'] / sc['peak_small_mb']:.2f}x (target <= 1.2x)",
                flush=True,
            )
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
