"""Tile cubes (`TileReader`, tiles planned on the client, blocks written on workers) and `convert`,
the front door for both kinds of cube; a killed conversion redoes only its unflagged blocks."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import time
from abc import abstractmethod
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import __version__, outputs
from .. import store as _store
from ..catalog import CUBE_IGNORE_INDEX, DatasetSpec, Layout, load_dataset
from ..cluster.client import get_client
from ..cluster.runtime import task_boundary, tune_malloc
from ..cube import COMPLETE_ATTR, SCHEMA_VERSION, check_unique_ids, derive_sample_ids, partial_stats
from ..cube.write import ConvertResult, WriteOptions, create, finalize, put_block, tile_template
from ..errors import UserError
from ..progress import gather
from .base import SPLITS, ConvertError, Mapper, Reader, SourceItem, Window, open_reader
from .rawio import map_threads
from .splits import draw_val

DEFAULT_BLOCK_SAMPLES = 16


@dataclass
class Plan:
    """Samples of a cube in order (split, item, tile row, tile col) and the items they come from."""

    items: list[SourceItem]
    item_of: np.ndarray  # (n,) index into items
    tile_y: np.ndarray
    tile_x: np.ndarray

    @property
    def n(self) -> int:
        """Samples (tiles) in the cube; its sample axis and block count follow from it."""
        return int(self.item_of.size)

    def coords(self) -> dict[str, np.ndarray]:
        """Per-sample coordinates: ids from file names (duplicates refused), each tile's affine."""
        it, io, x0, y0 = self.items, self.item_of, self.tile_x, self.tile_y
        tf = np.array([it[i].transform or (np.nan,) * 6 for i in io], dtype=np.float64)
        a, b, c, d, e, f = tf.reshape(-1, 6).T
        fix = "two files of one split folder share a name; rename one"
        split = np.array([it[i].split for i in io])
        source = np.array([it[i].image.rsplit("/", 1)[-1] for i in io])
        ids = derive_sample_ids(source, split, y0, x0)
        return {
            "split": split,
            "scene": np.array([it[i].scene for i in io]),
            "source": source,
            "sample_id": check_unique_ids(ids, "the raw files", fix),
            "crs": np.array([it[i].crs or "" for i in io]),
            "tile_y": self.tile_y,
            "tile_x": self.tile_x,
            "transform": np.stack([a, b, c + a * x0 + b * y0, d, e, f + d * x0 + e * y0], axis=1),
        }

    def fingerprint(self, extra: dict) -> str:
        """A hash of the options and every item: a cube resumes only from the same inputs."""
        h = hashlib.sha256(json.dumps(extra, sort_keys=True).encode())
        for it in self.items:
            h.update(
                f"{it.split}|{it.scene}|{it.image}|{it.label}|{it.height}|{it.width}|{it.bands}".encode()
            )
        return h.hexdigest()


def plan_tiles(items: list[SourceItem], tile: int) -> Plan:
    """Cut every item into non-overlapping tile x tile windows (edge tiles padded later)."""
    cut = [
        (i, y, x)
        for i, it in enumerate(items)
        for y in range(0, it.height, tile)
        for x in range(0, it.width, tile)
    ]
    item_of, ty, tx = np.array(cut, dtype=np.int64).reshape(-1, 3).T
    return Plan(items, item_of, ty.astype(np.int32), tx.astype(np.int32))


