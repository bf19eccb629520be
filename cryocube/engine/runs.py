"""Runs: (model, cube, protocol, fraction, seed) planned into self-contained task inputs, keyed by a
content hash, with one JSON record each. A run whose record exists is never recomputed.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import numpy as np

from .. import __version__
from ..catalog import Band
from ..cube import COMPLETE_ATTR, as_text, open_cube
from ..errors import UserError
from .data import InputMap
from .protocols import TrainConfig, get_protocol, stratified_subset

RESULTS_FILE = "results.jsonl"


@dataclass(frozen=True)
class RunSpec:
    model: str
    cube: str
    protocol: str = "frozen"
    fraction: float | None = None  # None: the protocol's default
    seed: int = 0


@dataclass
class CubeInfo:
    url: str
    dataset: str
    checksum: str
    tile: int
    bands: tuple[Band, ...]
    class_names: list[str]
    splits: np.ndarray
    strata: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    published_mean: np.ndarray
    published_std: np.ndarray
    storage_options: dict | None = None

    def samples(self, split: str) -> np.ndarray:
        return np.flatnonzero(self.splits == split)


def cube_info(url: str, storage_options: dict | None = None) -> CubeInfo:
    """Metadata of a complete cube (refuses incomplete ones before any work starts)."""
    ds = open_cube(url, storage_options)
    b = ds["band"]
    bands = tuple(
        Band(name=str(n), alias=str(a), role=str(r), wavelength_um=float(w), sensor=str(s), units=str(u),
             mean=float(pm), std=float(ps))
        for n, a, r, w, s, u, pm, ps in zip(b.values, ds["alias"].values, ds["role"].values, ds["wavelength_um"].values,
                                           ds["sensor"].values, ds["units"].values, ds["published_mean"].values,
                                           ds["published_std"].values)
    )
    return CubeInfo(
        url=url, dataset=str(ds.attrs["dataset"]), checksum=str(ds.attrs[COMPLETE_ATTR]["checksum"]),
        tile=int(ds.sizes["y"]), bands=bands, class_names=[str(c) for c in ds["class"].values],
        splits=as_text(ds["split"].values), strata=as_text(ds["stratum"].values),
        mean=ds["band_mean"].values.astype(float), std=ds["band_std"].values.astype(float),
        published_mean=ds["published_mean"].values.astype(float), published_std=ds["published_std"].values.astype(float),
        storage_options=storage_options,
    )


def derive_seed(*parts: Any) -> int:
    """A run's own seed from what defines it (so runs never share random streams by accident)."""
    return int(hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:8], 16)


@dataclass
class PlannedRun:
    spec: RunSpec
    run_id: str
    cube: CubeInfo
    kind: str  # "frozen" (decoder on cached features) | "finetune" (encoder + decoder on the cube)
    mode: str
    fraction: float
    input_size: int
    inputs: InputMap
    train_samples: np.ndarray
    weights: str | None
    config: TrainConfig
    run_seed: int
    model_name: str

    @property
    def label(self) -> str:
        return f"{self.spec.model}/{self.cube.dataset}/{self.spec.protocol}@{self.fraction:g}/seed{self.spec.seed}"


def input_map(cube: CubeInfo, index: list[int], normalization: str) -> InputMap:
    if normalization == "published":
        mean, std = cube.published_mean, cube.published_std
    elif normalization == "cube":
        mean, std = cube.mean, cube.std
    else:
        raise UserError(f"normalization must be 'cube' or 'published', not {normalization!r}")
    bad = [cube.bands[i].name for i in range(len(cube.bands)) if not np.isfinite(mean[i]) or not std[i] > 0]
    if bad:
        raise UserError(f"{cube.url}: bands {bad} have no usable {normalization} mean/std (empty train split or a constant band?)")
    return InputMap(tuple(int(i) for i in index), tuple(map(float, mean)), tuple(map(float, std)))


