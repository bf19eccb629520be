"""Fitting segmentation runs (one task per group) and testing them (docs/segmentation.md)."""

from __future__ import annotations

import contextlib
import copy
import io
import math
import queue
import threading
import time
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from distributed import get_worker
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from ... import store as _store
from ...catalog import CUBE_IGNORE_INDEX
from ...cluster.runtime import peak_memory, task_boundary, torch_task
from ...cube import read_dense
from ...decoders import Segmenter, build_decoder
from ...errors import NonFiniteLoss, UserError, failure
from ...precision import autocast, grad_scaler
from ..encoders import window_offsets
from .data import pad_to
from .features import FeatureSplit, get_encoder
from .metrics import TileConfusions, confusion_matrix, metrics_from_confusion
from .work import FitTask, SegRun, TestTask

PROGRESS_TOPIC = "cryocube-progress"


class CrossEntropy(nn.CrossEntropyLoss):
    """Mean cross-entropy over labelled pixels, atomic-free on deterministic CUDA."""

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """torch's, but on deterministic CUDA, whose 2-D NLL counts labelled pixels with atomics."""
        if not (logits.is_cuda and torch.are_deterministic_algorithms_enabled()):
            return super().forward(logits, target)
        return masked_mean_cross_entropy(logits, target, self.ignore_index)


def masked_mean_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, ignore_index: int
) -> torch.Tensor:
    """The same mean as CrossEntropyLoss(ignore_index), from per-pixel losses (no atomic count)."""
    per = nn.functional.cross_entropy(logits, target, ignore_index=ignore_index, reduction="none")
    return per.sum() / (target != ignore_index).sum()


def deterministic_attention(device: str):
    """Math attention when training on deterministic CUDA (the others' backwards use atomics)."""
    if not (device.startswith("cuda") and torch.are_deterministic_algorithms_enabled()):
        return contextlib.nullcontext()
    return sdpa_kernel(SDPBackend.MATH)


def publish(event: dict) -> None:
    """A progress event to the client (a no-op outside a Dask worker)."""
    with contextlib.suppress(ValueError):
        get_worker().log_event(PROGRESS_TOPIC, event)


# devices with torch's fused AdamW kernel: one pass over each tensor instead of a dozen ops per
# tensor. UPerNet-512 on 2 CPU threads: 130 -> 30 ms a step; ViT-B fine-tuning 432 -> 86 ms
FUSED_ADAMW = ("cpu", "cuda")


def adamw(params: list, cfg, device: str) -> tuple[torch.optim.Optimizer, str]:
    """AdamW as the reference sets it, fused where it can be, and its name for the record."""
    fused = device.split(":")[0] in FUSED_ADAMW
    opt = torch.optim.AdamW(
        params,
        lr=cfg.lr,
        betas=tuple(cfg.betas),
        weight_decay=cfg.weight_decay,
        **({"fused": True} if fused else {}),
    )
    return opt, "adamw-fused" if fused else "adamw"


def build_model(
    run: SegRun, device: str, pretrained: bool = True
) -> tuple[nn.Module, nn.Module | None]:
    """(trainable module, frozen encoder or None); `pretrained=False`: a checkpoint follows."""
    kw = dict(run.decoder_kwargs)
    if not run.trains_encoder:
        frozen = get_encoder(run.encoder, device)
        # seeded after the encoder: whether this worker built it now or earlier must not matter
        torch.manual_seed(run.seed)
        module = build_decoder(run.decoder, frozen, run.num_classes, **kw).to(device)
    else:
        torch.manual_seed(run.seed)
        enc = run.encoder.build(pretrained)
        decoder = build_decoder(run.decoder, enc, run.num_classes, **kw)
        module, frozen = Segmenter(enc, decoder).to(device), None
    if run.memory_format == "channels_last":
        channels_last(module)
    return module, frozen


def channels_last(module: nn.Module) -> nn.Module:
    """Its 4-D weights channels_last. `Module.to(memory_format=)` refuses 5-D ones, and SpectralGPT
    embeds patches with a 3-D convolution: its fine-tune failed on AMX, where `auto` picks this."""
    with torch.no_grad():
        for t in (*module.parameters(), *module.buffers()):
            if t.dim() == 4:
                t.data = t.data.contiguous(memory_format=torch.channels_last)
    return module


