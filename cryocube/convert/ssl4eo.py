"""SSL4EO-S12-downstream (Embed2Scale / NeuCo-Bench): zipped Zarr v2 stores per location and modality
-> one multi-temporal *sample cube*.

Raw layout (options in the dataset catalog): `data/<modality>/part-XXXXXX/<id>.zarr.zip`, each a Zarr v2
group with variable `bands` of dims (sample, time, band, y, x) and shape (1, 4, C, H, W), the same id in
every modality folder; `labels/<task>__<cls|regr>.csv` with columns id,label (empty labels skipped).

The cube: `image(sample, time, band, y, x)` float32 (the modalities side by side on `band`, in the
catalog's band order), `target(sample, task)` float32 (NaN = no label), coordinates `source` (the id),
`split` ("all": the challenge has no split; probes draw their own), `task_type(task)`, `time`, and the
band coordinates of every cube (alias, role, sensor, both published statistics). `--shift-s2` adds the
+1000 DN offset of SSL4EO-S12 v1.1 to the S2 bands (the organisers' `shift_s2_channels`), and the
cube then carries the v1.1 statistics as its published ones. Blocks are written by Dask tasks with
progress flags and per-sample digests; the completion marker is written last, as for tile cubes.
"""
from __future__ import annotations

import csv
import datetime as _dt
import math
import os
import posixpath
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from .. import __version__
from .. import outputs, store as _store
from ..catalog import DatasetSpec
from ..cube import (COMPLETE_ATTR, PLAN_ATTR, SCHEMA_VERSION, STATS, block_digest, combine_stats, cube_checksum, partial_stats,
                    sample_digests)
from ..errors import UserError, task_boundary
from .base import ConvertError, Reader, register
from .writer import check_image

S2_OFFSET = 1000.0
SHIFTED_STATS = "ssl4eo_v11_shifted"
TASK_TYPES = {"cls": "cls", "classification": "cls", "regr": "regr", "regression": "regr"}


@dataclass(frozen=True)
class Location:
    """One location: its id and the URL of its store per modality."""

    id: str
    files: tuple[tuple[str, str], ...]  # (modality, url)


def strip_suffix(name: str) -> str:
    for s in (".zarr.zip", ".zarr"):
        if name.endswith(s):
            return name[: -len(s)]
    return name


def read_label_csvs(folder: str, storage_options: dict | None = None) -> dict[str, tuple[str, dict[str, float]]]:
    """A NeuCo-Bench labels folder: task -> (cls|regr, {id: label}) from <task>__<cls|regr>.csv (id,label;
    empty labels skipped; ids lose their .zarr.zip/.zarr suffix)."""
    import fsspec

    fs, base = fsspec.core.url_to_fs(folder, **_store.options_for(folder, storage_options))
    out = {}
    for p in sorted(fs.glob(posixpath.join(base.rstrip("/"), "*.csv"))):
        stem = posixpath.basename(p)[:-4]
        task, _, kind = stem.rpartition("__")
        if not task or kind.lower() not in TASK_TYPES:
            raise ConvertError(f"{p}: a label file is named <task>__<cls|regr>.csv, not {posixpath.basename(p)}")
        with fs.open(p, "r") as f:
            rows = list(csv.DictReader(f))
        if rows and not {"id", "label"} <= set(rows[0]):
            raise ConvertError(f"{p}: needs columns id,label, found {sorted(rows[0])}")
        values = {}
        for r in rows:
            if str(r["label"]).strip() == "":
                continue
            try:
                values[strip_suffix(str(r["id"]))] = float(r["label"])
            except ValueError:
                raise ConvertError(f"{p}: label {r['label']!r} of id {r['id']} is not a number") from None
        out[task] = (TASK_TYPES[kind.lower()], values)
    return out


