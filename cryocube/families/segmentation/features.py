"""The frozen-encoder feature cache, shared by every epoch, validation and seed of its runs."""

from __future__ import annotations

import concurrent.futures
import functools
import time
from typing import Any

import numpy as np
import torch

from ... import store as _store
from ...cluster.runtime import task_boundary, torch_task
from ...cube import read_dense
from ...errors import DamagedCacheError
from ...precision import autocast
from ..encoders import extract_batch_size, get_encoder, window_offsets
from .data import crop_offsets, pad_to
from .recipe import SegmentationRecipe
from .work import CacheSpec, ExtractTask

COMPLETE = "cryocube_features_complete"
MISSING_LABEL = -2  # fill value of cached labels: a chunk that was never written (or was lost)


def create_split(cache: CacheSpec, split: str, samples: np.ndarray, feature_shapes) -> dict:
    """Creates or reopens a split's arrays; returns its items per sample and held samples."""
    g = _store.open_group(cache.url, "a")
    if split in g and COMPLETE in g[split].attrs:
        n_items = int(g[split]["sample"].shape[0])
        return {"complete": True, "n_items": n_items, "held": np.ones(samples.size, dtype=bool)}
    S = cache.encoder.input_size
    per = cache.crops_per_sample if split == "train" else len(window_offsets(cache.tile, S))
    n_items = samples.size * per
    if split in g and g[split].attrs.get("n_items") == n_items and "held" in g[split]:
        sg = g[split]
    else:  # new, or a partial split of the block layout (before per-sample flags): started again
        if split in g:
            del g[split]
        if split == "train":
            offsets = crop_offsets(samples.size, per, cache.tile, S, cache.seed)
        else:
            offsets = np.tile(window_offsets(cache.tile, S), (samples.size, 1))
        sg = g.create_group(split)
        sg.create_array("sample", data=np.repeat(samples.astype(np.int64), per))
        sg.create_array("offset", data=offsets)
        arrays = [(f"f{i}", s, cache.feature_dtype, np.nan) for i, s in enumerate(feature_shapes)]
        for name, shape, dtype, fill in [*arrays, ("label", (S, S), "int16", MISSING_LABEL)]:
            full, chunks = (n_items, *shape), (1, *shape)
            sg.create_array(name, shape=full, chunks=chunks, dtype=dtype, fill_value=fill)
        # one chunk per sample: tasks writing different samples never share a flag's chunk
        sg.create_array(
            "held", shape=(max(samples.size, 1),), chunks=(1,), dtype="uint8", fill_value=0
        )
        levels = len(feature_shapes)
        sg.attrs.update(
            dict(n_items=n_items, per_sample=per, tile=cache.tile, input_size=S, levels=levels)
        )
    held = np.asarray(sg["held"][: samples.size]).astype(bool)
    return {"complete": False, "n_items": n_items, "per": per, "held": held}


def extraction_tasks(
    cache: CacheSpec,
    split: str,
    samples: np.ndarray,
    needed: np.ndarray,
    plan: dict,
    recipe: SegmentationRecipe,
) -> list[ExtractTask]:
    """Tasks of up to `block_samples` samples for the `needed` positions the split lacks."""
    if plan["complete"]:
        return []
    todo = np.asarray(needed, dtype=np.int64)
    todo = np.unique(todo[~plan["held"][todo]])
    bs, batch, threads = recipe.block_samples, recipe.extract_batch, recipe.threads
    return [
        ExtractTask(cache, split, samples[pos], plan["per"], pos, batch, threads)
        for pos in (todo[b : b + bs] for b in range(0, todo.size, bs))
    ]


def _selection(items: np.ndarray):
    """A slice for one contiguous range (a cheaper indexer), else the index array."""
    if items.size and items[-1] - items[0] + 1 == items.size:
        return slice(int(items[0]), int(items[-1]) + 1)
    return items


def _windows(cache: CacheSpec, samples: np.ndarray, offsets: np.ndarray, per: int):
    """Read, normalise, pad and cut the items of `samples` (a chunk of a block); last: seconds."""
    t0 = time.perf_counter()
    S = cache.encoder.input_size
    image, label = read_dense(cache.cube_url, samples)
    x, label = pad_to(cache.inputs.apply(image), label, S)
    xs, ys = [], []
    for j in range(samples.size):
        for k in range(per):
            oy, ox = offsets[j * per + k]
            xs.append(x[j, :, oy : oy + S, ox : ox + S])
            ys.append(label[j, oy : oy + S, ox : ox + S])
    return torch.stack(xs), np.stack(ys), int(image.nbytes), time.perf_counter() - t0