def _fmt(x: torch.Tensor, run: SegRun) -> torch.Tensor:
    if run.memory_format == "channels_last" and x.ndim == 4:
        return x.contiguous(memory_format=torch.channels_last)
    return x


def save_state(state: dict[str, torch.Tensor], url: str) -> None:
    """Atomic (a test never loads half a file) and streamed (no second copy of 1.2 GB); on disk
    while the test runs, which waits for it (`make_durable`) before any record names the run."""
    with _store.atomic_file(url, durable=False) as f:
        torch.save({k: v.detach().cpu() for k, v in state.items()}, f)


def load_state(module: nn.Module, url: str) -> None:
    """Strict and weights-only: a mismatched checkpoint raises instead of testing a part."""
    remote = _store.is_remote(url)
    src = io.BytesIO(_store.read_bytes(url)) if remote else _store.local_path(url)
    state = torch.load(src, map_location="cpu", weights_only=True, mmap=not remote)
    module.load_state_dict(state, strict=True)


def prefetched(it: Iterable, depth: int = 2) -> Iterator:
    """Iterate `it` on a background thread, `depth` items ahead (zarr reads overlap compute)."""
    q: queue.Queue = queue.Queue(depth)
    done = object()

    def run():
        try:
            for x in it:
                q.put(x)
        except BaseException as e:  # re-raised in the consumer
            q.put(e)
        q.put(done)

    threading.Thread(target=run, daemon=True).start()
    while (x := q.get()) is not done:
        if isinstance(x, BaseException):
            raise x
        yield x


def _evaluate(forward, run: SegRun, device: str, tiles, kept: list | None) -> np.ndarray:
    """Confusion matrix over `tiles(offsets)`, logits summed per tile; `kept`: (pred, matrix)s."""
    S, t, k = run.encoder.input_size, run.tile, run.num_classes
    side, offs = max(t, S), window_offsets(t, S)
    cm = np.zeros((k, k), dtype=np.int64)
    with torch.inference_mode():
        for inputs, label in tiles(offs):
            with autocast(device, run.encoder.precision):
                logits = forward(inputs)
            s = logits.shape[-1]  # the windows' side
            acc = torch.zeros((logits.shape[1], side, side), dtype=torch.float32)
            for w, (oy, ox) in enumerate(offs):
                acc[:, oy : oy + s, ox : ox + s] += logits[w].float().cpu()
            pred = acc.argmax(0).numpy()[:t, :t]
            c = confusion_matrix(pred, label[:t, :t], k)
            cm += c
            if kept is not None:
                kept.append((pred.astype(np.int16), c))
    return cm


def eval_feature_tiles(
    decoder: nn.Module,
    run: SegRun,
    split: FeatureSplit,
    positions: np.ndarray,
    device: str,
    kept: list | None = None,
) -> np.ndarray:
    """Confusion matrix of the decoder over the cached windows of the tiles at cache `positions`."""
    S, per, side = run.encoder.input_size, split.per, max(run.tile, run.encoder.input_size)

    def tiles(offs):
        for p in positions:
            arrays, labels = split.take(np.arange(int(p) * per, (int(p) + 1) * per))
            tl = np.full((side, side), CUBE_IGNORE_INDEX, dtype=np.int16)
            for w, (oy, ox) in enumerate(offs):
                tl[oy : oy + S, ox : ox + S] = labels[w]
            yield [_fmt(torch.from_numpy(a).float().to(device), run) for a in arrays], tl

    decoder.eval()
    return _evaluate(lambda f: decoder(f, (S, S)), run, device, tiles, kept)


def eval_cube_tiles(
    model: nn.Module,
    run: SegRun,
    samples: np.ndarray,
    device: str,
    kept: list | None = None,
    chunk: int = 4,
) -> np.ndarray:
    """Confusion matrix of an end-to-end model over cube tiles (read `chunk` at a time)."""
    S = run.encoder.input_size

    def tiles(offs):
        for c0 in range(0, samples.size, chunk):
            image, label = read_dense(run.cube_url, samples[c0 : c0 + chunk])
            x, lab = pad_to(run.inputs.apply(image), label, S)
            for j in range(x.shape[0]):
                wins = torch.stack([x[j, :, oy : oy + S, ox : ox + S] for oy, ox in offs])
                yield _fmt(wins.to(device), run), lab[j]

    model.eval()
    return _evaluate(model, run, device, tiles, kept)