def plan_run(spec: RunSpec, cube: CubeInfo, cfg: TrainConfig) -> PlannedRun:
    """Check that the model fits the cube and fix everything the run's tasks need."""
    from ..models import BandMatchError, match_bands, model_spec

    proto = get_protocol(spec.protocol)
    mspec = model_spec(spec.model)
    fraction = proto.fraction if spec.fraction is None else float(spec.fraction)
    if not 0 < fraction <= 1:
        raise UserError(f"{spec.model}/{cube.dataset}: fraction must be in (0, 1], got {fraction}")
    mode = proto.band_mode
    try:
        match = match_bands(mspec, cube.bands, mode)  # raises when nothing fits
    except BandMatchError:
        # SAR-only cube, optical-only encoder: the benchmark feeds SAR as RGB (cross-sensor rule)
        if mode != "protocol" or any(b.role == "optical" for b in cube.bands):
            raise
        mode = "cross_sensor"
        match = match_bands(mspec, cube.bands, mode)
    # encoders that take the whole tile (U-Net, RAMEN) get it padded to a multiple of 32 (GLD: 300 -> 320)
    size = cfg.input_size or mspec.input_size or -(-cube.tile // 32) * 32
    for split in ("train", "val", "test"):
        if not cube.samples(split).size:
            raise UserError(f"{cube.url}: split {split!r} is empty; {spec.model} cannot be trained/evaluated on it")
    kind = "finetune" if (proto.trains_encoder or not mspec.pretrained) else "frozen"
    train_all = cube.samples("train")
    subset = train_all[stratified_subset(cube.strata[train_all], fraction, derive_seed("subset", cube.checksum, fraction, spec.seed))]
    weights = cfg.encoder_weights.get(spec.model)
    ident = {"model": spec.model, "cube": cube.checksum, "protocol": spec.protocol, "fraction": fraction, "seed": spec.seed,
             "config": {k: v for k, v in cfg.as_dict().items() if k not in ("threads", "block_samples", "encoder_weights", "cache_in_memory_mb")},
             "weights": weights, "input_size": size, "v": 1}
    run_id = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return PlannedRun(
        spec=spec, run_id=run_id, cube=cube, kind=kind, mode=mode, fraction=fraction, input_size=int(size),
        inputs=input_map(cube, match.index, cfg.normalization), train_samples=subset, weights=weights, config=cfg,
        run_seed=derive_seed(spec.model, cube.dataset, spec.protocol, fraction, spec.seed), model_name=mspec.display_name,
    )


# -- records ----------------------------------------------------------------------------------------


def run_dir(out: str, run_id: str) -> str:
    return f"{out.rstrip('/')}/runs/{run_id}"


def load_record(out: str, run_id: str) -> dict | None:
    import fsspec

    path = f"{run_dir(out, run_id)}/record.json"
    fs, p = fsspec.core.url_to_fs(path)
    if not fs.exists(p):
        return None
    with fs.open(p, "r") as f:
        return json.load(f)


def versions() -> dict[str, str]:
    out = {"cryocube": __version__}
    for pkg in ("torch", "timm", "dask", "distributed", "zarr", "xarray", "numpy"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, np.generic):
        return _clean(v.item())
    return v


def write_record(out: str, record: dict) -> None:
    """record.json in the run dir (the cache) and one line appended to results.jsonl (+ Parquet copy)."""
    import fsspec

    record = _clean(record)
    record.setdefault("created", _dt.datetime.now(_dt.timezone.utc).isoformat())
    with fsspec.open(f"{run_dir(out, record['run_id'])}/record.json", "w", auto_mkdir=True) as f:
        json.dump(record, f, indent=1)
    _append(out, record)


def _append(out: str, record: dict) -> None:
    import fsspec

    path = f"{out.rstrip('/')}/{RESULTS_FILE}"
    fs, p = fsspec.core.url_to_fs(path)
    old = fs.cat_file(p).decode() if fs.exists(p) else ""
    with fs.open(p, "w") as f:  # rewrite (object stores have no append); records are small
        f.write(old + json.dumps(record) + "\n")
    write_parquet(out)


def read_results(out: str) -> list[dict]:
    import fsspec

    path = f"{out.rstrip('/')}/{RESULTS_FILE}"
    fs, p = fsspec.core.url_to_fs(path)
    if not fs.exists(p):
        return []
    return [json.loads(line) for line in fs.cat_file(p).decode().splitlines() if line.strip()]


def write_parquet(out: str) -> None:
    import pandas as pd

    recs = read_results(out)
    if not recs:
        return
    rows = []
    for r in recs:
        m = r.get("metrics") or {}
        rows.append({k: r.get(k) for k in ("run_id", "model", "model_name", "dataset", "protocol", "fraction", "seed", "status",
                                          "error", "samples_per_s", "peak_memory_mb", "device", "created")}
                    | {f"metric_{k}": m.get(k) for k in ("mIoU", "mF1", "oAcc", "mAcc")}
                    | {"record": json.dumps(r)})
    local = not ("://" in out and not out.startswith("file://"))
    path = os.path.join(out, "results.parquet") if local else f"{out.rstrip('/')}/results.parquet"
    pd.DataFrame(rows).to_parquet(path, index=False)
