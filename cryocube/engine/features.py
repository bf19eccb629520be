"""Frozen-encoder feature cache: encoder outputs computed once per (model, cube, band mode, window
set) and reused by every epoch, validation pass and seed.

Training items are a fixed bank of `crops_per_sample` random crops per train sample (epoch e uses
crop e mod K, as the reference draws one fresh crop per sample per epoch); validation/test items are
the deterministic sliding windows of each tile. Items are written by block tasks with a progress flag
each, like the cube writer, so an interrupted extraction resumes where it stopped.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import store as _store
from ..catalog import Band
from ..errors import task_boundary
from .data import InputMap, pad_to, read_samples
from .protocols import sliding_offsets

COMPLETE = "cryocube_features_complete"
_ENCODERS: dict[tuple, torch.nn.Module] = {}  # per worker process: built once, reused by every task


def get_encoder(model: str, bands: tuple[Band, ...], input_size: int | None, weights: str | None, mode: str, device: str):
    """The encoder for these inputs, built once per worker process (in eval mode: frozen means frozen)."""
    from ..models import build_encoder

    key = (model, repr(bands), input_size, weights, mode, device)  # repr: Band fields may be NaN (NaN != NaN)
    enc = _ENCODERS.get(key)
    if enc is None:
        # the same initial weights on every worker: without pretrained weights, features must not
        # depend on which worker computed them
        torch.manual_seed(int(hashlib.sha256(f"{model}|{weights}".encode()).hexdigest()[:8], 16))
        enc = build_encoder(model, bands=list(bands), weights=weights, input_size=input_size, mode=mode)
        enc.eval().requires_grad_(False).to(device)
        _ENCODERS.clear()  # keep one model resident: large encoders do not fit many times over
        _ENCODERS[key] = enc
    return enc


@task_boundary
def encoder_facts(task: dict[str, Any]) -> tuple[list[tuple[int, int, int]], int]:
    """Feature shapes and parameter count of a cache's encoder, from a worker: the worker keeps the
    encoder for the extraction that follows, and the client never builds (or loads weights of) it."""
    from .cluster import prepare_torch_task

    spec: CacheSpec = task["spec"]
    device = prepare_torch_task(task.get("threads"))
    enc = get_encoder(spec.model, spec.bands, spec.input_size, spec.weights, spec.mode, device)
    return [tuple(s) for s in enc.feature_shapes(spec.input_size)], int(sum(q.numel() for q in enc.parameters()))


@dataclass(frozen=True)
class CacheSpec:
    """Everything that defines a feature cache; its hash names the cache."""

    model: str
    cube_url: str
    cube_checksum: str
    bands: tuple[Band, ...]
    inputs: InputMap
    mode: str
    input_size: int  # encoder window side S
    tile: int
    crops_per_sample: int
    feature_dtype: str
    weights: str | None

    @property
    def key(self) -> str:
        ident = {
            "model": self.model, "cube": self.cube_checksum, "index": self.inputs.index, "mean": self.inputs.mean,
            "std": self.inputs.std, "mode": self.mode, "S": self.input_size, "K": self.crops_per_sample,
            "dtype": self.feature_dtype, "weights": self.weights, "v": 1,
        }
        h = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]
        return f"{self.model}-{self.mode}-{h}"


def window_offsets(tile: int, size: int) -> np.ndarray:
    """(W, 2) top-left corners of the sliding windows over a (padded) tile."""
    side = max(tile, size)
    offs = sliding_offsets(side, size)
    return np.array([(y, x) for y in offs for x in offs], dtype=np.int32)


def crop_offsets(n_samples: int, k: int, tile: int, size: int, seed: int) -> np.ndarray:
    """(n*k, 2) random crop corners, fixed by the cache seed (the bank)."""
    side = max(tile, size)
    rng = np.random.default_rng(seed)
    return rng.integers(0, side - size + 1, size=(n_samples * k, 2)).astype(np.int32)


def cache_url(root: str, spec: CacheSpec) -> str:
    return f"{root.rstrip('/')}/features/{spec.key}.zarr"


def create_split(url: str, split: str, samples: np.ndarray, spec: CacheSpec, feature_shapes, block_samples: int) -> dict:
    """Create (or reopen) one split's arrays; returns the plan the block tasks need."""

    g = _store.open_group(url, "a")
    if split in g and COMPLETE in g[split].attrs:
        return {"complete": True, "n_items": int(g[split]["sample"].shape[0])}
    per = spec.crops_per_sample if split == "train" else len(window_offsets(spec.tile, spec.input_size))
    n_items = samples.size * per
    if split == "train":
        seed = int(spec.key.rsplit("-", 1)[1][:8], 16)
        offsets = crop_offsets(samples.size, per, spec.tile, spec.input_size, seed)
    else:
        offsets = np.tile(window_offsets(spec.tile, spec.input_size), (samples.size, 1))
    n_blocks = int(np.ceil(samples.size / block_samples)) if samples.size else 0
    if split in g and g[split].attrs.get("n_items") == n_items and "progress" in g[split]:
        sg = g[split]
    else:
        if split in g:
            del g[split]
        sg = g.create_group(split)
        S = spec.input_size
        sg.create_array("sample", data=np.repeat(samples.astype(np.int64), per))
        sg.create_array("offset", data=offsets)
        sg.create_array("label", shape=(n_items, S, S), chunks=(1, S, S), dtype="int16", fill_value=-1)
        for i, (c, h, w) in enumerate(feature_shapes):
            sg.create_array(f"f{i}", shape=(n_items, c, h, w), chunks=(1, c, h, w), dtype=spec.feature_dtype, fill_value=0)
        sg.create_array("progress", shape=(max(n_blocks, 1),), chunks=(1,), dtype="uint8", fill_value=0)
        sg.attrs.update({"n_items": n_items, "per_sample": per, "tile": spec.tile, "input_size": spec.input_size,
                         "levels": len(feature_shapes), "block_samples": block_samples})
    done = np.asarray(sg["progress"][:]).astype(bool)
    blocks = [b for b in range(n_blocks) if not done[b]]
    return {"complete": False, "n_items": n_items, "per": per, "blocks": blocks, "n_blocks": n_blocks}