class Trainer:
    """One run's optimiser, schedule, curve and random state, an epoch at a time."""

    def __init__(
        self,
        run: SegRun,
        module: nn.Module,
        device: str,
        batches: Callable[[int], Iterable],
        forward: Callable,
        validate: Callable[[], np.ndarray],
    ):
        cfg = run.recipe
        self.run, self.module, self.device = run, module, device
        self.batches, self.forward, self.validate_fn = batches, forward, validate
        self.epochs, self.val_every = cfg.epochs, cfg.val_every
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.opt, self.optimizer = adamw(self.params, cfg, device)
        total = max(1, len(run.train_samples) // cfg.batch_size) * cfg.epochs  # as `_draws`
        self.sched = torch.optim.lr_scheduler.MultiStepLR(
            self.opt, milestones=[int(m * total) for m in cfg.milestones], gamma=cfg.gamma
        )
        self.scaler = grad_scaler(device, run.encoder.precision)
        self.loss_fn = CrossEntropy(ignore_index=CUBE_IGNORE_INDEX)
        self.curve: list[dict] = []
        self.best, self.best_state, self.best_epoch = -math.inf, None, -1
        self.steps, self.seen, self.losses = 0, 0, []
        self.unlabelled_steps = 0  # padding-only batches: no gradient, the schedule goes on
        self.rng_state = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state() if device.startswith("cuda") else None
        # where a run's time goes (seconds over epochs): the benchmark's budget against FLOP bounds
        self.phases = dict.fromkeys(
            ("batches_s", "forward_s", "backward_s", "optimizer_s", "validate_s"), 0.0
        ) | {"validations": 0}

    @contextlib.contextmanager
    def _own_rng(self):
        torch.set_rng_state(self.rng_state)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state(self.cuda_rng)
        yield
        self.rng_state = torch.get_rng_state()
        if self.cuda_rng is not None:
            self.cuda_rng = torch.cuda.get_rng_state()

    def _validate(self, epoch: int) -> float:
        t = time.perf_counter()
        cm = self.validate_fn()
        self.phases["validate_s"] += time.perf_counter() - t
        self.phases["validations"] += 1
        m = metrics_from_confusion(cm, self.run.class_names)
        loss = float(np.mean(self.losses)) if self.losses else None
        self.curve.append({"epoch": epoch, "mIoU": m["mIoU"], "mF1": m["mF1"], "loss": loss})
        if m["mIoU"] > self.best or self.best_state is None:  # strictly better, as the reference
            self.best, self.best_epoch = m["mIoU"], epoch
            self.best_state = copy.deepcopy(
                {k: v.detach().cpu() for k, v in self.module.state_dict().items()}
            )
        return m["mIoU"]

    def epoch(self, epoch: int) -> None:
        """Validate if due, then train one epoch."""
        with self._own_rng():
            val = self._validate(epoch) if epoch % self.val_every == 0 else None
            self._train(epoch)
        loss = float(np.mean(self.losses)) if self.losses else None
        self._publish(epoch=epoch + 1, loss=loss, val_mIoU=val)

    def _train(self, epoch: int) -> None:
        self.module.train()
        self.losses = []
        ph, clock = self.phases, time.perf_counter
        t = clock()
        for inputs, target in self.batches(epoch):
            ph["batches_s"] += clock() - t
            target = target.to(self.device).long()
            self.seen += int(target.shape[0])
            self.steps += 1
            if not bool((target != CUBE_IGNORE_INDEX).any()):  # its mean loss: 0/0 = NaN
                self.sched.step()
                self.unlabelled_steps += 1
                t = clock()
                continue
            t = clock()
            with (
                autocast(self.device, self.run.encoder.precision),
                deterministic_attention(self.device),
            ):
                logits = self.forward(inputs)
            loss = self.loss_fn(logits.float(), target)
            if not torch.isfinite(loss):
                raise NonFiniteLoss(
                    f"run {self.run.label}: non-finite loss ({loss.item()}) at epoch {epoch}, step"
                    f" {self.steps - 1}"
                )
            t1 = clock()
            self.scaler.scale(loss).backward()
            t2 = clock()
            self.scaler.step(self.opt)
            self.scaler.update()
            # gradients freed once used: a ViT-L fine-tune's 1.4 GB of them then serve the next
            # forward's activations (or a validation's) instead of fresh pages (second forward
            # 3.9-4.1 -> 2.1-3.2 s, peak RSS 0.3-1.5 GB lower, bare process)
            self.opt.zero_grad(set_to_none=True)
            self.sched.step()
            t3 = clock()
            ph["forward_s"] += t1 - t
            ph["backward_s"] += t2 - t1
            ph["optimizer_s"] += t3 - t2
            self.losses.append(loss.detach().item())
            t = clock()

    def finish(self) -> None:
        """The validation after the last epoch (the best state may be the last one), published."""
        with self._own_rng():
            val = self._validate(self.epochs)
        self._publish(epoch=self.epochs, loss=None, val_mIoU=val, best=self.best, done=True)

    def _publish(self, **event) -> None:
        run = {"run": self.run.run_id, "label": self.run.label}
        epoch = {"epoch": event.pop("epoch"), "epochs": self.epochs}
        publish(run | epoch | event | {"t": time.time()})


def _draws(rng: np.random.Generator, pool: np.ndarray, bs: int):
    """An epoch's batches: drop_last as the reference; a lone sample twice (BatchNorm)."""
    order = rng.permutation(pool)
    for b in range(max(1, pool.size // bs)):
        chosen = order[b * bs : (b + 1) * bs] if pool.size >= bs else order
        yield np.repeat(chosen, 2) if chosen.size == 1 else chosen


def frozen_trainer(run: SegRun, device: str, train: FeatureSplit, val: FeatureSplit) -> Trainer:
    """A decoder on cached features: epoch e reads crop e mod K of each training sample."""
    module, _ = build_model(run, device)
    rng = np.random.default_rng(run.seed)
    S, bs, K = run.encoder.input_size, run.recipe.batch_size, train.per
    pos = np.searchsorted(train.sample_of_pos, np.asarray(run.train_samples))
    val_pos = np.arange(int(val.attrs["n_items"]) // val.per)[: run.recipe.max_val_samples]

    def batches(epoch):
        for chosen in _draws(rng, pos, bs):
            crop = epoch % K
            if pos.size == 1:  # the sample's two copies: two crops
                crop = np.where(np.arange(chosen.size) % 2 == 1, (epoch + 1) % K, crop)
            arrays, labels = train.take(np.sort(chosen * K + crop))
            feats = [_fmt(torch.from_numpy(a).float().to(device), run) for a in arrays]
            yield feats, torch.from_numpy(labels)

    return Trainer(
        run,
        module,
        device,
        batches,
        lambda feats: module(feats, (S, S)),
        lambda: eval_feature_tiles(module, run, val, val_pos, device),
    )


def finetune_trainer(run: SegRun, device: str) -> Trainer:
    """Encoder and decoder on random crops read from the cube, a batch ahead."""
    module, _ = build_model(run, device)
    rng = np.random.default_rng(run.seed)
    S, bs = run.encoder.input_size, run.recipe.batch_size
    train_idx = np.asarray(run.train_samples)
    val_idx = np.asarray(run.val_samples)[: run.recipe.max_val_samples]
    side = max(run.tile, S)

    def crops():
        for chosen in _draws(rng, train_idx, bs):
            chosen = np.sort(chosen)
            image, label = read_dense(run.cube_url, chosen)
            x, lab = pad_to(run.inputs.apply(image), label, S)
            corners = rng.integers(0, side - S + 1, size=(2, chosen.size)).T  # (y, x) per sample
            cuts = [(j, slice(y, y + S), slice(x0, x0 + S)) for j, (y, x0) in enumerate(corners)]
            xb = torch.stack([x[j, :, ys, xs] for j, ys, xs in cuts])
            yield xb, torch.from_numpy(np.stack([lab[j, ys, xs] for j, ys, xs in cuts]))

    return Trainer(
        run,
        module,
        device,
        lambda epoch: ((_fmt(xb.to(device), run), lb) for xb, lb in prefetched(crops())),
        module,
        lambda: eval_cube_tiles(module, run, val_idx, device),
    )


def _trainers(runs: list[SegRun], device: str) -> list[Trainer]:
    """One trainer per run; frozen runs share the cache's splits, read once."""
    if runs[0].trains_encoder:
        return [finetune_trainer(r, device) for r in runs]
    url, budget = runs[0].cache.url, runs[0].recipe.cache_in_memory_mb
    train, val = (FeatureSplit.open(url, s, budget) for s in ("train", "val"))
    return [frozen_trainer(r, device, train, val) for r in runs]


def _trained(t: Trainer, device: str, common: dict) -> dict[str, Any]:
    """One run's result of a fit task."""
    enc = t.module.encoder if t.run.trains_encoder else get_encoder(t.run.encoder, device)
    seen = t.seen / max(common["train_s"], 1e-9)
    return (
        {
            "val_curve": t.curve,
            "best_epoch": t.best_epoch,
            "steps": t.steps,
            "unlabelled_steps": t.unlabelled_steps,
            "train_samples_per_s": seen,
            "optimizer": t.optimizer,
            "trainable_params": int(sum(p.numel() for p in t.params)),
            "encoder_params": int(sum(p.numel() for p in enc.parameters())),
        }
        | common
        | {"phases": {k: round(v, 4) for k, v in t.phases.items()} | common["phases"]}
    )


@task_boundary
def fit(task: FitTask) -> list[dict[str, Any]]:
    """Trains the group's runs on one worker, each best state into its run dir."""
    t0 = time.perf_counter()
    runs = task.runs
    with torch_task(runs[0].recipe.threads) as (device, threads), peak_memory(device) as peak:
        trainers = _trainers(runs, device)
        built = time.perf_counter()
        failed: dict[int, dict] = {}  # a run that fails (diverges) leaves the group
        for epoch in range(max(t.epochs for t in trainers)):
            for i, t in enumerate(trainers):
                if epoch < t.epochs and i not in failed:
                    try:
                        t.epoch(epoch)
                    except (NonFiniteLoss, UserError) as e:
                        failed[i] = failure(e)
        written = 0.0
        for i, t in enumerate(trainers):
            if i not in failed:
                t.finish()
                w0 = time.perf_counter()
                save_state(t.best_state, t.run.checkpoint)
                written += time.perf_counter() - w0
        elapsed = time.perf_counter() - t0
        peak.stop()  # this task's own peak: training and validation of every run in it
        common = {
            "train_s": elapsed,
            "setup_s": built - t0,
            "peak_memory_mb": peak.mb,
            "peak_memory_scope": peak.scope,
            "device": device,
            "threads": [threads],
            "decoders_in_task": len(trainers),
            "phases": {"checkpoint_write_s": round(written, 4)},
        }
        return [failed.get(i) or _trained(t, device, common) for i, t in enumerate(trainers)]


@task_boundary
def test_block(task: TestTask) -> TileConfusions:
    """Per-tile confusion matrices of the best state on a block of test tiles."""
    run = task.run
    with torch_task(run.recipe.threads) as (device, _):
        module, _ = build_model(run, device, pretrained=False)
        load_state(module, run.checkpoint)
        kept: list = []
        if not run.trains_encoder:
            split = FeatureSplit.open(run.cache.url, "test")  # streamed
            eval_feature_tiles(module, run, split, np.asarray(task.positions), device, kept)
        else:
            eval_cube_tiles(module, run, np.asarray(task.samples), device, kept)
        preds, cms = zip(*kept)  # a block holds at least one tile
        if task.predictions_url:
            g = _store.open_group(task.predictions_url, "r+")
            g["pred"][slice(*task.pred_range)] = np.stack(preds)
        _store.make_durable(run.checkpoint)  # the record, written after every block, names it
        return TileConfusions(task.positions, np.stack(cms))
