"""Sample cubes (`kind: samples`): one whole image per sample and image-level targets instead of dense labels.

A reader that builds one (SSL4EO-downstream, interferograms) lists its items and everything known before
pixels are read in a `SamplePlan` (ids, per-sample image shape, task targets, extra coordinates and small
per-sample variables, attrs); this module creates the store, writes the images block by block on Dask
workers (`reader.read_sample(item, **read_kwargs)`, validated by `writer.check_image`), with progress
flags, per-sample digests of image, target and every small per-sample variable (`digest_vars`: the boxes
and answers of interferogram cubes), block moments, and the completion marker last, so a killed
conversion resumes block by block as tile cubes do, and `inspect --verify` checks every variable a task reads.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zarr

from .. import __version__
from .. import outputs, store as _store
from ..cube import (COMPLETE_ATTR, PLAN_ATTR, SCHEMA_VERSION, STATS, _text, check_unique_ids, block_digest, combine_stats, cube_checksum,
                    digest_rows, digest_vars, partial_stats, sample_digests)
from ..errors import UserError, task_boundary
from .base import ConvertError, Reader
from .writer import ConvertResult, check_image


@dataclass
class SamplePlan:
    """What the client knows of a sample cube before any pixel is written."""

    ids: list[str]
    shape: tuple[int, ...]  # one sample's image: (C, H, W), or (T, C, H, W) for multi-temporal cubes
    tasks: list[tuple[str, str]]  # (name, cls|regr) along the target's task axis
    target: np.ndarray  # (n, tasks) float32, NaN = no label
    attrs: dict[str, Any]
    fingerprint: dict[str, Any]  # options that define the cube besides ids, shape and targets
    time: tuple[str, ...] = ()  # names of the T axis (4-D shapes)
    published_mean: list[float] | None = None  # default: the catalog bands' mean/std
    published_std: list[float] | None = None
    coords: dict[str, tuple[tuple[str, ...], np.ndarray]] = field(default_factory=dict)  # extra coordinates
    data_vars: dict[str, tuple[tuple[str, ...], np.ndarray]] = field(default_factory=dict)  # small per-sample variables

    @property
    def n(self) -> int:
        return len(self.ids)

    @property
    def digest_vars(self) -> list[str]:
        """The per-sample variables the sample digests cover after image and target, in part order."""
        return sorted(k for k, (dims, _) in self.data_vars.items() if dims[0] == "sample")

    def key(self, block: int) -> str:
        extra = {k: (v[0], _fingerprint(v[1])) for k, v in sorted({**self.coords, **self.data_vars}.items())}
        return hashlib.sha256(json.dumps({"ids": self.ids, "shape": list(self.shape), "tasks": self.tasks,
                                          "target": np.nan_to_num(self.target, nan=-1e30).tolist(), "extra": extra,
                                          "options": self.fingerprint, "block": block, "schema": SCHEMA_VERSION},
                                         default=str, sort_keys=True).encode()).hexdigest()


def _fingerprint(a) -> Any:
    """Small variables as values; per-pixel ones (3-D and more, e.g. a deformation mask) as a digest of their bytes."""
    a = np.asarray(a)
    if a.ndim >= 3:
        return [a.dtype.str, list(a.shape), hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()]
    return a.tolist()


def _template(reader: Reader, plan: SamplePlan, block: int):
    import dask.array as da
    import xarray as xr

    spec = reader.spec
    n, c, k = plan.n, len(spec.bands), len(plan.tasks)
    nb = math.ceil(n / block)
    parts = 2 + len(plan.digest_vars)  # image, target, extras
    dims = ("sample", "time", "band", "y", "x") if len(plan.shape) == 4 else ("sample", "band", "y", "x")
    mean = plan.published_mean or [b.mean for b in spec.bands]
    std = plan.published_std or [b.std for b in spec.bands]
    coords = {
        "source": ("sample", _text(plan.ids)),
        "sample_id": ("sample", check_unique_ids(plan.ids, "the raw samples", "rename the repeated samples")),
        "split": ("sample", _text(["all"] * n)),
        "task": ("task", _text([t for t, _ in plan.tasks])),
        "task_type": ("task", _text([t for _, t in plan.tasks])),
        "band": ("band", _text([b.name for b in spec.bands])),
        "alias": ("band", _text([b.alias for b in spec.bands])),
        "role": ("band", _text([b.role for b in spec.bands])),
        "wavelength_um": ("band", np.array([b.wavelength_um for b in spec.bands], dtype="float64")),
        "sensor": ("band", _text([b.sensor for b in spec.bands])),
        "units": ("band", _text([b.units for b in spec.bands])),
        "published_mean": ("band", np.array(mean, dtype="float64")),
        "published_std": ("band", np.array(std, dtype="float64")),
        **{f"band_{s}": ("band", np.full(c, np.nan)) for s in ("mean", "std", "min", "max")},
        **plan.coords,
    }
    if len(plan.shape) == 4:
        coords["time"] = ("time", _text(plan.time or [str(t) for t in range(plan.shape[0])]))
    ds = xr.Dataset(
        data_vars={
            "image": (dims, da.zeros((n, *plan.shape), dtype="float32", chunks=(1, *plan.shape))),
            "target": (("sample", "task"), plan.target.astype("float32")),
            "progress": (("block",), da.zeros((nb,), dtype="uint8", chunks=1)),
            "block_digest": (("block", "digest_byte"), da.zeros((nb, 4 * parts), dtype="uint8", chunks=(1, 4 * parts))),
            "block_stats": (("block", "stat", "band"), da.zeros((nb, len(STATS), c), dtype="float64", chunks=(1, len(STATS), c))),
            "sample_digest": (("sample", "part"), da.zeros((n, parts), dtype="uint32", chunks=(block, parts))),
            **plan.data_vars,
        },
        coords=coords,
        attrs={"dataset": spec.id, "title": spec.name, "description": spec.description, "licence": spec.licence,
               "layout": reader.layout.name, "kind": "samples", "schema_version": SCHEMA_VERSION,
               "converter": f"cryocube {__version__}", "block_samples": block, "digest_vars": plan.digest_vars,
               "created": _dt.datetime.now(_dt.timezone.utc).isoformat(),
               outputs.ZARR_MARKER: outputs.marker("cube", "convert"), **plan.attrs},
    )
    enc = {"image": {"chunks": (1, *plan.shape)}, "target": {"chunks": (block, max(1, k))},
           "sample_digest": {"chunks": (block, parts)}, "progress": {"chunks": (1,)},
           # small per-sample variables in blocks; maps (the deformation mask) one sample per chunk, as the image
           **{v: {"chunks": (block, *(max(1, d) for d in shp[1:])) if len(shp) < 3 else (1, *shp[1:])}
              for v in plan.digest_vars for shp in [np.shape(plan.data_vars[v][1])]}}
    return ds, enc


@task_boundary
def write_sample_block(task: dict[str, Any]) -> dict[str, Any]:
    """Read, check and write samples [s0, s0 + len(items)) with their digests; the progress flag last."""
    from ..cluster.runtime import tune_malloc

    t0 = time.perf_counter()
    tune_malloc()
    reader: Reader = task["reader"]
    s0, shape = task["s0"], tuple(task["shape"])
    imgs = []
    for sid, it in zip(task["ids"], task["items"]):
        img = np.asarray(reader.read_sample(it, **task["read_kwargs"]))
        if img.shape != shape:
            raise ConvertError(f"sample {sid}: image {img.shape}, the cube's samples are {shape}")
        if img.ndim == 4:
            names = task["time"] or [str(t) for t in range(img.shape[0])]
            img = np.stack([check_image(img[t], reader.spec, f"sample {sid} ({names[t]})")[0] for t in range(img.shape[0])])
        else:
            img = check_image(img, reader.spec, f"sample {sid}")[0]
        imgs.append(img.astype(np.float32, copy=False))
    images = np.stack(imgs)
    g = _store.open_group(task["out"], "r+")
    targets = np.asarray(g["target"][s0 : s0 + len(imgs)])
    extras = [np.asarray(g[v][s0 : s0 + len(imgs)]) for v in digest_vars(g)]
    digests = sample_digests(images, targets, *extras)
    c, h, w = images.shape[-3:]
    flat = images.reshape(-1, c, h, w)  # every pixel of every time step counts (sample cubes have no split)
    stats = partial_stats(flat, np.zeros((flat.shape[0], h, w), np.int8), np.ones(flat.shape[0], bool))
    with zarr.config.set({"array.write_empty_chunks": True}):
        g["image"][s0 : s0 + len(imgs)] = images
        g["sample_digest"][s0 : s0 + len(imgs)] = digests
        g["block_digest"][task["block"]] = block_digest(digests, images[0].nbytes, targets[0].nbytes,
                                                        *(digest_rows(x)[0].nbytes for x in extras))
        g["block_stats"][task["block"]] = stats
        g["progress"][task["block"]] = 1
    return {"samples": len(imgs), "read_bytes": int(images.nbytes), "seconds": time.perf_counter() - t0}


def convert_samples(reader: Reader, items: list, plan: SamplePlan, raw: str, out: str, client, block: int, overwrite: bool,
                    progress: bool, read_kwargs: dict | None = None) -> ConvertResult:
    """Create (or resume) the sample cube of `plan` at `out`; `items[i]` is what `reader.read_sample` reads for sample i."""
    from ..progress import gather

    t0 = time.perf_counter()
    fingerprint = plan.key(block)
    if _store.exists(out):
        g = _store.open_group(out, "r+")
        if overwrite or g.attrs.get(PLAN_ATTR) != fingerprint:
            if not overwrite and (PLAN_ATTR in g.attrs or COMPLETE_ATTR in g.attrs):
                raise UserError(f"{out}: a cube from different inputs or options is already there; pass --overwrite to replace it")
            _store.remove(out)
    if not _store.exists(out):
        ds, enc = _template(reader, plan, block)
        ds.attrs["raw_source"] = raw
        try:
            ds.to_zarr(_store.make_store(out), mode="w", compute=False, zarr_format=3, encoding=enc, consolidated=True)
        except (PermissionError, OSError) as e:
            raise UserError(f"{out}: cannot write the cube: {e}") from None
        g = _store.open_group(out, "r+")
        g.attrs[PLAN_ATTR] = fingerprint  # only now is the store a resumable cube
        zarr.consolidate_metadata(g.store)
    g = _store.open_group(out, "r+")
    nb = math.ceil(plan.n / block)
    skipped = len(plan.attrs.get("skipped_samples") or ())  # bad raw samples left out with --on-error skip
    if COMPLETE_ATTR in g.attrs:
        return ConvertResult(out, plan.n, 0, nb, 0, time.perf_counter() - t0, dict(g.attrs[COMPLETE_ATTR]), skipped)
    done = np.asarray(g["progress"][:]).astype(bool)
    jobs = [{"reader": reader, "items": items[b * block : (b + 1) * block], "ids": plan.ids[b * block : (b + 1) * block],
             "s0": b * block, "block": b, "out": out, "shape": plan.shape, "time": list(plan.time),
             "read_kwargs": dict(read_kwargs or {})} for b in range(nb) if not done[b]]
    futs = client.map(write_sample_block, jobs, pure=False, key=[f"cryocube-samples-{j['block']}-{time.time_ns()}" for j in jobs])
    results = gather(futs, f"convert {reader.spec.id}", sum(len(j["items"]) for j in jobs), progress, lambda i, r: r["samples"])
    stats = combine_stats(np.asarray(g["block_stats"][:]))
    for k in ("mean", "std", "min", "max"):
        g[f"band_{k}"][:] = stats[k]
    marker = {"time": _dt.datetime.now(_dt.timezone.utc).isoformat(), "n_samples": plan.n,
              "checksum": cube_checksum(np.asarray(g["block_digest"][:])), "schema_version": SCHEMA_VERSION}
    g.attrs["statistics_split"] = "all"
    g.attrs[COMPLETE_ATTR] = marker  # last
    zarr.consolidate_metadata(g.store)
    return ConvertResult(out, plan.n, len(jobs), nb, sum(r["read_bytes"] for r in results), time.perf_counter() - t0, marker,
                         skipped)
