"""Training one run (a single Dask task) and testing it (map tasks returning confusion matrices).

Frozen protocols train the decoder on cached features; fine-tuning and scratch baselines train
encoder + decoder on crops streamed from the cube. Both share the recipe (AdamW, per-iteration
multi-step LR, validation before epochs 0, 5, ... and after the last, best checkpoint by val mIoU)
and the sliding-window evaluation with averaged logits.
"""
from __future__ import annotations

import copy
import io
import math
import resource
import time
from typing import Any, Callable, Iterable

import fsspec
import numpy as np
import torch
from torch import nn

from .. import store as _store
from ..catalog import CUBE_IGNORE_INDEX
from ..errors import task_boundary
from .data import pad_to, read_samples
from .features import get_encoder, window_offsets
from .metrics import confusion_matrix, metrics_from_confusion
from .protocols import TrainConfig


class NonFiniteLoss(FloatingPointError):
    pass


# -- models -----------------------------------------------------------------------------------------


def decoder_kind(model: str, cfg: TrainConfig) -> str:
    from ..models import model_spec

    return "unet" if model_spec(model).family == "unet" else cfg.decoder


def build_model(task: dict, device: str) -> tuple[nn.Module, nn.Module | None]:
    """(trainable module, frozen encoder or None). Frozen: the decoder; otherwise a Segmenter."""
    from ..models import Segmenter, build_decoder, build_encoder

    cfg: TrainConfig = task["config"]
    kind = decoder_kind(task["model"], cfg)
    kw = {"channels": cfg.decoder_channels} if kind == "upernet" else {}
    if task["kind"] == "frozen":
        enc = get_encoder(task["model"], task["bands"], task["input_size"], task["weights"], task["mode"], device)
        # seeded after the encoder: whether this worker built it now or earlier must not change the decoder
        torch.manual_seed(task["run_seed"])
        dec = build_decoder(kind, enc, task["num_classes"], **kw)
        return dec.to(device), enc
    torch.manual_seed(task["run_seed"])
    enc = build_encoder(task["model"], bands=list(task["bands"]), weights=task["weights"], input_size=task["input_size"], mode=task["mode"])
    dec = build_decoder(kind, enc, task["num_classes"], **kw)
    return Segmenter(enc, dec).to(device), None


def save_state(module: nn.Module, url: str) -> None:
    buf = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in module.state_dict().items()}, buf)
    with fsspec.open(url, "wb") as f:
        f.write(buf.getvalue())


def load_state(module: nn.Module, url: str) -> None:
    with fsspec.open(url, "rb") as f:
        state = torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=True)
    module.load_state_dict(state, strict=True)