class TileReader(Reader):
    """Layouts of scenes or tiles with dense labels, cut into a tile cube by the shared writer."""

    @abstractmethod
    def scan(self, root: str, map_headers: Mapper | None = None) -> list[SourceItem]:
        """Every item, sorted; header reads go through `map_headers` (the workers, in `convert`)."""

    @abstractmethod
    def read(self, item: SourceItem, window: Window | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(image (C, h, w) in the source dtype, raw label (h, w)) of the window (None: whole)."""

    def disk_split(self, split: str) -> str:
        """Where files of `split` live on disk: itself, or "train" where val is drawn from train."""
        return "train" if split == "val" and self.options.get("val_from_train") else split

    def drawn(self, items: list[SourceItem]) -> list[SourceItem]:
        """The items in cube order (split, scene), val drawn from train where the layout says so."""
        train = [it.scene for it in items if it.split == "train"]
        val = draw_val(train, self.options.get("val_from_train"), self.where)
        items = [
            replace(it, split="val") if it.scene in val and it.split == "train" else it
            for it in items
        ]
        return sorted(items, key=lambda it: (SPLITS.index(it.split), it.scene))

    def example_name(self, base: str, i: int) -> str:
        """The name generated item `i` gets in this layout, from a dataset-style name."""
        return base

    @abstractmethod
    def write(
        self, root, split, scene, image, raw_label, crs=None, transform=None
    ) -> tuple[str, str]:
        """Sample data: one image and raw label where `scan` finds them; (image, label) paths."""

    def convert(self, raw, out, client, opts: WriteOptions, prechecked=None) -> ConvertResult:
        """Scan (headers on the workers: nothing is prechecked), plan the tiles, write, finalise."""
        t0 = time.perf_counter()
        spec, layout = self.spec, self.layout.name
        items = self.scan(raw, map_headers=worker_mapper(client))
        if not items:
            raise ConvertError(f"{raw}: no {spec.id} images found for layout {layout!r}")
        plan = plan_tiles(items, opts.tile)
        # the options that shape the cube: a cube resumes only from the same ones
        shaping = ("tile", "block", "shard", "on_error", "compressor")
        fingerprint = plan.fingerprint(
            {"dataset": spec.id, "layout": layout, "schema": SCHEMA_VERSION}
            | {k: getattr(opts, k) for k in shaping}
        )

        def make():
            crs = sorted({it.crs for it in plan.items if it.crs})
            attrs = cube_attrs(
                spec,
                layout,
                raw,
                doi=spec.doi,
                classes=[{"name": c.name, "colour": c.colour} for c in spec.classes],
                class_distribution_published=list(spec.class_distribution),
                ignore_index=CUBE_IGNORE_INDEX,
                tile_size=opts.tile,
                block_samples=opts.block,
                shard_samples=opts.shard,
                compressor=opts.compressor,
                scan_dropped=[],
            )
            if len(crs) == 1:
                epsg = crs[0].upper().startswith("EPSG:")
                attrs["proj:code"], attrs["proj:wkt2"] = (crs[0], None) if epsg else (None, crs[0])
            return tile_template(spec, plan.n, opts, plan.coords(), attrs)

        def job(b: int) -> dict:
            s0, s1 = b * opts.block, min((b + 1) * opts.block, plan.n)
            iidx = plan.item_of[s0:s1]
            uniq = list(dict.fromkeys(iidx.tolist()))
            local = {ii: k for k, ii in enumerate(uniq)}
            return {
                "block": b,
                "range": (s0, s1),
                "spec": spec,
                "layout": layout,
                "tile": opts.tile,
                "items": [plan.items[i] for i in uniq],
                "samples": [
                    (local[int(ii)], int(y), int(x))
                    for ii, y, x in zip(iidx, plan.tile_y[s0:s1], plan.tile_x[s0:s1])
                ],
                "out": out,
                "on_error": opts.on_error,
                "train": [plan.items[i].split == "train" for i in iidx],
            }

        return write_blocks(out, make, fingerprint, opts, client, write_block, job, plan.n, t0)


# -- per-sample validation --------------------------------------------------------------------


LUT_MAX = 1 << 16  # integer labels below this are remapped by table lookup (one pass)


def remap_labels(raw: np.ndarray, layout: Layout, where: str) -> np.ndarray:
    """Raw label values -> class indices (int16), ignore -> -1; unknown values are an error."""
    raw = np.asarray(raw)
    if raw.dtype.kind == "f":
        if not np.all(np.isfinite(raw)) or not np.all(raw == np.round(raw)):
            raise ConvertError(f"{where}: label has non-integer or non-finite values")
        raw = raw.astype(np.int64)
    if min([*layout.label_map, *layout.ignore_values, 0]) >= 0 and raw.size:
        lo, hi = int(raw.min()), int(raw.max())
        if lo >= 0 and hi < LUT_MAX:  # a table: raw value -> class, ignore -1, unknown -2
            lut = np.full(max(hi, *layout.label_map, *layout.ignore_values) + 1, -2, np.int16)
            lut[list(layout.ignore_values)] = CUBE_IGNORE_INDEX
            lut[list(layout.label_map)] = list(layout.label_map.values())
            out = np.take(lut, raw)
            if (out == -2).any():
                _unknown(np.unique(raw[out == -2]), layout, where)
            return out
    out = np.full(raw.shape, CUBE_IGNORE_INDEX, dtype=np.int16)
    keys = np.array(sorted(layout.label_map), dtype=np.int64)
    vals = np.array([layout.label_map[k] for k in keys], dtype=np.int16)
    flat = raw.astype(np.int64)
    pos = np.clip(np.searchsorted(keys, flat), 0, len(keys) - 1)
    known = keys[pos] == flat
    ignored = np.isin(flat, np.array(layout.ignore_values, dtype=np.int64))
    bad = ~(known | ignored)
    if bad.any():
        _unknown(np.unique(flat[bad]), layout, where)
    out[known] = vals[pos[known]]
    return out


def _unknown(values: np.ndarray, layout: Layout, where: str):
    raise ConvertError(
        f"{where}: label values {values[:10].tolist()} are not in the {layout.name} mapping"
        f" {dict(layout.label_map)}"
        + (f" (ignore values {list(layout.ignore_values)})" if layout.ignore_values else "")
    )


def check_image(img: np.ndarray, spec: DatasetSpec, where: str) -> tuple[np.ndarray, np.ndarray]:
    """The image in the cube dtype, and its no-data mask (NaN under nan_policy 'fill')."""
    if img.ndim != 3 or img.shape[0] != len(spec.bands):
        raise ConvertError(
            f"{where}: expected {len(spec.bands)} bands ({', '.join(spec.band_names)}), got shape"
            f" {img.shape}"
        )
    nodata = np.zeros(img.shape[1:], dtype=bool)
    # one pass in the usual all-finite case
    if img.dtype.kind == "f" and not np.isfinite(img).all():
        bad = ~np.isfinite(img)
        if spec.nan_policy == "error":
            b = int(np.flatnonzero(bad.any(axis=(1, 2)))[0])
            raise ConvertError(
                f"{where}: {int(bad.sum())} NaN/inf pixels (first in band {spec.bands[b].name})"
            )
        nodata = bad.any(axis=0)
        img = np.where(bad, spec.nan_fill, img)
    target = np.dtype(spec.dtype)
    if target.kind in "ui" and img.dtype != target:
        info = np.iinfo(target)
        if img.min() < info.min or img.max() > info.max:
            raise ConvertError(
                f"{where}: values {img.min()}..{img.max()} do not fit the dataset dtype {target}"
            )
    return img.astype(target, copy=False), nodata


def class_fractions(label: np.ndarray, k: int) -> np.ndarray:
    """Area fraction of each class among valid pixels of each sample (zeros if none valid)."""
    lab = label.reshape(label.shape[0], -1)
    counts = np.stack([(lab == c).sum(axis=1) for c in range(k)], axis=1)
    return (counts / np.maximum((lab >= 0).sum(axis=1, keepdims=True), 1)).astype(np.float32)


# -- the block task (runs on a worker) ----------------------------------------------------------


def _fill_tiles(reader: TileReader, task: dict, ii: int, js: list[int], images, labels, reasons):
    """Tiles `js` of item `ii` from one read of their bounding box, checked and remapped -> bytes
    read; with --on-error skip a bad item's tiles stay zeros with ignore labels and get a reason."""
    it, samples, tile = task["items"][ii], task["samples"], task["tile"]
    ys, xs = [samples[j][1] for j in js], [samples[j][2] for j in js]
    win = (min(ys), min(max(ys) + tile, it.height), min(xs), min(max(xs) + tile, it.width))
    try:
        img, raw = reader.read(it, win)
        if img.shape[1:] != raw.shape:
            raise ConvertError(
                f"{it.image}: image {img.shape[1:]} and mask {it.label} {raw.shape} differ in size"
            )
        nbytes = img.nbytes + raw.nbytes
        img, nodata = check_image(img, reader.spec, it.image)
        lbl = remap_labels(raw, reader.layout, it.label)
        lbl[nodata] = CUBE_IGNORE_INDEX
    except ConvertError as e:
        if task["on_error"] != "skip":
            raise
        for j in js:
            reasons[j] = str(e)
        return 0
    for j in js:  # edge tiles keep the zeros and ignore labels they start with past the edge
        oy, ox = samples[j][1] - win[0], samples[j][2] - win[2]
        part = lbl[oy : oy + tile, ox : ox + tile]
        h, w = part.shape
        images[j, :, :h, :w], labels[j, :h, :w] = img[:, oy : oy + h, ox : ox + w], part
    return nbytes


@task_boundary
def write_block(task: dict[str, Any]) -> dict[str, Any]:
    """Read, validate, tile and write samples [s0, s1) of the cube; what it read and skipped."""
    tune_malloc()
    spec: DatasetSpec = task["spec"]
    reader: TileReader = open_reader(spec, task["layout"])
    tile, (s0, s1) = task["tile"], task["range"]
    n = s1 - s0
    images = np.zeros((n, len(spec.bands), tile, tile), dtype=spec.dtype)
    labels = np.full((n, tile, tile), CUBE_IGNORE_INDEX, dtype=np.int16)
    reasons = [""] * n
    by_item: dict[int, list[int]] = {}  # item index in task["items"] -> its samples in the block
    for j, (ii, _, _) in enumerate(task["samples"]):
        by_item.setdefault(ii, []).append(j)
    read_bytes = sum(
        _fill_tiles(reader, task, ii, js, images, labels, reasons) for ii, js in by_item.items()
    )
    cf = class_fractions(labels, spec.num_classes)
    region = {"image": images, "label": labels, "class_fraction": cf}
    region["skip_reason"] = np.array(reasons, dtype=object)
    stats = partial_stats(images, labels, np.asarray(task["train"], dtype=bool))
    g = _store.open_group(task["out"], "r+")
    put_block(g, task["block"], s0, region, (images, labels), stats)
    return {"samples": n, "read_bytes": read_bytes, "skipped": sum(1 for r in reasons if r)}


# -- orchestration (client side) -----------------------------------------------------------------

HEADERS_PER_TASK = 64  # below this many files per worker, header reads stay on the client


@task_boundary
def _map_chunk(fn, jobs: list, threads: int) -> list:
    return map_threads(fn, jobs, threads)


def worker_mapper(client):
    """A `Mapper` reading headers on the workers, so many files or an object store scale."""

    def run(fn, jobs: list, threads: int) -> list:
        workers = max(1, len(client.scheduler_info(n_workers=-1).get("workers", {})))
        if len(jobs) < HEADERS_PER_TASK * workers:
            return map_threads(fn, jobs, threads)
        n = min(len(jobs) // HEADERS_PER_TASK, 4 * workers)
        chunks = [jobs[i::n] for i in range(n)]
        parts = client.gather(client.map(_map_chunk, [fn] * n, chunks, [threads] * n, pure=False))
        out = [None] * len(jobs)
        for i, part in enumerate(parts):
            out[i::n] = part  # chunks were strided: put every result back at its job's position
        return out

    return run


def detect_layout(spec: DatasetSpec, raw: str) -> str:
    """The first of the dataset's catalog layouts (in name order) whose reader recognises `raw`."""
    candidates = [lay for lay in sorted(spec.layouts) if open_reader(spec, lay).detect(raw)]
    if not candidates:
        raise ConvertError(
            f"{raw}: does not look like any known {spec.id} layout"
            f" ({', '.join(sorted(spec.layouts))}); pass --layout"
        )
    return candidates[0]


@dataclass
class Conversion:
    """A conversion checked on the client (request, `--out`, a sample reader's whole plan), so bad
    input is refused before a cluster starts."""

    reader: Reader
    raw: str
    out: str
    opts: WriteOptions
    prechecked: Any

    def run(self, client=None) -> ConvertResult:
        """Writes (or resumes) the cube on the workers of `client` (default: the current one)."""
        client = get_client(client)
        _store.share_with(client)
        return self.reader.convert(self.raw, self.out, client, self.opts, self.prechecked)


def prepare(
    dataset: str | DatasetSpec,
    raw: str,
    out: str,
    layout: str = "auto",
    tile_size: int | None = None,
    block_samples: int = DEFAULT_BLOCK_SAMPLES,
    shard_samples: int | None = None,
    on_error: str = "raise",
    compressor: str = "lz4",
    overwrite: bool = False,
    raw_storage_options: dict | None = None,
    storage_options: dict | None = None,
    progress: bool = True,
    **reader_options,
) -> Conversion:
    """Everything `convert` checks before a cluster starts: the sizes (None or positive),
    --on-error, the layout (detected for auto), --keep-corrupted, the output, the reader's plan."""
    spec = dataset if isinstance(dataset, DatasetSpec) else load_dataset(dataset)
    _store.register_options(raw, raw_storage_options)
    _store.register_options(out, storage_options)
    for what, v in zip(("--tile", "--block", "--shard"), (tile_size, block_samples, shard_samples)):
        if v is not None and v < 1:
            raise UserError(f"{what} must be a positive number, got {v}")
    if on_error not in ("raise", "skip"):
        raise UserError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
    if layout == "auto":
        layout = detect_layout(spec, raw)
    elif layout not in spec.layouts:
        raise UserError(
            f"dataset {spec.id!r} has no layout {layout!r}; known:"
            f" {', '.join(sorted(spec.layouts))}"
        )
    reader = open_reader(spec, layout, raw_storage_options)
    if reader_options.get("keep_corrupted") and not reader.flags_samples:
        raise UserError(
            f"--keep-corrupted: the {spec.id} layout {layout!r} has no annotations that flag"
            " corrupted samples (only Hephaestus's do)"
        )
    # a layout of fixed patches (TorchGeo's CaFFe) may name its own tile size; --tile still decides
    tile = int(tile_size or reader.options.get("tile_size") or spec.tile_size)
    if tile < 1:
        raise UserError(f"{spec.path}: layouts.{layout}.tile_size must be a positive number")
    # never replace what convert did not write
    outputs.claim(out, "cube", "convert", inputs=[("--raw", raw)])
    # a Dask task must write whole shards, never part of one
    block = shard_samples or block_samples
    opts = WriteOptions(block, overwrite, progress, on_error, tile, shard_samples, compressor)
    return Conversion(reader, raw, out, opts, reader.precheck(raw, on_error, **reader_options))


def convert(
    dataset: str | DatasetSpec, raw: str, out: str, layout: str = "auto", client=None, **options
) -> ConvertResult:
    """Convert a dataset's raw layout into a cube at `out`, resuming an interrupted one; `options`
    are `prepare`'s."""
    return prepare(dataset, raw, out, layout, **options).run(client)


def write_blocks(
    out: str, make, fingerprint: str, opts: WriteOptions, client, fn, job, n: int, t0, skipped=None
) -> ConvertResult:
    """Either kind: `make()`'s cube created (or resumed, same `fingerprint`), `fn(job(b))` on the
    workers per unflagged block, then `finalize`; `skipped`: left out before writing (None: the
    tasks report them)."""
    try:
        g = create(out, make, fingerprint, opts.overwrite)
    except OSError as e:  # a full disk or an unwritable --out, in one sentence
        why = outputs.disk_full_message(e, out) or f"{out}: cannot write the cube: {e}"
        raise UserError(why) from None
    block = opts.block
    nb = -(-n // block)
    if COMPLETE_ATTR in g.attrs:
        dt, marker = time.perf_counter() - t0, dict(g.attrs[COMPLETE_ATTR])
        return ConvertResult(out, n, 0, nb, 0, dt, marker, skipped or 0)
    done = np.asarray(g["progress"][:]).astype(bool)
    todo = [b for b in range(nb) if not done[b]]
    keys = [f"cryocube-{fn.__name__}-{out[-24:]}-{b}-{time.time_ns()}" for b in todo]
    futures = client.map(fn, [job(b) for b in todo], pure=False, key=keys) if todo else []
    total = sum(min((b + 1) * block, n) - b * block for b in todo)
    what = f"convert {g.attrs['dataset']}"
    results = gather(futures, what, total, opts.progress, lambda i, r: r["samples"])
    marker, read = finalize(out), sum(r["read_bytes"] for r in results)
    skipped = sum(r["skipped"] for r in results) if skipped is None else skipped
    return ConvertResult(out, n, len(todo), nb, read, time.perf_counter() - t0, marker, skipped)


def cube_attrs(spec: DatasetSpec, layout: str, raw: str, **extra) -> dict[str, Any]:
    """The attrs every cube starts with: what it holds, its source, who wrote it and when."""
    return {
        "dataset": spec.id,
        "title": spec.name,
        "description": spec.description,
        "licence": spec.licence,
        "layout": layout,
        "raw_source": raw,
        "schema_version": SCHEMA_VERSION,
        "converter": f"cryocube {__version__}",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        outputs.ZARR_MARKER: outputs.marker("cube", "convert"),
        **extra,
    }