def _windows_threaded(
    cache: CacheSpec, samples: np.ndarray, offsets: np.ndarray, per: int, readers: int
):
    """`_windows` on `readers` threads (zarr decompresses without the GIL): one read 670 items/s on
    the H200 machine, 3 % of what its encoder takes (docs/performance.md)."""
    parts = [
        i for i in np.array_split(np.arange(samples.size), min(readers, samples.size)) if i.size
    ]
    if len(parts) <= 1:
        return _windows(cache, samples, offsets, per)
    t0 = time.perf_counter()

    def read(i: np.ndarray):
        return _windows(cache, samples[i], offsets[i[0] * per : (i[-1] + 1) * per], per)

    with concurrent.futures.ThreadPoolExecutor(len(parts)) as pool:
        xs, ys, nbytes, _ = zip(*pool.map(read, parts))
    return torch.cat(xs), np.concatenate(ys), sum(nbytes), time.perf_counter() - t0


def read_threads(device: str, threads: int) -> int:
    """Reader threads: a GPU leaves the host's cores free to read, a CPU runs the encoder."""
    return max(1, min(8, threads)) if device.startswith("cuda") else 1


def _chunks(task: ExtractTask, offsets: np.ndarray, chunk: int, readers: int, ph: dict):
    """(first sample, windows, labels, bytes) per chunk, the next one read meanwhile."""
    per, n = task.per, task.samples.size

    def read(s0: int):
        sel = slice(s0, s0 + chunk)
        return _windows_threaded(
            task.cache, task.samples[sel], offsets[s0 * per : (s0 + chunk) * per], per, readers
        )

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        nxt = pool.submit(read, 0)
        for s0 in range(0, n, chunk):
            w0 = time.perf_counter()
            x, y, nb, rs = nxt.result()
            ph["read_wait_s"] += time.perf_counter() - w0
            ph["read_s"] += rs
            if s0 + chunk < n:
                nxt = pool.submit(read, s0 + chunk)
            yield s0, x, y, nb


def _encode(enc, task: ExtractTask, x: torch.Tensor, batch: int, device: str, s0: int, chunk: int):
    """Each level's features of the windows `x`, batch by batch; non-finite features are refused.
    A short last batch is padded with zeros to `batch`: AMX's bf16 kernels round by the batch's
    size (not by a row's place or neighbours), and a sample's cached features must not depend on
    which block extracted it (a partial cache filled by several runs equals a fresh one)."""
    cache = task.cache
    outs = []
    with torch.inference_mode(), autocast(device, cache.encoder.precision):
        for b in range(0, x.shape[0], batch):
            xb = x[b : b + batch]
            m = xb.shape[0]
            if m < batch:
                xb = torch.cat([xb, xb.new_zeros(batch - m, *xb.shape[1:])])
            outs.append([f[:m].float().cpu().numpy().astype(cache.feature_dtype) for f in enc(xb)])
            if not all(np.isfinite(o).all() for o in outs[-1]):
                raise FloatingPointError(
                    f"{cache.encoder.model.id}: non-finite features for samples"
                    f" {task.samples[s0 : s0 + chunk].tolist()} of {cache.cube_url}"
                    f" (precision {cache.encoder.precision}; input range"
                    f" {float(x.min()):.3g}..{float(x.max()):.3g})"
                )
    return outs