@register
class SSL4EOReader(Reader):
    name = "ssl4eo_zarr_zip"
    options_doc = "modalities (folders under data/, in band order), variable"
    writes_own_cube = True

    @property
    def modalities(self) -> list[str]:
        return [str(m) for m in self.option("modalities", kind=list)]

    @property
    def variable(self) -> str:
        return self.option("variable", "bands", str)

    def band_slices(self) -> dict[str, slice]:
        """Where each modality's bands sit on the cube's band axis (the catalog's `sensor` field)."""
        out, i = {}, 0
        for m in self.modalities:
            n = sum(1 for b in self.spec.bands if b.sensor == m)
            if n == 0:
                raise ConvertError(f"{self.where}: modality {m!r} has no band in the catalog (bands' sensor field)")
            out[m] = slice(i, i + n)
            i += n
        if i != len(self.spec.bands):
            raise ConvertError(f"{self.where}: the catalog's bands are not grouped by modality in the order {self.modalities}")
        return out

    def detect(self, root: str) -> bool:
        return all(self.isdir(_store.join(root, "data", m)) for m in self.modalities)

    def scan(self, root: str, map_headers=None) -> list[Location]:
        fs, base = self.fs(root)
        by_mod: dict[str, dict[str, str]] = {}
        proto = root.split("://")[0] + "://" if _store.is_remote(root) else ""
        for m in self.modalities:
            paths = fs.glob(posixpath.join(base.rstrip("/"), "data", m, "*", "*.zarr.zip"))
            by_mod[m] = {strip_suffix(posixpath.basename(p)): (p if p.startswith(proto) else proto + p) for p in sorted(paths)}
        if not any(by_mod.values()):
            raise ConvertError(f"{root}: no SSL4EO-S12-downstream stores (expected data/<{'|'.join(self.modalities)}>/part-*/<id>.zarr.zip)")
        ids = sorted(set().union(*by_mod.values()))
        for m, found in by_mod.items():
            lonely = [i for i in ids if i not in found]
            if lonely:
                raise ConvertError(f"{root}: {len(lonely)} location(s) have no {m} store, e.g. {lonely[0]} "
                                   f"(expected data/{m}/part-*/{lonely[0]}.zarr.zip)")
        return [Location(i, tuple((m, by_mod[m][i]) for m in self.modalities)) for i in ids]

    def labels(self, root: str) -> dict[str, tuple[str, dict[str, float]]]:
        """task -> (cls|regr, {id: label}) from labels/<task>__<type>.csv (empty labels skipped)."""
        return read_label_csvs(_store.join(root, "labels"), self.storage_options)

    def _open(self, url: str):
        if not _store.is_remote(url):
            return zarr.storage.ZipStore(_store.local_path(url), mode="r"), None
        tmp = tempfile.NamedTemporaryFile(suffix=".zarr.zip", delete=False)
        tmp.write(self.open_bytes(url))
        tmp.close()
        return zarr.storage.ZipStore(tmp.name, mode="r"), tmp.name

    def read(self, item: Location, window=None, shift_s2: bool = False) -> tuple[np.ndarray, None]:
        """(time, band, y, x) float32 of one location, modalities side by side in the catalog's band order."""
        parts = []
        slices = self.band_slices()
        for m, url in item.files:
            st, tmp = self._open(url)
            try:
                g = zarr.open_group(st, mode="r")
                if self.variable not in g:
                    raise ConvertError(f"{url}: no variable {self.variable!r} (found {sorted(g.keys())})")
                a = np.asarray(g[self.variable][:], dtype=np.float32)
            except ConvertError:
                raise
            except Exception as e:  # a truncated zip or chunk
                raise ConvertError(f"{url}: cannot read ({type(e).__name__}: {e}); the file is corrupt or truncated") from None
            finally:
                st.close()
                if tmp:
                    os.unlink(tmp)
            if a.ndim != 5 or a.shape[0] != 1:
                raise ConvertError(f"{url}: {self.variable} has shape {a.shape}, expected (1, time, band, y, x)")
            want = slices[m].stop - slices[m].start
            if a.shape[2] != want:
                raise ConvertError(f"{url}: {a.shape[2]} {m} bands, the catalog lists {want}")
            a = a[0]
            if shift_s2 and m.startswith("s2"):
                a = a + S2_OFFSET
            parts.append(a)
        shapes = {p.shape[::2] for p in parts}
        if len(shapes) != 1:
            raise ConvertError(f"location {item.id}: modalities differ in time steps or size {[p.shape for p in parts]}")
        return np.concatenate(parts, axis=1), None

    def write(self, root, split, scene, image, raw_label=None, crs=None, transform=None) -> tuple[str, str]:
        """Sample data: one location's stores, one per modality ((time, band, y, x) in catalog band order)."""
        import xarray as xr

        paths = []
        for m, sl in self.band_slices().items():
            path = os.path.join(str(root), "data", m, "part-000000", f"{scene}.zarr.zip")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            arr = image[None, :, sl]
            dtype = np.float16 if m == "s1" else np.uint16
            ds = xr.Dataset({self.variable: (("sample", "time", "band", "y", "x"), arr.astype(dtype))})
            st = zarr.storage.ZipStore(path, mode="w")
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # zipfile warns about duplicate names of consolidated metadata
                ds.to_zarr(st, zarr_format=2, consolidated=True)
            st.close()
            paths.append(path)
        return paths[0], paths[0]

    def write_labels(self, root, tasks: dict[str, tuple[str, dict[str, float | None]]]) -> None:
        os.makedirs(os.path.join(str(root), "labels"), exist_ok=True)
        for task, (kind, values) in tasks.items():
            with open(os.path.join(str(root), "labels", f"{task}__{kind}.csv"), "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["id", "label"])
                for i, v in values.items():
                    w.writerow([i, "" if v is None else repr(float(v))])

    # -- the sample cube -------------------------------------------------------------------------
    def convert(self, raw: str, out: str, client, block_samples: int = 16, overwrite: bool = False, progress: bool = True,
                shift_s2: bool = False, **_) -> "SampleConvertResult":
        return convert_samples(self, raw, out, client, block_samples, overwrite, progress, shift_s2)


@dataclass
class SampleConvertResult:
    url: str
    n_samples: int
    blocks_written: int
    blocks_total: int
    read_bytes: int
    seconds: float
    marker: dict
    skipped: int = 0


def _template(spec: DatasetSpec, reader: SSL4EOReader, items: list[Location], tasks, T: int, H: int, shift_s2: bool,
              block: int, attrs: dict):
    import dask.array as da
    import xarray as xr

    from ..cube import _text

    n, c, k = len(items), len(spec.bands), len(tasks)
    nb = math.ceil(n / block)
    pub = spec.statistics.get(SHIFTED_STATS) if shift_s2 else None
    mean = [pub[b.name][0] if pub else b.mean for b in spec.bands]
    std = [pub[b.name][1] if pub else b.std for b in spec.bands]
    target = np.full((n, k), np.nan, dtype=np.float32)
    index = {it.id: i for i, it in enumerate(items)}
    for j, (_, (_, values)) in enumerate(tasks.items()):
        for i, v in values.items():
            if i in index:
                target[index[i], j] = v
    ds = xr.Dataset(
        data_vars={
            "image": (("sample", "time", "band", "y", "x"), da.zeros((n, T, c, H, H), dtype="float32", chunks=(1, T, c, H, H))),
            "target": (("sample", "task"), target),
            "progress": (("block",), da.zeros((nb,), dtype="uint8", chunks=1)),
            "block_digest": (("block", "digest_byte"), da.zeros((nb, 8), dtype="uint8", chunks=(1, 8))),
            "block_stats": (("block", "stat", "band"), da.zeros((nb, len(STATS), c), dtype="float64", chunks=(1, len(STATS), c))),
            "sample_digest": (("sample", "part"), da.zeros((n, 2), dtype="uint32", chunks=(block, 2))),
        },
        coords={
            "source": ("sample", _text([it.id for it in items])),
            "split": ("sample", _text(["all"] * n)),
            "time": ("time", _text(spec.time or [str(t) for t in range(T)])),
            "task": ("task", _text(list(tasks))),
            "task_type": ("task", _text([t[0] for t in tasks.values()])),
            "band": ("band", _text([b.name for b in spec.bands])),
            "alias": ("band", _text([b.alias for b in spec.bands])),
            "role": ("band", _text([b.role for b in spec.bands])),
            "wavelength_um": ("band", np.array([b.wavelength_um for b in spec.bands], dtype="float64")),
            "sensor": ("band", _text([b.sensor for b in spec.bands])),
            "units": ("band", _text([b.units for b in spec.bands])),
            "published_mean": ("band", np.array(mean, dtype="float64")),
            "published_std": ("band", np.array(std, dtype="float64")),
            "band_mean": ("band", np.full(c, np.nan)),
            "band_std": ("band", np.full(c, np.nan)),
            "band_min": ("band", np.full(c, np.nan)),
            "band_max": ("band", np.full(c, np.nan)),
        },
        attrs=attrs,
    )
    return ds


@task_boundary
def write_sample_block(task: dict[str, Any]) -> dict[str, Any]:
    from ..cluster.runtime import tune_malloc

    t0 = time.perf_counter()
    tune_malloc()
    reader: SSL4EOReader = task["reader"]
    items: list[Location] = task["items"]
    s0 = task["s0"]
    imgs = []
    for it in items:
        img, _ = reader.read(it, shift_s2=task["shift_s2"])
        if img.shape != task["shape"]:
            raise ConvertError(f"location {it.id}: image {img.shape}, the cube's samples are {task['shape']}")
        names = reader.spec.time or [str(t) for t in range(img.shape[0])]
        imgs.append(np.stack([check_image(img[t], reader.spec, f"location {it.id} ({names[t]})")[0]
                              for t in range(img.shape[0])]))
    images = np.stack(imgs)
    g = _store.open_group(task["out"], "r+")
    targets = np.asarray(g["target"][s0 : s0 + len(items)])
    digests = sample_digests(images, targets)
    n, T, c, H, W = images.shape
    flat = images.reshape(n * T, c, H, W)  # every pixel of every season counts (the challenge has no split)
    stats = partial_stats(flat, np.zeros((n * T, H, W), np.int8), np.ones(n * T, bool))
    with zarr.config.set({"array.write_empty_chunks": True}):
        g["image"][s0 : s0 + len(items)] = images
        g["sample_digest"][s0 : s0 + len(items)] = digests
        g["block_digest"][task["block"]] = block_digest(digests, images[0].nbytes, targets[0].nbytes)
        g["block_stats"][task["block"]] = stats
        g["progress"][task["block"]] = 1
    return {"samples": len(items), "read_bytes": int(images.nbytes), "seconds": time.perf_counter() - t0}


def convert_samples(reader: SSL4EOReader, raw: str, out: str, client, block: int, overwrite: bool, progress: bool,
                    shift_s2: bool) -> SampleConvertResult:
    import hashlib
    import json

    from ..progress import gather

    t0 = time.perf_counter()
    spec = reader.spec
    items = reader.scan(raw)
    tasks = reader.labels(raw)
    first, _ = reader.read(items[0], shift_s2=shift_s2)
    T, C, H, W = first.shape
    if H != W:
        raise ConvertError(f"location {items[0].id}: {H}x{W} pixels; sample cubes hold square images")
    fingerprint = hashlib.sha256(json.dumps({"ids": [it.id for it in items], "tasks": {k: sorted(v[1].items()) for k, v in tasks.items()},
                                             "shift_s2": shift_s2, "block": block, "shape": first.shape,
                                             "schema": SCHEMA_VERSION}, default=str).encode()).hexdigest()
    if _store.exists(out):
        g = _store.open_group(out, "r+")
        if overwrite or g.attrs.get(PLAN_ATTR) != fingerprint:
            if not overwrite and (PLAN_ATTR in g.attrs or COMPLETE_ATTR in g.attrs):
                raise UserError(f"{out}: a cube from different inputs or options is already there; pass --overwrite to replace it")
            _store.remove(out)
    if not _store.exists(out):
        attrs = {"dataset": spec.id, "title": spec.name, "description": spec.description, "licence": spec.licence,
                 "layout": reader.layout.name, "raw_source": raw, "kind": "samples", "shift_s2": shift_s2,
                 "published_statistics": "ssl4eo_v11_shifted" if shift_s2 else "raw (catalog band mean/std)",
                 "schema_version": SCHEMA_VERSION, "converter": f"cryocube {__version__}", "block_samples": block,
                 "created": _dt.datetime.now(_dt.timezone.utc).isoformat(),
                 outputs.ZARR_MARKER: outputs.marker("cube", "convert")}
        ds = _template(spec, reader, items, tasks, T, H, shift_s2, block, attrs)
        enc = {"image": {"chunks": (1, T, C, H, H)}, "target": {"chunks": (block, max(1, len(tasks)))},
               "sample_digest": {"chunks": (block, 2)}, "progress": {"chunks": (1,)}}
        ds.to_zarr(_store.make_store(out), mode="w", compute=False, zarr_format=3, encoding=enc, consolidated=True)
        g = _store.open_group(out, "r+")
        g.attrs[PLAN_ATTR] = fingerprint
        zarr.consolidate_metadata(g.store)
    g = _store.open_group(out, "r+")
    if COMPLETE_ATTR in g.attrs:
        return SampleConvertResult(out, len(items), 0, math.ceil(len(items) / block), 0, time.perf_counter() - t0,
                                   dict(g.attrs[COMPLETE_ATTR]))
    done = np.asarray(g["progress"][:]).astype(bool)
    jobs = [{"reader": reader, "items": items[b * block : (b + 1) * block], "s0": b * block, "block": b, "out": out,
             "shift_s2": shift_s2, "shape": first.shape} for b in range(done.size) if not done[b]]
    futs = client.map(write_sample_block, jobs, pure=False, key=[f"cryocube-samples-{b['block']}-{time.time_ns()}" for b in jobs])
    results = gather(futs, f"convert {spec.id}", sum(len(j["items"]) for j in jobs), progress, lambda i, r: r["samples"])
    stats = combine_stats(np.asarray(g["block_stats"][:]))
    for k in ("mean", "std", "min", "max"):
        g[f"band_{k}"][:] = stats[k]
    marker = {"time": _dt.datetime.now(_dt.timezone.utc).isoformat(), "n_samples": len(items),
              "checksum": cube_checksum(np.asarray(g["block_digest"][:])), "schema_version": SCHEMA_VERSION}
    g.attrs["statistics_split"] = "all"
    g.attrs[COMPLETE_ATTR] = marker
    zarr.consolidate_metadata(g.store)
    return SampleConvertResult(out, len(items), len(jobs), done.size, sum(r["read_bytes"] for r in results),
                               time.perf_counter() - t0, marker)

