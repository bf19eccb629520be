"""Numeric precision: what a device computes fast, and the autocast/scaler that use it. bf16 and
fp16 are autocast with fp32 master weights, optimiser state and loss; `resolve` takes the device's
reported capability as input, so both answers are testable on any machine."""

from __future__ import annotations

import contextlib
import platform
from dataclasses import dataclass

from .errors import UserError

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass(frozen=True)
class DeviceInfo:
    """What a worker's device can do, as torch reports it."""

    type: str  # "cpu" | "cuda"
    name: str = ""
    cuda_capability: tuple[int, int] | None = None
    cpu_bf16: bool = False  # AMX tiles or AVX512-BF16 (oneDNN's fast bf16 paths)
    memory_bytes: int | None = None
    # AMX tiles: oneDNN's bf16 convolutions run fastest on channels_last there
    cpu_amx: bool = False

    def describe(self) -> str:
        """The device in one line, bf16 capability included (records, the FLOP profile cache)."""
        if self.type == "cuda":
            cap = ".".join(map(str, self.cuda_capability or ()))
            return f"cuda {self.name} (compute capability {cap})"
        units = "with AMX/AVX512-BF16" if self.cpu_bf16 else "without bf16 matrix units"
        return f"cpu {self.name} {units}"


def fast_bf16(info: DeviceInfo) -> bool:
    """Whether `auto` takes bf16: CUDA capability >= 8.0, or a CPU with AMX or AVX512-BF16."""
    if info.type == "cuda":
        return info.cuda_capability is not None and tuple(info.cuda_capability) >= (8, 0)
    return bool(info.cpu_bf16)


def resolve(requested: str, info: DeviceInfo) -> str:
    """The precision a run computes in: `requested`, with auto decided by the device."""
    if requested not in PRECISIONS:
        raise UserError(f"precision must be one of {', '.join(PRECISIONS)}, got {requested!r}")
    if requested == "auto":
        return "bf16" if fast_bf16(info) else "fp32"
    if requested == "fp16" and info.type == "cpu":
        raise UserError(
            "precision fp16 needs a GPU (CPU autocast computes in bf16); use bf16 or auto"
        )
    return requested


def this_device(device: str | None = None) -> DeviceInfo:
    """DeviceInfo of this process's torch device (the one tasks use: cuda when visible)."""
    import torch

    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dev.startswith("cuda"):
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        return DeviceInfo("cuda", p.name, (p.major, p.minor), False, int(p.total_memory))
    cpu = torch.cpu
    amx = bool(getattr(cpu, "_is_amx_tile_supported", lambda: False)())
    bf16 = amx or bool(getattr(cpu, "_is_avx512_bf16_supported", lambda: False)())
    name = platform.processor() or platform.machine()
    return DeviceInfo("cpu", name, None, bf16, None, cpu_amx=amx)


def auto_memory_format(info: DeviceInfo, precision: str) -> str:
    """`memory_format: auto`: channels_last where it measured faster for conv decoders (CUDA; bf16
    on AMX, where UPerNet-512's step took 1.08 s against 1.50 s contiguous, forward 2x), contiguous
    elsewhere (slower on AVX2 and AVX512-BF16 CPUs)."""
    fast = info.type == "cuda" or (info.cpu_amx and precision == "bf16")
    return "channels_last" if fast else "contiguous"


def weakest(infos: list[DeviceInfo]) -> DeviceInfo:
    """The device that decides `auto` for a cluster: one without fast bf16 if any."""
    if not infos:
        raise UserError("no workers to ask for their device")
    slow = [i for i in infos if not fast_bf16(i)]
    return (slow or infos)[0]


def autocast(device: str, precision: str):
    """The autocast context of a precision (a no-op for fp32)."""
    import torch

    if precision == "fp32":
        return contextlib.nullcontext()
    kind = "cuda" if device.startswith("cuda") else "cpu"
    return torch.autocast(kind, dtype=getattr(torch, DTYPES[precision]))


def grad_scaler(device: str, precision: str):
    """A gradient scaler for fp16 (bf16 has fp32's range and needs none)."""
    import torch

    kind = "cuda" if device.startswith("cuda") else "cpu"
    return torch.amp.GradScaler(kind, enabled=(precision == "fp16"))
