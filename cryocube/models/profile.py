"""Measured compute profile of the encoders on the user's device, cached per device under a key
that holds everything the measurement depends on (docs/models.md)."""

from __future__ import annotations

import gc
import hashlib
import inspect
import json
import os
import re
import statistics
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from ..catalog import Band, find
from ..errors import UserError
from ..precision import autocast, resolve, this_device
from ..progress import progress_bar
from .registry import architectures
from .spec import list_models, model_spec

CONVENTION = (
    "GFLOPs: torch FlopCounterMode, batch 1, fp32, 1 multiply-add = 2 FLOPs; matmuls, convolutions"
    " and attention (math backend) counted, elementwise/norm/softmax/pooling/interpolation not; the"
    " catalog's published figures used the same counter on the reference code (fvcore, as in"
    " Cryo-Bench's profiler, counts 1 per multiply-add, half these)."
)
MEMORY_NOTE = {
    "cuda": (
        "peak memory: torch.cuda.max_memory_allocated from before the build through the forwards, "
        "minus what was allocated before (weights + activations)"
    ),
    "cpu": (
        "peak memory: the process's peak RSS (VmHWM, reset) from before the build through the"
        " forwards, minus its RSS before (weights + activations)"
    ),
}
VERSION = 1  # of the measuring method: a change here measures everything again


def profile_dir() -> Path:
    """Where profiles are cached: $CRYOCUBE_PROFILES, else `profiles/` beside the weights cache."""
    from .weights import cache_dir  # timm and the decoders: not for `list models` (3x start-up)

    env = os.environ.get("CRYOCUBE_PROFILES")
    return Path(env) if env else cache_dir().parent / "profiles"


@dataclass(frozen=True)
class Setup:
    """One thing to measure: a model at an input size and band set, on a device, in a precision."""

    model: str
    input_size: int
    bands: tuple[str, ...]  # band names for dataset-band encoders; () = the model's own slots
    arch: tuple[tuple[str, Any], ...]
    batch: int
    precision: str  # resolved: bf16 | fp16 | fp32
    device: str
    default: bool  # the model's default setup (catalog size, or the published figures' setup)

    def build(self):
        """A random-init encoder (its cost does not depend on weights) where the caller says."""
        from .build import build_encoder  # timm: measured 3x the start-up of `list models`

        bands = [
            Band(name=b, alias=b, role="sar" if b in ("VV", "VH", "HH", "HV") else "optical")
            for b in self.bands
        ]
        return build_encoder(
            self.model, bands or None, input_size=self.input_size, **dict(self.arch)
        )

    @property
    def input_text(self) -> str:
        """Channels x side as the profile table prints it, e.g. `13x224`."""
        chans = len(self.bands) if self.bands else len(model_spec(self.model).slots)
        return f"{chans}x{self.input_size}"


def setup_for(model: str, input_size: int | None, batch: int, precision: str, device: str) -> Setup:
    """The model's setup: its catalog input size and slots, or for dataset-band models and null
    sizes the setup its published figures were measured with; `input_size` overrides the size."""
    spec = model_spec(model)
    pub = spec.published_setup
    catalog_size = spec.input_size or pub.get("input_size")
    if catalog_size is None:
        raise UserError(
            f"model {model!r} takes the dataset tile size and its catalog has no"
            " published.setup.input_size; pass --input-size"
        )
    bands = tuple(pub.get("bands", ())) if spec.takes_dataset_bands else ()
    if spec.takes_dataset_bands and not bands:
        raise UserError(
            f"model {model!r} takes the dataset's bands and its catalog has no"
            " published.setup.bands to profile with"
        )
    arch = tuple(sorted((pub.get("arch") or {}).items()))
    default = input_size in (None, catalog_size)
    size = int(input_size or catalog_size)
    return Setup(model, size, bands, arch, batch, precision, device, default)