@task_boundary
def extract_block(task: ExtractTask) -> dict[str, Any]:
    """Encodes one block of samples (the next chunk read meanwhile) and writes features."""
    t0 = time.perf_counter()
    cache, per = task.cache, task.per
    with torch_task(task.threads) as (device, threads):
        g = _store.open_group(cache.url, "r+")[task.split]
        positions = np.asarray(task.positions, dtype=np.int64)
        sel = _selection((positions[:, None] * per + np.arange(per)).ravel())  # items, in order
        offsets = np.asarray(g["offset"].oindex[sel])
        enc = get_encoder(cache.encoder, device)
        batch = extract_batch_size(enc, cache.encoder, device, task.batch)
        chunk = max(1, batch // per)
        outs: list[list[np.ndarray]] = []
        labels, bytes_in = [], 0
        # read_s overlaps encode_s
        ph = {"read_s": 0.0, "read_wait_s": 0.0, "encode_s": 0.0, "write_s": 0.0}
        for s0, x, y, nb in _chunks(task, offsets, chunk, read_threads(device, threads), ph):
            bytes_in += nb
            labels.append(y)
            x = x.pin_memory().to(device, non_blocking=True) if device.startswith("cuda") else x
            e0 = time.perf_counter()
            outs += _encode(enc, task, x, batch, device, s0, chunk)
            ph["encode_s"] += time.perf_counter() - e0
        w0 = time.perf_counter()
        for lvl in range(len(outs[0])):
            g[f"f{lvl}"].oindex[sel] = np.concatenate([o[lvl] for o in outs])
        g["label"].oindex[sel] = np.concatenate(labels)
        # last: a sample is held only once all its items are written
        g["held"].oindex[_selection(positions)] = np.ones(positions.size, "uint8")
        ph["write_s"] = time.perf_counter() - w0
        return {
            "items": sum(o[0].shape[0] for o in outs),
            "seconds": time.perf_counter() - t0,
            "bytes_in": bytes_in,
            "threads": [threads],
            "device": device,
            "phases": ph,
        }


def settle(cache: CacheSpec, split: str, needed: np.ndarray, forwards: int) -> bool:
    """Marks a split complete once every sample is held; a `needed` one missing raises."""
    g = _store.open_group(cache.url, "r+")[split]
    if COMPLETE in g.attrs:
        return True
    n_samples = int(g.attrs["n_items"]) // int(g.attrs["per_sample"])
    held = np.asarray(g["held"][:n_samples]).astype(bool)
    missing = np.asarray(needed, dtype=np.int64)[~held[needed]]
    if missing.size:
        raise RuntimeError(
            f"{cache.url}/{split}: features of {missing.size} samples missing after extraction"
            f" (first: position {int(missing[0])})"
        )
    if held.all():
        g.attrs[COMPLETE] = {"time": time.time(), "encoder_items": forwards}
        return True
    return False


class FeatureSplit:
    """One split's cached features, read once per task where they fit `budget_mb`."""

    def __init__(self, group, budget_mb: float, where: str):
        self.group, self.where, self.attrs = group, where, group.attrs
        self.levels = int(group.attrs["levels"])
        self.per = int(group.attrs["per_sample"])
        names = [f"f{i}" for i in range(self.levels)] + ["label"]
        size = sum(group[n].nbytes for n in names)
        self.arrays, self.held = None, None  # held: the held samples' items (None: all)
        if COMPLETE not in group.attrs and "held" in group:
            n_samples = int(group.attrs["n_items"]) // self.per
            self.held = np.repeat(np.asarray(group["held"][:n_samples]).astype(bool), self.per)
        if size <= budget_mb * 2**20:
            self.arrays = {n: self._read(n, None) for n in names}
            at = None if self.held is None else np.flatnonzero(self.held)
            sel = slice(None) if at is None else at
            feats = [self.arrays[f"f{i}"][sel] for i in range(self.levels)]
            self._check(feats, self.arrays["label"][sel], at)

    @classmethod
    def open(cls, url: str, split: str, budget_mb: float = 0) -> "FeatureSplit":
        """The split of the cache at `url` (budget 0: streamed)."""
        return cls(_store.open_group(url, "r")[split], budget_mb, f"{url}/{split}")

    @functools.cached_property
    def sample_of_pos(self) -> np.ndarray:
        """Each position's cube sample (sorted), read once for all the runs sharing the split."""
        return np.asarray(self.group["sample"][:: self.per])

    def _read(self, name: str, items: np.ndarray | None):
        try:
            a = self.group[name]
            return np.asarray(a[:] if items is None else a.oindex[_selection(items)])
        except Exception as e:  # a truncated chunk fails in its codec
            raise DamagedCacheError(
                f"{self.where}: feature cache chunk of {name} cannot be read ({type(e).__name__}:"
                f" {e}); remove the cache folder and run again to rebuild it"
            ) from None

    def _check(self, feats: list[np.ndarray], labels: np.ndarray, items: np.ndarray | None) -> None:
        bad_l = np.flatnonzero((labels == MISSING_LABEL).reshape(labels.shape[0], -1).any(axis=1))
        bad_f = np.flatnonzero(np.isnan(feats[0].reshape(feats[0].shape[0], -1)).any(axis=1))
        bad = np.union1d(bad_l, bad_f)
        if bad.size:
            it = int(bad[0] if items is None else items[bad[0]])
            raise DamagedCacheError(
                f"{self.where}: {bad.size} cached items (first: item {it}) were never written or"
                " are damaged; remove the cache folder and run again to rebuild it"
            )

    def take(self, items: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        """Features (per level) and labels of the given sorted item indices."""
        if self.held is not None and not self.held[items].all():
            it = int(items[~self.held[items]][0])
            raise DamagedCacheError(
                f"{self.where}: item {it} belongs to a sample the cache does not hold (never"
                " extracted); remove the cache folder and run again to rebuild it"
            )
        if self.arrays is not None:
            a = self.arrays
            return [a[f"f{i}"][items] for i in range(self.levels)], a["label"][items]
        feats = [self._read(f"f{i}", items) for i in range(self.levels)]
        labels = self._read("label", items)
        self._check(feats, labels, items)
        return feats, labels
