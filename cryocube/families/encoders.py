"""Encoders as every family's tasks build them: the typed spec (model, inputs, checkpoint,
arithmetic), the per-worker build cache, and the cube-band -> encoder-slot normalisation map."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import torch

from ..catalog import Band, load_dataset
from ..cluster.runtime import task_boundary, torch_task
from ..errors import UserError
from ..models import BandMatchError, build_encoder, match_bands
from ..models.spec import ModelSpec
from ..precision import autocast
from .base import derive_seed


@dataclass(frozen=True)
class InputMap:
    """How cube bands become encoder input: per-slot band index (-1 = zero), per-band mean/std."""

    index: tuple[int, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def apply(self, image: np.ndarray) -> torch.Tensor:
        """(B, C_cube, H, W) raw -> (B, slots, H, W) float32, normalised; unmatched slots: 0."""
        x = torch.from_numpy(np.ascontiguousarray(image)).float()
        mean = torch.tensor(self.mean, dtype=torch.float32)[None, :, None, None]
        std = torch.tensor(self.std, dtype=torch.float32)[None, :, None, None]
        x = (x - mean) / std
        out = torch.zeros((x.shape[0], len(self.index), *x.shape[2:]), dtype=torch.float32)
        for slot, b in enumerate(self.index):
            if b >= 0:
                out[:, slot] = x[:, b]
        return out


def dataset_band_rule(dataset: str, default: str = "named") -> str:
    """The catalog's band rule of a dataset (`embed_bands`), `default` where it has none."""
    try:
        return load_dataset(dataset).embed_bands
    except UserError:
        return default


def match_cube_bands(mspec: ModelSpec, bands, rule: str, offers_cross_sensor: bool = True):
    """(rule, BandMatch) of `evaluate` and `embed`: an optical-only encoder on a cube with no
    optical band gets its SAR/grey bands in the RGB slots (cross-sensor, as Cryo-Bench does)."""
    try:
        return rule, match_bands(mspec, bands, rule, offers_cross_sensor)
    except BandMatchError:
        if rule != "named" or any(b.role == "optical" for b in bands):
            raise
        return "cross_sensor", match_bands(mspec, bands, "cross_sensor", offers_cross_sensor)


_ENCODERS: dict[tuple, torch.nn.Module] = {}  # per worker process: built once, reused by every task


@dataclass(frozen=True)
class EncoderSpec:
    """An encoder as tasks build it: the model, its inputs, its checkpoint, the arithmetic."""

    model: ModelSpec
    bands: tuple[Band, ...]
    rule: str  # band-matching rule
    input_size: int
    weights: str | None  # checkpoint path/URL; None = random init
    weights_sha256: str | None
    precision: str  # effective: bf16 | fp16 | fp32
    threads: int | None = None  # torch threads where they change the arithmetic (CPU); None on CUDA

    def arithmetic(self) -> dict:
        """What decides the features' bits besides model and inputs (cache and embedding keys)."""
        return {"precision": self.precision, **({"threads": self.threads} if self.threads else {})}

    @property
    def key(self) -> tuple:
        """The module's key in the per-worker cache (autocast applies precision, threads)."""
        # repr: Band fields may be NaN (NaN != NaN); arch: a YAML-only variant has its own module
        return (
            self.model.id,
            json.dumps(self.model.arch, sort_keys=True, default=str),
            self.model.followed,
            repr(self.bands),
            self.input_size,
            self.weights,
            self.weights_sha256,
            self.rule,
        )

    def build(self, pretrained: bool = True) -> torch.nn.Module:
        """The module, weights loaded unless a checkpoint replaces them (seed torch first)."""
        return build_encoder(
            self.model,
            bands=list(self.bands),
            weights=self.weights if pretrained else None,
            sha256=self.weights_sha256 if pretrained else None,
            input_size=self.input_size,
            rule=self.rule,
        )


def get_encoder(spec: EncoderSpec, device: str) -> torch.nn.Module:
    """The encoder for these inputs, built once per worker process, in eval mode (frozen)."""
    key = spec.key + (device,)
    enc = _ENCODERS.get(key)
    if enc is None:
        # the same initial weights on every worker: random features must not depend on the worker
        torch.manual_seed(derive_seed(spec.model.id, spec.weights))
        enc = spec.build()
        enc.eval().requires_grad_(False).to(device)
        _ENCODERS.clear()  # keep one model resident: large encoders do not fit many times over
        _ENCODERS[key] = enc
    return enc


def extract_batch_size(
    enc: torch.nn.Module, spec: EncoderSpec, device: str, fixed: int | None
) -> int:
    """Encoder batch for extraction and inference: fixed, or sized to the device's free memory."""
    if fixed:
        return fixed
    if not device.startswith("cuda"):
        return 16  # CPU: throughput is flat beyond this, memory is not
    free, _ = torch.cuda.mem_get_info()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    x = torch.zeros(2, enc.in_chans, spec.input_size, spec.input_size, device=device)
    with torch.inference_mode(), autocast(device, spec.precision):
        enc(x)
    per_sample = max(1, (torch.cuda.max_memory_allocated() - base) // 2)
    return int(max(1, min(512, 0.6 * free // per_sample)))


def input_map(cube, index: list[int], normalization: str) -> InputMap:
    """Normalisation by the catalog's or the cube's mean/std; unusable fed bands refused."""
    if normalization == "published":
        mean, std = cube.published_mean, cube.published_std
    else:
        mean, std = cube.mean, cube.std
    usable = np.isfinite(mean) & (np.asarray(std) > 0)
    bad = [b.name for i, b in enumerate(cube.bands) if i in index and not usable[i]]
    if bad:
        hint = (
            "the dataset catalog gives no published mean/std for them: use --set normalization=cube"
            if normalization == "published"
            else "an empty train split or a constant band?"
        )
        raise UserError(f"{cube.url}: bands {bad} have no usable {normalization} mean/std ({hint})")
    return InputMap(tuple(int(i) for i in index), tuple(map(float, mean)), tuple(map(float, std)))


@task_boundary
def encoder_facts(spec: EncoderSpec) -> tuple[list[tuple[int, int, int]], int]:
    """Feature shapes and parameters of an encoder, from the worker that will extract."""
    with torch_task() as (device, _):
        enc = get_encoder(spec, device)
        params = sum(q.numel() for q in enc.parameters())
        return [tuple(s) for s in enc.feature_shapes(spec.input_size)], int(params)


def encoder_input_size(mspec: ModelSpec, tile: int, requested: int | None, where: str) -> int:
    """The encoder's input side: the recipe's, else the model's, else the whole tile padded to a
    multiple of 32 (U-Net, RAMEN; GLD: 300 -> 320); it must be a multiple of the patch size."""
    size = int(requested or mspec.input_size or -(-tile // 32) * 32)
    patch = int(mspec.arch.get("patch_size", 1) or 1)
    if size % patch:
        raise UserError(
            f"{where}: input_size {size} is not a multiple of the encoder's patch size {patch}"
        )
    return size


def window_offsets(tile: int, size: int) -> np.ndarray:
    """(W, 2) corners of ceil(side / size)^2 windows spread evenly over a (padded) tile."""
    side = max(tile, size)
    offs = [int(round(v)) for v in np.linspace(0, side - size, int(np.ceil(side / size)))]
    return np.array([(y, x) for y in offs for x in offs], dtype=np.int32)