def dry_run(s: Setup) -> tuple[int, dict[str, int], int]:
    """(forward FLOPs at batch 1, their split by op, parameters) of `s` on the meta device (shapes
    only: the check before any work and the FLOP count in one). Refuses an input size its forward
    rejects or, where the catalog names a patch size, not a multiple of it (a strided patch
    embedding would silently drop the remainder)."""
    patch = model_spec(s.model).arch.get("patch_size")
    why = None
    if s.input_size < 1 or (patch and s.input_size % int(patch)):
        why = f"it must be a positive multiple of its patch size {patch}"
    else:
        try:
            with torch.device("meta"):
                enc = s.build().eval()
                x = torch.empty(1, enc.in_chans, s.input_size, s.input_size)
                flops, by_op = count_flops(enc, x)
        except UserError as e:
            why = str(e)
        except (RuntimeError, ValueError) as e:
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if why is not None:
        raise UserError(f"model {s.model!r} does not accept input size {s.input_size}: {why}")
    from .base import count_params

    return flops, by_op, count_params(enc)


def config_digest(model: str) -> str:
    """Digest of what decides a model's cost: its config file and its architecture's source."""
    spec = model_spec(model)
    h = hashlib.sha256(Path(find("models", model)).read_bytes())
    builder = architectures()[spec.architecture]
    h.update(inspect.getsource(inspect.getmodule(builder)).encode())
    h.update(f"v{VERSION}".encode())
    return h.hexdigest()[:16]


def cache_key(s: Setup, threads: int, torch_version: str, digest: str) -> str:
    """Everything a measurement depends on: a change in any part measures again."""
    arch = ",".join(f"{k}={v}" for k, v in s.arch)
    bands = ",".join(s.bands)
    return (
        f"{s.model}|{s.input_size}|{bands}|{arch}|batch {s.batch}|{s.precision}|threads {threads}|"
        f"torch {torch_version}|{digest}"
    )