class FeatureSplit:
    """Cached features of one split: held in memory when they fit `budget_mb`, else read per batch.

    Small caches (most datasets at most encoders) then cost one read per run instead of one zarr
    request per item and epoch; large ones stream, so memory stays bounded whatever the dataset size.
    """

    def __init__(self, group, budget_mb: float):
        self.group = group
        self.attrs = group.attrs
        self.levels = int(group.attrs["levels"])
        names = [f"f{i}" for i in range(self.levels)] + ["label"]
        size = sum(group[n].nbytes for n in names)
        self.arrays = {n: np.asarray(group[n][:]) for n in names} if size <= budget_mb * 2**20 else None

    def take(self, items: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        """Features (per level) and labels of the given sorted item indices."""
        if self.arrays is not None:
            return [self.arrays[f"f{i}"][items] for i in range(self.levels)], self.arrays["label"][items]
        if items.size and np.all(np.diff(items) == 1):
            sl = slice(int(items[0]), int(items[-1]) + 1)
            return [np.asarray(self.group[f"f{i}"][sl]) for i in range(self.levels)], np.asarray(self.group["label"][sl])
        sel = (items,)
        return ([np.asarray(self.group[f"f{i}"].get_orthogonal_selection(sel)) for i in range(self.levels)],
                np.asarray(self.group["label"].get_orthogonal_selection(sel)))


# -- sliding-window evaluation ----------------------------------------------------------------------


def stitch_predict(logits: torch.Tensor, offsets: np.ndarray, side: int) -> torch.Tensor:
    """Sum window logits (W, K, S, S) into the tile (averaging does not change the argmax) -> (side, side)."""
    k, s = logits.shape[1], logits.shape[-1]
    acc = torch.zeros((k, side, side), dtype=torch.float32)
    for w, (oy, ox) in enumerate(offsets):
        acc[:, oy : oy + s, ox : ox + s] += logits[w].float().cpu()
    return acc.argmax(0)


def eval_feature_tiles(decoder: nn.Module, group: FeatureSplit, positions: np.ndarray, tile: int, S: int, num_classes: int,
                       device: str, predictions: list | None = None) -> np.ndarray:
    """Confusion matrix of the decoder over cached windows of the tiles at cache `positions`."""
    per = int(group.attrs["per_sample"])
    side = max(tile, S)
    cm = np.zeros((num_classes, num_classes), dtype=np.int64)
    offs = window_offsets(tile, S)
    decoder.eval()
    with torch.inference_mode():
        for p in positions:
            arrays, labels = group.take(np.arange(int(p) * per, (int(p) + 1) * per))
            feats = [torch.from_numpy(a).float().to(device) for a in arrays]
            logits = decoder(feats, (S, S))
            pred = stitch_predict(logits, offs, side).numpy()
            tl = np.full((side, side), CUBE_IGNORE_INDEX, dtype=np.int16)
            for w, (oy, ox) in enumerate(offs):
                tl[oy : oy + S, ox : ox + S] = labels[w]
            cm += confusion_matrix(pred[:tile, :tile], tl[:tile, :tile], num_classes)
            if predictions is not None:
                predictions.append(pred[:tile, :tile].astype(np.int16))
    return cm


def eval_cube_tiles(model: nn.Module, task: dict, samples: np.ndarray, device: str, predictions: list | None = None,
                    chunk: int = 4) -> np.ndarray:
    """Confusion matrix of an end-to-end model over cube tiles (sliding windows, summed logits)."""
    S, tile, k = task["input_size"], task["tile"], task["num_classes"]
    side = max(tile, S)
    offs = window_offsets(tile, S)
    cm = np.zeros((k, k), dtype=np.int64)
    model.eval()
    with torch.inference_mode():
        for c0 in range(0, samples.size, chunk):
            image, label = read_samples(task["cube_url"], samples[c0 : c0 + chunk])
            x, lab = pad_to(task["inputs"].apply(image), label, S)
            for j in range(x.shape[0]):
                wins = torch.stack([x[j, :, oy : oy + S, ox : ox + S] for oy, ox in offs]).to(device)
                pred = stitch_predict(model(wins), offs, side).numpy()
                cm += confusion_matrix(pred[:tile, :tile], lab[j, :tile, :tile], k)
                if predictions is not None:
                    predictions.append(pred[:tile, :tile].astype(np.int16))
    return cm


# -- the training loop ----------------------------------------------------------------------------------


def _fit(module: nn.Module, batches: Callable[[int], Iterable[tuple[Any, torch.Tensor]]], forward: Callable,
         validate: Callable[[], np.ndarray], iters_per_epoch: int, cfg: TrainConfig, class_names, run_id: str, device: str):
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    total = max(1, iters_per_epoch * cfg.epochs)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[int(m * total) for m in cfg.milestones], gamma=cfg.gamma)
    loss_fn = nn.CrossEntropyLoss(ignore_index=CUBE_IGNORE_INDEX)
    curve, best, best_state, best_epoch = [], -math.inf, None, -1
    losses = []

    def _validate(epoch: int):
        nonlocal best, best_state, best_epoch
        m = metrics_from_confusion(validate(), class_names)
        curve.append({"epoch": epoch, "mIoU": m["mIoU"], "mF1": m["mF1"], "loss": float(np.mean(losses)) if losses else None})
        if m["mIoU"] > best or best_state is None:  # strictly better, as the reference
            best, best_epoch = m["mIoU"], epoch
            best_state = copy.deepcopy({k: v.detach().cpu() for k, v in module.state_dict().items()})

    step = 0
    for epoch in range(cfg.epochs):
        if epoch % cfg.val_every == 0:
            _validate(epoch)
        module.train()
        losses = []
        for inputs, target in batches(epoch):
            logits = forward(inputs)
            loss = loss_fn(logits, target.to(device).long())
            if not torch.isfinite(loss):
                raise NonFiniteLoss(f"run {run_id}: non-finite loss ({loss.item()}) at epoch {epoch}, step {step}")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.detach().item())
            step += 1
    _validate(cfg.epochs)
    return curve, best_state, best_epoch, step


