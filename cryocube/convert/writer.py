"""Tile cubes: the `TileReader` base, and the writer that plans tiles on the client and fills fixed
blocks of samples on Dask workers, each through the cube's one block write (`cube.write.put_block`:
the progress flag last), so a killed conversion redoes only the blocks whose flag is not set.
`convert` is the front door for both kinds of cube.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import time
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import __version__, outputs
from .. import store as _store
from ..catalog import CUBE_IGNORE_INDEX, DatasetSpec, Layout, load_dataset
from ..cluster.client import get_client
from ..cluster.runtime import tune_malloc
from ..cube import (
    COMPLETE_ATTR,
    SCHEMA_VERSION,
    CubeLayout,
    check_unique_ids,
    derive_sample_ids,
    partial_stats,
)
from ..cube.write import (
    ConvertResult,
    WriteOptions,
    create,
    encoding,
    finalize,
    put_block,
    tile_template,
)
from ..errors import UserError, task_boundary
from ..progress import gather
from .base import ConvertError, Mapper, Reader, SourceItem, Window, open_reader
from .rawio import map_threads, order_items, val_from_train
from .splits import draw_val

DEFAULT_BLOCK_SAMPLES = 16


@dataclass
class Plan:
    """Samples of a cube in order (split, item, tile row, tile col) and the items they come from."""

    items: list[SourceItem]
    item_of: np.ndarray  # (n,) index into items
    tile_y: np.ndarray
    tile_x: np.ndarray
    tile: int

    @property
    def n(self) -> int:
        """Samples (tiles) in the cube; its sample axis and block count follow from it."""
        return int(self.item_of.size)

    def coords(self) -> dict[str, np.ndarray]:
        """Per-sample coordinates: ids from file names (duplicates refused), each tile's affine."""
        it = self.items
        io = self.item_of
        tf = np.full((self.n, 6), np.nan)
        for s in range(self.n):
            t = it[io[s]].transform
            if t is not None:
                a, b, c, d, e, f = t
                x0, y0 = self.tile_x[s], self.tile_y[s]
                tf[s] = (a, b, c + a * x0 + b * y0, d, e, f + d * x0 + e * y0)
        split = np.array([it[i].split for i in io])
        source = np.array([it[i].image.rsplit("/", 1)[-1] for i in io])
        return {
            "split": split,
            "scene": np.array([it[i].scene for i in io]),
            "source": source,
            "sample_id": check_unique_ids(
                derive_sample_ids(source, split, self.tile_y, self.tile_x),
                "the raw files",
                "two files of one split folder share a name; rename one",
            ),
            "crs": np.array([it[i].crs or "" for i in io]),
            "tile_y": self.tile_y,
            "tile_x": self.tile_x,
            "transform": tf,
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
    return Plan(items, item_of, ty.astype(np.int32), tx.astype(np.int32), tile)


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
        """The items in cube order, val drawn from train where the layout says so."""
        train = [it.scene for it in items if it.split == "train"]
        val = draw_val(train, self.options.get("val_from_train"), self.where)
        return order_items(val_from_train(items, val))

    def example_name(self, base: str, i: int) -> str:
        """The name generated item `i` gets in this layout, from a dataset-style name."""
        return base

    @abstractmethod
    def write(
        self,
        root: str,
        split: str,
        scene: str,
        image: np.ndarray,
        raw_label: np.ndarray,
        crs: str | None = None,
        transform: tuple | None = None,
    ) -> tuple[str, str]:
        """Sample data: one image and raw label where `scan` finds them; (image, label) paths."""

    def convert(
        self, raw: str, out: str, client, opts: WriteOptions, prechecked: Any = None, **options
    ) -> ConvertResult:
        """The shared tile writer; nothing is prechecked, as headers are read on the workers."""
        return convert_tiles(self, raw, out, client, opts)


# -- per-sample validation --------------------------------------------------------------------


LUT_MAX = 1 << 16  # integer labels below this are remapped by table lookup (one pass)


def _lookup_table(layout: Layout, size: int) -> np.ndarray:
    """raw value -> class index; ignore -> -1; unknown -> -2 (an error)."""
    lut = np.full(max(size, *layout.label_map, *layout.ignore_values, 0) + 1, -2, dtype=np.int16)
    lut[list(layout.ignore_values)] = CUBE_IGNORE_INDEX
    for k, v in layout.label_map.items():
        lut[k] = v
    return lut


def remap_labels(raw: np.ndarray, layout: Layout, where: str) -> np.ndarray:
    """Raw label values -> class indices (int16), ignore -> -1; unknown values are an error."""
    raw = np.asarray(raw)
    if raw.dtype.kind == "f":
        if not np.all(np.isfinite(raw)) or not np.all(raw == np.round(raw)):
            raise ConvertError(f"{where}: label has non-integer or non-finite values")
        raw = raw.astype(np.int64)
    if (
        min(layout.label_map, default=0) >= 0
        and min(layout.ignore_values, default=0) >= 0
        and raw.size
    ):
        lo, hi = int(raw.min()), int(raw.max())
        if lo >= 0 and hi < LUT_MAX:
            out = np.take(_lookup_table(layout, hi), raw)
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


def _tile_from(
    window_img: np.ndarray, window_lbl: np.ndarray, oy: int, ox: int, tile: int, dtype
) -> tuple[np.ndarray, np.ndarray]:
    img = window_img[:, oy : oy + tile, ox : ox + tile]
    lbl = window_lbl[oy : oy + tile, ox : ox + tile]
    h, w = lbl.shape
    if h == tile and w == tile:
        return img, lbl
    pi = np.zeros((img.shape[0], tile, tile), dtype=dtype)
    pl = np.full((tile, tile), CUBE_IGNORE_INDEX, dtype=np.int16)
    pi[:, :h, :w] = img
    pl[:h, :w] = lbl
    return pi, pl


def class_fractions(label: np.ndarray, k: int) -> np.ndarray:
    """Area fraction of each class among valid pixels of each sample (zeros if none valid)."""
    lab = label.reshape(label.shape[0], -1)
    out = np.zeros((lab.shape[0], k), dtype=np.float32)
    for i, row in enumerate(lab):
        v = row[row >= 0]
        if v.size:
            out[i] = np.bincount(v, minlength=k)[:k] / v.size
    return out


# -- the block task (runs on a worker) ----------------------------------------------------------


def _fill_tiles(reader: TileReader, task: dict, ii: int, js: list[int], images, labels, reasons):
    """Tiles `js` of item `ii` from one windowed read (the bounding box of the block's tiles of it),
    checked and remapped; returns the bytes read. With --on-error skip a bad item's tiles stay
    zeros with ignore labels and a reason."""
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
            images[j] = 0
        return 0
    for j in js:
        oy, ox = samples[j][1] - win[0], samples[j][2] - win[2]
        images[j], labels[j] = _tile_from(img, lbl, oy, ox, tile, images.dtype)
    return nbytes


@task_boundary
def write_block(task: dict[str, Any]) -> dict[str, Any]:
    """Read, validate, tile and write samples [s0, s1) of the cube; what it read and skipped."""
    tune_malloc()
    spec: DatasetSpec = task["spec"]
    reader: TileReader = open_reader(spec, task["layout"])
    tile = task["tile"]
    s0, s1 = task["range"]
    n = s1 - s0
    images = np.empty((n, len(spec.bands), tile, tile), dtype=spec.dtype)  # every row is written
    labels = np.full((n, tile, tile), CUBE_IGNORE_INDEX, dtype=np.int16)
    reasons = [""] * n
    by_item: dict[int, list[int]] = {}  # item index in task["items"] -> its samples in the block
    for j, (ii, _, _) in enumerate(task["samples"]):
        by_item.setdefault(ii, []).append(j)
    read_bytes = sum(
        _fill_tiles(reader, task, ii, js, images, labels, reasons) for ii, js in by_item.items()
    )
    cf = class_fractions(labels, spec.num_classes)
    stats = partial_stats(images, labels, np.asarray(task["train"], dtype=bool))
    put_block(
        _store.open_group(task["out"], "r+"),
        task["block"],
        s0,
        {
            "image": images,
            "label": labels,
            "class_fraction": cf,
            "skip_reason": np.array(reasons, dtype=object),
        },
        (images, labels),
        stats,
    )
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
        futures = client.map(_map_chunk, [fn] * n, chunks, [threads] * n, pure=False)
        parts = client.gather(futures)
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


def check_request(
    spec: DatasetSpec, raw: str, layout: str, sizes: tuple, on_error: str, keep_corrupted
) -> tuple[str, int]:
    """(layout, tile size) once the layout (detected for auto), --on-error, --keep-corrupted and
    the sizes (--tile, --block, --shard: None or positive) are checked; `cryocube convert` asks
    before its cluster starts."""
    tile_size = sizes[0]
    for what, v in zip(("--tile", "--block", "--shard"), sizes):
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
    if keep_corrupted and not open_reader(spec, layout).flags_samples:
        raise UserError(
            f"--keep-corrupted: the {spec.id} layout {layout!r} has no annotations that flag"
            " corrupted samples (only Hephaestus's do)"
        )
    # a layout of fixed patches (TorchGeo's CaFFe) may name its own tile size; --tile still decides
    tile = int(
        tile_size
        if tile_size is not None
        else spec.layout(layout).options.get("tile_size") or spec.tile_size
    )
    if tile < 1:
        raise UserError(f"{spec.path}: layouts.{layout}.tile_size must be a positive number")
    return layout, tile


def convert(
    dataset: str | DatasetSpec,
    raw: str,
    out: str,
    layout: str = "auto",
    client=None,
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
) -> ConvertResult:
    """Convert a dataset's raw layout into a cube at `out`, resuming an interrupted one."""
    spec = dataset if isinstance(dataset, DatasetSpec) else load_dataset(dataset)
    _store.register_options(raw, raw_storage_options)
    _store.register_options(out, storage_options)
    # a Dask task must write whole shards, never part of one
    block_samples = shard_samples or block_samples
    sizes, keep = (tile_size, block_samples, shard_samples), reader_options.get("keep_corrupted")
    layout, tile = check_request(spec, raw, layout, sizes, on_error, keep)
    # never replace what convert did not write
    outputs.claim(out, "cube", "convert", inputs=[("--raw", raw)])
    client = get_client(client)
    _store.share_with(client)
    opts = WriteOptions(
        block=block_samples,
        overwrite=overwrite,
        progress=progress,
        on_error=on_error,
        tile=tile,
        shard=shard_samples,
        compressor=compressor,
    )
    # `cryocube convert` planned sample cubes before the cluster
    prechecked = reader_options.pop("prechecked", None)
    return open_reader(spec, layout).convert(raw, out, client, opts, prechecked, **reader_options)


def convert_tiles(
    reader: TileReader, raw: str, out: str, client, opts: WriteOptions
) -> ConvertResult:
    """Scan (headers on the workers), plan the tiles, write blocks, finalise."""
    t0 = time.perf_counter()
    spec, layout = reader.spec, reader.layout.name
    items = reader.scan(raw, map_headers=worker_mapper(client))
    if not items:
        raise ConvertError(f"{raw}: no {spec.id} images found for layout {layout!r}")
    plan = plan_tiles(items, opts.tile)
    lay = CubeLayout(
        plan.n,
        len(spec.bands),
        opts.tile,
        spec.num_classes,
        spec.dtype,
        opts.block,
        opts.shard,
        opts.compressor,
    )
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
            tile_size=lay.tile,
            block_samples=lay.block_size,
            shard_samples=lay.shard_size,
            compressor=lay.compressor,
            scan_dropped=[],
        )
        if len(crs) == 1:
            epsg = crs[0].upper().startswith("EPSG:")
            attrs["proj:code"], attrs["proj:wkt2"] = (crs[0], None) if epsg else (None, crs[0])
        return tile_template(spec, lay, plan.coords(), attrs), encoding(lay)

    def job(b: int) -> dict:
        s0, s1 = lay.block_range(b)
        iidx = plan.item_of[s0:s1]
        uniq = list(dict.fromkeys(iidx.tolist()))
        local = {ii: k for k, ii in enumerate(uniq)}
        return {
            "block": b,
            "range": (s0, s1),
            "spec": spec,
            "layout": layout,
            "tile": lay.tile,
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


def write_blocks(
    out: str, make, fingerprint: str, opts: WriteOptions, client, fn, job, n: int, t0, skipped=None
) -> ConvertResult:
    """Either kind: the cube `make()` describes created (or reopened to resume the same
    `fingerprint`), `fn(job(b))` on the workers for every block whose progress flag is not set
    (none in a complete cube), then `finalize`. `skipped`: the samples left out before writing
    (None: those the block tasks report)."""
    try:
        g = create(out, make, fingerprint, opts.overwrite)
    except OSError as e:  # a full disk or an unwritable --out, in one sentence
        raise UserError(
            outputs.disk_full_message(e, out) or f"{out}: cannot write the cube: {e}"
        ) from None
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
    results = gather(
        futures, f"convert {g.attrs['dataset']}", total, opts.progress, lambda i, r: r["samples"]
    )
    marker = finalize(out)
    return ConvertResult(
        url=out,
        n_samples=n,
        blocks_written=len(todo),
        blocks_total=nb,
        read_bytes=sum(r["read_bytes"] for r in results),
        seconds=time.perf_counter() - t0,
        marker=marker,
        skipped=sum(r["skipped"] for r in results) if skipped is None else skipped,
    )


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