def _read(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(
            f"profile cache {path} is unreadable ({e}); delete it to measure again"
        ) from None
    if not isinstance(d, dict) or not isinstance(d.get("entries"), dict):
        raise UserError(
            f"profile cache {path} is not a profile file (no 'entries'); delete it to measure again"
        )
    return d


def count_flops(enc, x) -> tuple[int, dict[str, int]]:
    """Forward FLOPs of `enc` on `x` (a meta tensor counts alike) and their split by op; math
    attention, as fused kernels would hide their matmuls."""

    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as fc:
        enc(x)
    by_op = {
        str(k).removeprefix("aten."): int(v)
        for k, v in fc.get_flop_counts().get("Global", {}).items()
    }
    return int(fc.get_total_flops()), by_op


def measure(s: Setup, iters: int = 3, budget_s: float = 20.0) -> dict[str, Any]:
    """`s` built with random weights (seed 0) and measured (`CONVENTION`, `MEMORY_NOTE`): up to
    `iters` timed forwards after a warm-up, fewer past `budget_s`."""
    # dask's distributed comes with cluster.runtime: imported only where memory is measured
    from ..cluster.runtime import peak_memory, rss_bytes, trim_malloc

    flops, by_op, params = dry_run(s)  # the meta build's parameters are the real build's
    cuda = s.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def forward() -> float:
        t = time.perf_counter()
        enc(xb)
        sync()
        return time.perf_counter() - t

    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    else:  # freed pages of earlier models go back to the system: this model's rise shows in RSS
        trim_malloc()
    base = torch.cuda.memory_allocated() if cuda else rss_bytes()
    with peak_memory(s.device) as pm:  # None where VmHWM cannot be reset (the process's peak)
        torch.manual_seed(0)
        t0 = time.perf_counter()
        enc = s.build().eval().to(s.device)
        build_s = time.perf_counter() - t0
        x1 = torch.randn(1, enc.in_chans, s.input_size, s.input_size, device=s.device)
        xb = x1.expand(s.batch, -1, -1, -1).contiguous()
        with torch.no_grad(), autocast(s.device, s.precision):
            warm_s, times = forward(), []  # warm-up: kernels chosen, caches filled
            for _ in range(max(1, iters)):
                times.append(forward())
                if warm_s + sum(times) > budget_s:
                    break
    peak = None if pm.mb is None else pm.mb * 2**20 - base
    spec = model_spec(s.model)
    return {
        "model": s.model,
        "input": s.input_text,
        "input_size": s.input_size,
        "bands": list(s.bands),
        "arch": dict(s.arch),
        "default_setup": s.default,
        "batch": s.batch,
        "precision": s.precision,
        "params": params,
        "flops": flops,
        "gflops": flops / 1e9,
        "flops_by_op": by_op,
        "published_params_m": spec.params_m,
        "published_gflops": spec.gflops,
        "published_setup": s.default,  # the published figures hold for the default setup only
        "samples_per_s": s.batch / statistics.median(times),
        "forward_s": times,
        "warmup_s": warm_s,
        "peak_memory_mb": None if peak is None else max(peak, 0) / 2**20,
        "memory_method": "cuda" if cuda else "cpu",
        "build_s": build_s,
    }


@dataclass
class Profile:
    """Rows of one profiling command, with where each came from."""

    device: str  # described, e.g. "cpu x86_64 with AMX/AVX512-BF16"
    rows: list[dict[str, Any]]
    path: Path
    seconds: float = 0.0

    @property
    def cached(self) -> int:
        """Rows read from the cache, not measured now (the summary counts the rest as measured)."""
        return sum(1 for r in self.rows if r.get("cached"))


def validate(
    models: Sequence[str] | None,
    input_size: int | None,
    batch: int,
    precision: str,
    device: str,
    iters: int = 3,
) -> list[Setup]:
    """Every requested setup, checked before measuring: one sentence for the first bad one."""
    known = list_models()
    models = list(models or known)
    if unknown := [m for m in models if m not in known]:
        raise UserError(f"unknown model {unknown[0]!r}; known: {', '.join(known)}")
    for name, value in (("batch", batch), ("iters", iters)):
        if value < 1:
            raise UserError(f"{name} must be at least 1, got {value}")
    if input_size is not None and input_size < 1:
        raise UserError(f"input size must be a positive number of pixels, got {input_size}")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UserError(
                f"device {device!r} is not available here (torch sees no CUDA device); use"
                " --device cpu"
            )
    elif device != "cpu":
        raise UserError(f"device must be cpu or cuda[:N], got {device!r}")
    prec = resolve(precision, this_device(device))
    setups = [setup_for(m, input_size, batch, prec, device) for m in models]
    for s in setups:
        dry_run(s)
    return setups


def profile(
    setups: Sequence[Setup],
    iters: int = 3,
    refresh: bool = False,
    root: str | Path | None = None,
    on_row: Callable[[dict], None] | None = None,
    progress: bool = True,
) -> Profile:
    """Each setup measured, or read from this device's cache under the same `cache_key`."""
    from ..store import write_atomic  # zarr and distributed: only where something is measured

    t0 = time.perf_counter()
    device = setups[0].device if setups else "cpu"
    described = this_device(device).describe()
    slug = re.sub(r"[^A-Za-z0-9]+", "-", described).strip("-").lower()
    path = Path(root or profile_dir()) / f"{slug}.json"  # one cache per device
    data = _read(path) or {"device": described, "entries": {}}
    threads = torch.get_num_threads()
    rows = []
    with progress_bar("profile", len(setups), progress) as bar:
        for s in setups:
            key = cache_key(s, threads, torch.__version__, config_digest(s.model))
            hit = data["entries"].get(key)
            if hit is not None and not refresh:
                row = {**hit, "cached": True}
            else:
                row = {
                    **measure(s, iters),
                    "threads": threads,
                    "torch": torch.__version__,
                    "device": data["device"],
                    "key": key,
                    "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                }
                data["entries"][key] = row
                # after each model: an interrupted table keeps what it measured
                write_atomic(str(path), json.dumps(data, indent=1, sort_keys=True))
                row = {**row, "cached": False}
            rows.append(row)
            if on_row:
                on_row(row)
            bar.advance()
    return Profile(data["device"], rows, path, time.perf_counter() - t0)


def difference(r: dict[str, Any]) -> str:
    """Why measured and published GFLOPs differ, by the row's own op split: "=", "+attention" or
    "other" (the table's legend says what each means)."""
    pub = _pub(r, "published_gflops")
    if not pub:
        return "-"
    g = r["gflops"]
    if abs(g - pub) <= 0.01 * pub:
        return "="
    bmm = r.get("flops_by_op", {}).get("bmm", 0) / 1e9
    return "+attention" if bmm and abs(g - bmm - pub) <= 0.01 * pub else "other"


def _f(v, nd=2) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def _pub(r: dict[str, Any], key: str):
    """A published figure, shown only for the setup it was measured with."""
    return r.get(key) if r.get("published_setup") else None


COLUMNS: tuple[tuple[str, Callable[[dict], str]], ...] = (
    ("model", lambda r: r["model"]),
    ("input", lambda r: r["input"]),
    ("params M", lambda r: _f(r["params"] / 1e6)),
    ("published", lambda r: _f(_pub(r, "published_params_m"))),
    ("GFLOPs", lambda r: _f(r["gflops"])),
    ("published", lambda r: _f(_pub(r, "published_gflops"))),
    ("ratio", lambda r: _f(r["gflops"] / g) if (g := _pub(r, "published_gflops")) else "-"),
    ("why", lambda r: difference(r)),
    ("prec", lambda r: r["precision"]),
    ("batch", lambda r: str(r["batch"])),
    ("samples/s", lambda r: _f(r["samples_per_s"], 3)),
    ("timed", lambda r: str(len(r["forward_s"]))),
    ("peak MB", lambda r: _f(r["peak_memory_mb"], 0)),
    ("source", lambda r: "cached" if r.get("cached") else "measured"),
)


def table(p: Profile) -> str:
    """The profile as a text table, with its conventions and where it is cached."""
    head = [h for h, _ in COLUMNS]
    rows = [head] + [[cell(r) for _, cell in COLUMNS] for r in p.rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        for row in rows
    ]
    kind = "cuda" if any(r.get("memory_method") == "cuda" for r in p.rows) else "cpu"
    threads = sorted({str(r.get("threads")) for r in p.rows})
    return "\n".join(
        [f"device: {p.device}; torch threads {', '.join(threads)}"]
        + lines
        + [
            "",
            CONVENTION,
            (
                "published: the catalog's figures (pangaea-models.md 1.5), shown only for the setup"
                " they were measured with. why: '=' within 1 %; '+attention' the difference is"
                " exactly the attention matmuls, which the published count missed inside fused"
                " attention kernels; 'other' see the model's catalog notes (e.g. CROMA-optical"
                " stops after block 11; RemoteCLIP's reference ran nn.MultiheadAttention's fused"
                " path, uncounted)."
            ),
            (
                "samples/s: batch / median of the 'timed' forwards after a warm-up, in the"
                f" precision shown; {MEMORY_NOTE[kind]}."
            ),
            f"cache: {p.path} ({p.cached} of {len(p.rows)} rows read from it)",
        ]
    )


def _rank(e: dict) -> tuple[bool, str]:
    return e.get("precision") == "fp32", str(e.get("measured_at", ""))


def measured_costs(root: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """Per model id, its newest measured default-setup profile cached under `root`, preferring fp32
    (GFLOPs do not depend on device or precision; samples/s do, and are labelled)."""
    d = Path(root or profile_dir())
    best: dict[str, dict[str, Any]] = {}
    for f in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            entries = _read(f).get("entries", {})
        except UserError as e:
            warnings.warn(f"{e}; the report uses the catalog's figures for what it held")
            continue
        for e in entries.values():
            if not isinstance(e, dict) or not e.get("default_setup") or "gflops" not in e:
                continue
            cur = best.get(e["model"])
            if cur is None or _rank(e) > _rank(cur):
                best[e["model"]] = e
    return best