@task_boundary
def train_run(task: dict) -> dict:
    """One run's training on a worker: returns the validation curve; the best checkpoint goes to the run dir."""
    from .cluster import prepare_torch_task

    t0 = time.perf_counter()
    cfg: TrainConfig = task["config"]
    device = prepare_torch_task(task.get("threads"))
    torch.use_deterministic_algorithms(True, warn_only=True)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    module, frozen_encoder = build_model(task, device)
    encoder_params = int(sum(p.numel() for p in (frozen_encoder or module.encoder).parameters()))
    rng = np.random.default_rng(task["run_seed"])
    S, bs = task["input_size"], cfg.batch_size
    train_idx = np.asarray(task["train_samples"])
    n = train_idx.size
    iters = max(1, n // bs)  # drop_last, as the reference; at least one step
    names = task["class_names"]
    seen = 0

    if task["kind"] == "frozen":
        root = _store.open_group(task["cache_url"], "r")
        tg, vg = FeatureSplit(root["train"], cfg.cache_in_memory_mb), FeatureSplit(root["val"], cfg.cache_in_memory_mb)
        K = int(tg.attrs["per_sample"])
        pos = np.searchsorted(np.asarray(root["train"]["sample"][::K]), train_idx)
        val_pos = np.arange(int(vg.attrs["n_items"]) // int(vg.attrs["per_sample"]))
        if cfg.max_val_samples:
            val_pos = val_pos[: cfg.max_val_samples]

        def batches(epoch):
            nonlocal seen
            order = rng.permutation(pos)
            for b in range(iters):
                chosen = order[b * bs : (b + 1) * bs] if n >= bs else order
                items = np.sort(chosen * K + epoch % K)
                arrays, labels = tg.take(items)
                seen += items.size
                yield [torch.from_numpy(a).float().to(device) for a in arrays], torch.from_numpy(labels)

        forward = lambda feats: module(feats, (S, S))  # noqa: E731
        validate = lambda: eval_feature_tiles(module, vg, val_pos, task["tile"], S, task["num_classes"], device)  # noqa: E731
    else:
        val_idx = np.asarray(task["val_samples"])
        if cfg.max_val_samples:
            val_idx = val_idx[: cfg.max_val_samples]
        side_pad = max(task["tile"], S)

        def batches(epoch):
            nonlocal seen
            order = rng.permutation(train_idx)
            for b in range(iters):
                chosen = np.sort(order[b * bs : (b + 1) * bs] if n >= bs else order)
                image, label = read_samples(task["cube_url"], chosen)
                x, lab = pad_to(task["inputs"].apply(image), label, S)
                ys, xs = rng.integers(0, side_pad - S + 1, size=(2, chosen.size))
                xb = torch.stack([x[j, :, ys[j] : ys[j] + S, xs[j] : xs[j] + S] for j in range(chosen.size)]).to(device)
                lb = torch.from_numpy(np.stack([lab[j, ys[j] : ys[j] + S, xs[j] : xs[j] + S] for j in range(chosen.size)]))
                seen += chosen.size
                yield xb, lb

        forward = module
        validate = lambda: eval_cube_tiles(module, task, val_idx, device)  # noqa: E731

    curve, best_state, best_epoch, steps = _fit(module, batches, forward, validate, iters, cfg, names, task["run_id"], device)
    module.load_state_dict(best_state)
    save_state(module, task["checkpoint"])
    elapsed = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"val_curve": curve, "best_epoch": best_epoch, "train_s": elapsed, "steps": steps,
            "train_samples_per_s": seen / max(elapsed, 1e-9), "peak_memory_mb": peak, "device": device,
            "trainable_params": int(sum(p.numel() for p in module.parameters() if p.requires_grad)),
            "encoder_params": encoder_params}


@task_boundary
def test_block(task: dict) -> np.ndarray:
    """Confusion matrix of the best checkpoint on one block of test tiles (predictions saved alongside)."""
    from .cluster import prepare_torch_task

    device = prepare_torch_task(task.get("threads"))
    module, _ = build_model(task, device)
    load_state(module, task["checkpoint"])
    preds: list = []
    if task["kind"] == "frozen":
        g = FeatureSplit(_store.open_group(task["cache_url"], "r")["test"], 0)  # stream: each task reads only its block
        cm = eval_feature_tiles(module, g, np.asarray(task["positions"]), task["tile"], task["input_size"],
                                task["num_classes"], device, preds)
    else:
        cm = eval_cube_tiles(module, task, np.asarray(task["samples"]), device, preds)
    if task.get("predictions_url") and preds:
        g = _store.open_group(task["predictions_url"], "r+")
        g["pred"][task["pred_range"][0] : task["pred_range"][1]] = np.stack(preds)
    return cm
