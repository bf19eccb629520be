"""Encoder forward cost on this machine: FLOPs per sample, throughput, and achieved FLOP/s.

For each encoder at its reference input size (random weights, eval mode, no_grad), in the precision
the engine would use here (`auto`: bf16 where the device has fast bf16 units, else fp32; --precision
overrides):
  * FLOPs per sample from torch.utils.flop_counter.FlopCounterMode (2 FLOPs per multiply-add),
    next to the published GFLOPs measured on the reference code (pangaea-models.md 1.5);
  * throughput (samples/s) over timed forwards after a warm-up;
  * achieved FLOP/s as a fraction of the torch.matmul peak *of the precision it ran in*, measured in
    the same run next to the fp32 and bf16 peaks (on CPUs without bf16 units bf16 is emulated and
    slow; the bf16 probe then uses a smaller matrix so it ends in seconds).

    python benchmarks/bench_models.py --short          # a few small models, < 2 min on 2 cores
    python benchmarks/bench_models.py                  # all 20 configs (several minutes on a CPU)
    python benchmarks/bench_models.py --models dofa,ramen --batch 16 --device cuda --precision bf16
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cryocube.catalog import Band  # noqa: E402
from cryocube.models import build_encoder, list_models, model_spec  # noqa: E402
from cryocube.models.base import count_params  # noqa: E402
from cryocube.models.profile import count_flops  # noqa: E402
from cryocube.precision import autocast, fast_bf16, resolve, this_device  # noqa: E402

SHORT = ["ssl4eo_moco", "remoteclip", "satlasnet_si", "unet"]


def optical(n: int) -> list[Band]:
    names = ["B4", "B3", "B2", "B8", "B11", "B12", "B8A", "B5", "B6", "B7"]
    return [Band(name=a, alias=a, role="optical") for a in names[:n]]


def _published_setup(model_id: str) -> dict:
    """build_encoder options of the setup behind the published figures (catalog
    `published.setup`)."""
    pub = model_spec(model_id).published_setup
    out = dict(pub.get("arch") or {})
    if "bands" in pub:
        out["bands"] = [Band(name=b, alias=b, role="optical") for b in pub["bands"]]
    if "input_size" in pub:
        out["input_size"] = pub["input_size"]
    return out


# The configurations behind the published figures (bands, tile size, RAMEN's resolutions), from the
# catalog.
PUBLISHED_SETUP = {m: _published_setup(m) for m in list_models() if model_spec(m).published_setup}
# --short: a quarter of the 512-px work
SHORT_SETUP = {"unet": dict(bands=optical(10), input_size=256)}


def matmul_peak(
    device: str, n: int = 1536, iters: int = 3, trials: int = 3, dtype: torch.dtype = torch.float32
) -> float:
    """FLOP/s of a square torch.matmul in `dtype` (best of `trials`), the practical ceiling for
    these models."""
    a, b = (
        torch.randn(n, n, device=device, dtype=dtype),
        torch.randn(n, n, device=device, dtype=dtype),
    )
    torch.matmul(a, b)
    best = 0.0
    for _ in range(trials):
        sync(device)
        t = time.perf_counter()
        for _ in range(iters):
            torch.matmul(a, b)
        sync(device)
        best = max(best, 2 * n**3 * iters / (time.perf_counter() - t))
    return best


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peaks(device: str) -> dict[str, float]:
    """fp32 and bf16 matmul peaks, measured now (bf16 with a small matrix where the device lacks
    fast bf16)."""
    fast = fast_bf16(this_device(device))
    big = 4096 if device.startswith("cuda") else 1536
    return {
        "fp32": matmul_peak(device, big),
        "bf16": matmul_peak(
            device,
            big if fast else 256,
            iters=3 if fast else 1,
            trials=3 if fast else 1,
            dtype=torch.bfloat16,
        ),
    }


TENSOR_CORE = re.compile(
    r"gemm|nvjet|cutlass|xmma|wgmma|sm90|sm80|conv|cudnn|fmha|flash|attention|dot_product", re.I
)


def kernel_split(fn, device: str, step_s: float) -> dict:
    """Where one call's GPU time goes (torch's profiler, CUDA kernels): tensor-core kernels (GEMM,
    convolution, attention) against the rest (norms, activations, copies), and the share of the step
    the GPU was busy at all. A low busy share means the step waits on the host (kernel launches); a
    low tensor-core share, on memory-bound ops.
    """
    from torch.profiler import ProfilerActivity, profile

    sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        sync(device)
    mm = other = 0.0
    top: dict[str, float] = {}
    for ev in prof.key_averages():
        us = getattr(ev, "self_device_time_total", None)
        us = getattr(ev, "self_cuda_time_total", 0.0) if us is None else us
        if not us:
            continue
        if TENSOR_CORE.search(ev.key):
            mm += us
        else:
            other += us
            top[ev.key] = top.get(ev.key, 0.0) + us
    total = (mm + other) / 1e6
    return {
        "kernel_s": total,
        "tensor_core_share": mm / 1e6 / total if total else None,
        "gpu_busy_share": total / step_s if step_s else None,
        "kernels": len(prof.key_averages()),
        "top_other": sorted(
            ((k[:60], round(v / 1e3, 3)) for k, v in top.items()), key=lambda kv: -kv[1]
        )[:4],
    }


def measure(
    model_id: str,
    setup: dict,
    batch,
    iters: int,
    device: str,
    precision: str = "fp32",
    kernels: bool = False,
) -> dict:
    """batch: a number, or a function of the built encoder (the engine's memory-sized batch);
    kernels: also where the GPU time of one forward goes (`kernel_split`, CUDA only)."""
    torch.manual_seed(0)
    t0 = time.perf_counter()
    enc = build_encoder(model_id, **setup).eval().to(device)
    build_s = time.perf_counter() - t0
    x1 = torch.randn(1, enc.in_chans, enc.input_size, enc.input_size, device=device)
    # the profile's counter: math SDPA backend, 2 FLOPs per multiply-add
    flops, _ = count_flops(enc, x1)
    batch = batch(enc) if callable(batch) else batch
    xb = x1.expand(batch, -1, -1, -1).contiguous()
    dtype = (
        torch.bfloat16
        if precision == "bf16"
        else torch.float16
        if precision == "fp16"
        else torch.float32
    )
    with torch.no_grad(), autocast(device, precision):
        enc(xb)  # warm-up
        peak = matmul_peak(
            device,
            dtype=dtype,
            n=1536 if precision == "fp32" or fast_bf16(this_device(device)) else 256,
            # next to the timing: the same machine load
            iters=3 if precision == "fp32" else 1,
        )
        times = []
        for _ in range(iters):
            sync(device)
            t = time.perf_counter()
            enc(xb)
            sync(device)
            times.append(time.perf_counter() - t)
        split = None
        if kernels and device.startswith("cuda"):
            try:
                split = kernel_split(lambda: enc(xb), device, statistics.median(times))
            # the profile explains a figure; it never costs the figure itself
            except Exception as e:
                split = {"error": f"{type(e).__name__}: {e}"}
    sps = batch / statistics.median(times)
    spec = model_spec(model_id)
    return dict(
        model=model_id,
        size=enc.input_size,
        chans=enc.in_chans,
        params_m=count_params(enc) / 1e6,
        gflops=flops / 1e9,
        pub_gflops=spec.gflops,
        sps=sps,
        flops_s=flops * sps,
        build_s=build_s,
        peak=peak,
        precision=precision,
        batch=batch,
        **({"kernels": split} if split else {}),
    )


def table(rows: list[dict]) -> str:
    head = (
        f"{'model':20s} {'in':>8s} {'params M':>9s} {'GFLOPs':>8s} {'published':>9s} {'ratio':>6s}"
        f" {'prec':>5s} {'samples/s':>10s} {'GFLOP/s':>8s} {'matmul':>7s} {'% peak':>7s}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        pub = r["pub_gflops"]
        ratio = f"{r['gflops'] / pub:6.2f}" if pub else "     -"
        lines.append(
            f"{r['model']:20s} {r['chans']:>2d}x{r['size']:<5d} {r['params_m']:9.2f}"
            f" {r['gflops']:8.2f} {(f'{pub:9.2f}' if pub else '        -')} {ratio}"
            f" {r['precision']:>5s} {r['sps']:10.3f} {r['flops_s'] / 1e9:8.1f}"
            f" {r['peak'] / 1e9:7.1f} {100 * r['flops_s'] / r['peak']:6.1f}%"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--short",
        action="store_true",
        help=f"only {', '.join(SHORT)} (U-Net at 256 px), 2 timed iterations",
    )
    ap.add_argument("--models", help="comma-separated model ids (default: all)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument(
        "--iters", type=int, default=None, help="timed forwards per model (default 3, --short 2)"
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help=(
            "torch threads (default 1: on a shared machine multi-thread OpenMP barriers stall on"
            " busy cores)"
        ),
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--precision",
        default="auto",
        help="auto (as the engine resolves it here) | fp32 | bf16 | fp16",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    models = args.models.split(",") if args.models else (SHORT if args.short else list_models())
    iters = args.iters or (2 if args.short else 3)
    t_start = time.perf_counter()
    info = this_device(args.device)
    precision = resolve(args.precision, info)
    pk = peaks(args.device)
    print(
        f"device {info.describe()}, {torch.get_num_threads()} threads, torch {torch.__version__};"
        f" matmul peaks at start: fp32 {pk['fp32'] / 1e9:.1f} GFLOP/s, bf16 {pk['bf16'] / 1e9:.1f}"
        f" GFLOP/s; encoders run in {precision} (requested {args.precision}); batch {args.batch},"
        f" median of {iters} timed forwards",
        flush=True,
    )
    rows = []
    for m in models:
        setup = dict(PUBLISHED_SETUP.get(m, {}))
        if args.short:
            setup.update(SHORT_SETUP.get(m, {}))
        r = measure(m, setup, args.batch, iters, args.device, precision)
        rows.append(r)
        print(
            f"  {m}: {r['gflops']:.2f} GFLOPs/sample, {r['sps']:.3f} samples/s (built in"
            f" {r['build_s']:.1f}s)",
            flush=True,
        )
    print()
    print(table(rows))
    print(
        "\nGFLOPs: FlopCounterMode at batch 1, 2 FLOPs per multiply-add, attention counted (math"
        " SDPA backend). 'published': pangaea-models.md 1.5, measured on the reference code. ratio"
        " != 1: CROMA-optical stops after block 11 (the reference runs all 24); the reference"
        " figures of encoders built on timm Blocks (fused SDPA: MoCo, MAE, DOFA, Prithvi,"
        " Scale-MAE, ViT, RAMEN) or nn.MultiheadAttention (RemoteCLIP) miss what runs inside the"
        " fused attention kernels. 'matmul': torch.matmul GFLOP/s in the model's precision,"
        " measured just before its timing (same threads); '% peak' = achieved / that."
    )
    print(f"total {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