@task_boundary
def extract_block(task: dict[str, Any]) -> dict[str, Any]:
    """Run the frozen encoder over one block of samples and write their items' features."""
    from .cluster import prepare_torch_task

    t0 = time.perf_counter()
    spec: CacheSpec = task["spec"]
    device = prepare_torch_task(task.get("threads"))
    samples = task["samples"]
    per, S = task["per"], spec.input_size
    g = _store.open_group(task["url"], "r+")[task["split"]]
    i0 = task["item0"]
    offsets = np.asarray(g["offset"][i0 : i0 + samples.size * per])
    image, label = read_samples(spec.cube_url, samples)
    x = spec.inputs.apply(image)
    x, label = pad_to(x, label, S)
    xs, ys = [], []
    for j in range(samples.size):
        for k in range(per):
            oy, ox = offsets[j * per + k]
            xs.append(x[j, :, oy : oy + S, ox : ox + S])
            ys.append(label[j, oy : oy + S, ox : ox + S])
    enc = get_encoder(spec.model, spec.bands, spec.input_size, spec.weights, spec.mode, device)
    batch = task.get("batch", 16)
    outs: list[list[np.ndarray]] = []
    with torch.inference_mode():
        for b in range(0, len(xs), batch):
            feats = enc(torch.stack(xs[b : b + batch]).to(device))
            outs.append([f.to(torch.float32).cpu().numpy().astype(spec.feature_dtype) for f in feats])
            if not all(np.isfinite(o).all() for o in outs[-1]):
                raise FloatingPointError(f"{spec.model}: non-finite features for samples {samples[b // per : (b + batch) // per + 1].tolist()} "
                                         f"of {spec.cube_url} (input range {float(x.min()):.3g}..{float(x.max()):.3g})")
    n = len(xs)
    for lvl in range(len(outs[0])):
        g[f"f{lvl}"][i0 : i0 + n] = np.concatenate([o[lvl] for o in outs])
    g["label"][i0 : i0 + n] = np.stack(ys)
    g["progress"][task["block"]] = 1
    return {"items": n, "seconds": time.perf_counter() - t0, "bytes_in": image.nbytes}


def mark_complete(url: str, split: str, forwards: int) -> None:
    g = _store.open_group(url, "r+")[split]
    if not np.all(np.asarray(g["progress"][:]) == 1) and g.attrs["n_items"] > 0:
        raise RuntimeError(f"{url}/{split}: feature blocks missing")
    g.attrs[COMPLETE] = {"time": time.time(), "encoder_items": forwards}


def block_tasks(url: str, split: str, samples: np.ndarray, spec: CacheSpec, plan: dict, block_samples: int, threads) -> list[dict]:
    per = plan["per"]
    tasks = []
    for b in plan["blocks"]:
        s = samples[b * block_samples : (b + 1) * block_samples]
        tasks.append({"url": url, "split": split, "spec": spec, "samples": s, "per": per, "item0": b * block_samples * per,
                      "block": b, "threads": threads})
    return tasks
