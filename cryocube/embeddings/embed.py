"""`cryocube embed`: one vector per cube sample from any registered encoder, or an organiser
baseline; pooling, resuming, PCA and baselines: docs/embeddings.md ("How the vectors are made")."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .. import __version__, outputs
from .. import store as _store
from ..catalog import load_dataset
from ..cluster.runtime import task_boundary, torch_task
from ..cube import _text, as_text, check_unique_ids, open_cube, read_samples, sample_ids
from ..errors import RecipeError, UserError
from ..families.base import PlanContext
from ..families.encoders import (
    EncoderSpec,
    InputMap,
    dataset_band_rule,
    encoder_facts,
    encoder_input_size,
    get_encoder,
    input_map,
    match_cube_bands,
    window_offsets,
)
from ..fetch import file_digest
from ..models import model_spec
from ..models.weights import resolve_weights
from ..precision import autocast, resolve, this_device
from ..progress import gather, progress_bar
from ..recipe import BaseRecipe
from .submission import pad_to

COMPLETE = "cryocube_embedding_complete"
BASELINES = ("random", "mean")


@dataclass(frozen=True)
class EmbedSpec:
    """Everything that defines an embedding store; its hash names it."""

    source: str  # model id or baseline name
    cube_url: str
    cube_checksum: str
    inputs: InputMap
    encoder: EncoderSpec | None  # None: a baseline
    dim: int | None  # None: the pooled width; else PCA / zero-padding to this width
    seed: int = 0  # the random baseline's stream
    groups: tuple[tuple[int, ...], ...] = ()  # mean baseline: band groups (cube band indices)
    grid: int = 8  # mean baseline: resampled side
    block_samples: int = 16
    batch: int | None = None
    threads: int | None = None

    @property
    def key(self) -> str:
        """The store's name and a probe run's prep_key: a digest of what decides the vectors' bits
        (cube checksum, inputs, weights, arithmetic), never of block size or batch."""
        e = self.encoder
        enc = e and {
            "arch": e.model.arch,
            "rule": e.rule,
            "S": e.input_size,
            "weights": e.weights_sha256 or e.weights,
            **e.arithmetic(),
            **({"followed": list(e.model.followed)} if e.model.followed else {}),
        }
        ident = {
            "source": self.source,
            "cube": self.cube_checksum,
            "inputs": self.inputs,
            "dim": self.dim,
            "seed": self.seed if self.source == "random" else None,
            "groups": self.groups,
            "grid": self.grid,
            "encoder": enc,
            # 2: rows carry the cube's sample ids (v1: `source`, shared by a scene's tiles)
            "v": 2,
        }
        digest = hashlib.sha256(repr(sorted(ident.items())).encode()).hexdigest()[:16]
        return f"{self.source}-{digest}"

    def describe(self) -> dict[str, Any]:
        """What the store's attributes and run records say of the vectors (weights by sha256)."""
        e = self.encoder
        return {
            "source": self.source,
            "key": self.key,
            "dim": self.dim,
            "pooling": "gap-levels+mean-windows+mean-time",
            "baseline": self.source if e is None else None,
            "seed": self.seed if self.source == "random" else None,
            "input_size": e.input_size if e else None,
            "band_rule": e.rule if e else None,
            "precision": e.precision if e else "fp32",
            "weights": (e.weights_sha256 or e.weights) if e else None,
        }


@dataclass(frozen=True)
class EmbedBlock:
    spec: EmbedSpec
    url: str
    block: int
    samples: np.ndarray


def plan_embedding(
    source: str,
    cube,
    recipe: BaseRecipe,
    ctx: PlanContext,
    *,
    dim: int | None = None,
    seed: int = 0,
) -> tuple[EmbedSpec, dict]:
    """One embedding (encoder or baseline) of one cube, checked -> (spec, provenance); recipe and
    context pass whole, so every field reaches every embedding; `seed` is the random baseline's."""
    if dim is not None and dim < 1:
        raise UserError(f"--dim must be >= 1, got {dim}")
    plan = _plan_baseline if source in BASELINES else _plan_encoder
    fields, prov = plan(source, cube, recipe, ctx, dim, seed)
    spec = EmbedSpec(
        source, cube.url, cube.checksum, dim=dim, block_samples=recipe.block_samples, **fields
    )
    return spec, prov


def _plan_baseline(source: str, cube, recipe: BaseRecipe, ctx, dim: int | None, seed: int):
    """A baseline's EmbedSpec fields: the catalog's `mean_baseline` groups and grid, else every band
    alone and a grid that keeps about `dim` (or 1024) values."""
    if recipe.follow_reference:
        raise RecipeError(
            f"follow_reference=true: the {source} baseline is no model and has no deviation"
            " from a reference to follow (docs/deviations.md); drop the setting for it"
        )
    groups: tuple[tuple[int, ...], ...] = tuple((i,) for i in range(len(cube.bands)))
    grid = 8
    if source == "mean":
        try:
            mb = load_dataset(cube.dataset).mean_baseline
        except UserError:
            mb = {}
        names = [b.name for b in cube.bands]
        if mb.get("groups"):
            missing = sorted({n for g in mb["groups"] for n in g} - set(names))
            if missing:
                raise UserError(
                    f"{cube.url}: the catalog's mean_baseline names bands {missing} the cube lacks"
                )
            groups = tuple(tuple(names.index(n) for n in g) for g in mb["groups"])
        T = max(1, len(cube.time))
        grid = int(mb.get("grid") or max(1, math.isqrt((dim or 1024) // (T * len(groups)))))
    inputs = input_map(cube, list(range(len(cube.bands))), recipe.normalization)
    fields = dict(inputs=inputs, encoder=None, seed=seed, groups=groups, grid=grid)
    return fields, {"weights": {"pretrained": False, "random_init": False, "source": source}}


def _plan_encoder(source: str, cube, recipe: BaseRecipe, ctx: PlanContext, dim, seed):
    """An encoder's EmbedSpec fields, fed by the dataset catalog's band rule (no protocol here)."""
    mspec = model_spec(source)
    if recipe.follow_reference:
        mspec = mspec.following_reference()
    rule, match = match_cube_bands(
        mspec, cube.bands, dataset_band_rule(cube.dataset), offers_cross_sensor=False
    )
    size = encoder_input_size(
        mspec, cube.tile, recipe.input_size or None, f"{source} on {cube.dataset}"
    )
    found = resolve_weights(
        source, recipe.encoder_weights.get(source), ctx.weights_dir, ctx.allow_random_weights
    )
    eff = resolve(recipe.precision, ctx.device or this_device())
    threads = ctx.run_threads(recipe.threads)
    arith = ctx.arithmetic_threads(threads)
    enc = EncoderSpec(mspec, cube.bands, rule, int(size), found.path, found.sha256, eff, arith)
    inputs = input_map(cube, match.index, recipe.normalization)
    return dict(inputs=inputs, encoder=enc, batch=recipe.extract_batch, threads=threads), {
        "weights": found.as_record(),
        "model_name": mspec.display_name,
        "band_mode": _band_mode(rule, match),
        "deviations": mspec.deviation_record(),
        "precision": {"requested": recipe.precision, "effective": eff},
    }


def _band_mode(rule: str, match) -> str:
    """What went into which input slot, for the record (rendered RGB: what did not go in too)."""
    fed = ", ".join(
        f"{s}<-{b.name}" for k, s in enumerate(match.slots) if (b := match.slot_band(k))
    )
    mode = f"{rule}: {fed}" + (
        " (grey-like bands replicated into RGB slots)" if match.replicated else ""
    )
    if rule == "rendered_rgb":
        mode += "".join(
            f"; not fed: {match.bands[i].name} ({why})"
            for i, why in sorted(match.unused_reasons.items())
        )
    return mode


def _pooled(enc, spec: EmbedSpec, x, device: str, batch: int) -> np.ndarray:
    """(items, slots, H, W) normalised -> (items, features): input windows, GAP per level."""
    S = spec.encoder.input_size
    H = x.shape[-1]
    if H < S:  # pad bottom/right with 0 (= the mean), as the segmentation family does
        x = torch.nn.functional.pad(x, (0, S - H, 0, S - H))
    offs = window_offsets(H, S)
    out = []
    with torch.inference_mode(), autocast(device, spec.encoder.precision):
        for b in range(0, x.shape[0], batch):
            acc = None
            for oy, ox in offs:
                win = x[b : b + batch, :, oy : oy + S, ox : ox + S].to(device)
                feats = torch.cat([f.float().mean(dim=(-2, -1)) for f in enc(win)], dim=1)
                acc = feats if acc is None else acc + feats
            out.append((acc / len(offs)).cpu().numpy())
    v = np.concatenate(out)
    if not np.isfinite(v).all():
        raise FloatingPointError(
            f"{spec.source}: non-finite embeddings on {spec.cube_url} (precision"
            f" {spec.encoder.precision})"
        )
    return v


def _mean_baseline(spec: EmbedSpec, x: np.ndarray) -> np.ndarray:
    """(n, T, C, H, W) -> (n, T * groups * grid^2), C order (time, group, y, x) as organisers do."""
    from scipy.ndimage import zoom

    n, T, _, H, W = x.shape
    out = np.empty((n, T, len(spec.groups), spec.grid, spec.grid), np.float32)
    for gi, g in enumerate(spec.groups):
        m = x[:, :, list(g)].mean(axis=2)
        for i in range(n):
            for t in range(T):
                out[i, t, gi] = zoom(m[i, t], (spec.grid / H, spec.grid / W), order=1)
    return out.reshape(n, -1)


@task_boundary
def embed_block(task: EmbedBlock) -> dict[str, Any]:
    """One block's vectors into `features`, then its progress flag (an interrupted run resumes)."""
    t0 = time.perf_counter()
    spec = task.spec
    img, _ = read_samples(spec.cube_url, task.samples, labels=False)
    if img.ndim == 4:
        img = img[:, None]  # tiles: one time step
    n, T, C, H, W = img.shape
    with torch_task(spec.threads) as (device, threads):
        x = spec.inputs.apply(img.reshape(n * T, C, H, W))  # (n*T, slots, H, W)
        if spec.source == "random":
            rngs = [np.random.default_rng([spec.seed, int(s)]) for s in task.samples]
            v = np.stack([r.standard_normal(spec.dim or 1024) for r in rngs]).astype(np.float32)
        elif spec.source == "mean":
            v = _mean_baseline(spec, x.numpy().reshape(n, T, -1, H, W))
        else:
            enc = get_encoder(spec.encoder, device)
            v = _pooled(enc, spec, x, device, spec.batch or 16).reshape(n, T, -1).mean(axis=1)
        g = _store.open_group(task.url, "r+")
        g["features"][int(task.samples[0]) : int(task.samples[0]) + n] = v.astype(np.float32)
        g["progress"][task.block] = 1
        return {"samples": n, "seconds": time.perf_counter() - t0, "threads": [threads]}


@dataclass
class EmbedResult:
    url: str
    n_samples: int
    dim: int
    blocks_run: int
    seconds: float
    attrs: dict = field(default_factory=dict)


def _width(spec: EmbedSpec, cube, client) -> int:
    """The pooled width; an encoder's from its output levels, built on a worker where there are."""
    if spec.source == "random":
        return spec.dim or 1024
    if spec.source == "mean":
        return max(1, len(cube.time)) * len(spec.groups) * spec.grid**2
    if client is None:
        return sum(s[0] for s in encoder_facts(spec.encoder)[0])
    return sum(s[0] for s in client.submit(encoder_facts, spec.encoder, pure=False).result()[0])


def _create(spec: EmbedSpec, cube, url: str, client, blocks: int) -> None:
    """The empty store: `features` to fill, a progress flag per block, the key."""
    width = _width(spec, cube, client)
    n, bs = cube.n_samples, spec.block_samples
    g = _store.open_group(url, "w")
    g.create_array(
        "features",
        shape=(n, width),
        chunks=(bs, width),
        dtype="float32",
        fill_value=float("nan"),
        dimension_names=("sample", "feature"),
    )
    g.create_array("progress", shape=(blocks,), chunks=(1,), dtype="uint8", fill_value=0)
    marker = {outputs.ZARR_MARKER: outputs.marker("embeddings", "embed")}
    g.attrs.update({"key": spec.key, "source": spec.source} | marker)


def _run_blocks(spec: EmbedSpec, tasks: list[EmbedBlock], client, progress: bool, n: int) -> set:
    """Every block task, here or on the cluster; the torch threads they ran with."""
    if client is None:
        results = []
        with progress_bar(f"embed {spec.source}", n, progress) as bar:
            for t in tasks:
                results.append(embed_block(t))
                bar.advance(results[-1]["samples"])
    else:
        keys = [f"cryocube-embed-{spec.key}-{t.block}-{time.time_ns()}" for t in tasks]
        futs = client.map(embed_block, tasks, pure=False, key=keys)
        todo = sum(t.samples.size for t in tasks)
        results = gather(futs, f"embed {spec.source}", todo, progress, lambda i, r: r["samples"])
    return {x for r in results for x in r["threads"]}


def embed(
    spec: EmbedSpec,
    cube,
    url: str,
    client=None,
    progress: bool = True,
    provenance: dict | None = None,
    overwrite: bool = False,
) -> EmbedResult:
    """Compute (or resume, or reuse) the embedding store at `url` (`client=None`: here)."""
    t0 = time.perf_counter()
    # never replace what embed did not write
    outputs.claim(url, "embeddings", "embed", inputs=[("--cube", cube.url)])
    if _store.exists(url):
        g = _store.open_group(url, "r")
        key = g.attrs.get("key")
        if COMPLETE in g.attrs and key == spec.key and not overwrite:
            return _result(url, cube, 0, 0.0)
        if key != spec.key or overwrite:
            if not overwrite and key is not None:
                raise UserError(
                    f"{url}: embeddings of other inputs ({g.attrs.get('source')}) are there; pass"
                    " --overwrite"
                )
            _store.remove(url)
    n, bs = cube.n_samples, spec.block_samples
    blocks = math.ceil(n / bs)
    if not _store.exists(url):
        _create(spec, cube, url, client, blocks)
    done = np.asarray(_store.open_group(url, "r+")["progress"][:]).astype(bool)
    tasks = [
        EmbedBlock(spec, url, b, np.arange(b * bs, min(n, (b + 1) * bs)))
        for b in range(blocks)
        if not done[b]
    ]
    threads = _run_blocks(spec, tasks, client, progress, n) if tasks else set()
    _finish(spec, cube, url, provenance or {}, sorted(threads))
    return _result(url, cube, len(tasks), time.perf_counter() - t0)


def _result(url: str, cube, blocks_run: int, seconds: float) -> EmbedResult:
    g = _store.open_group(url, "r")
    width = int(g["embedding"].shape[1])
    return EmbedResult(url, cube.n_samples, width, blocks_run, seconds, dict(g.attrs))


def _project(spec: EmbedSpec, F: np.ndarray, split: np.ndarray) -> tuple[np.ndarray, dict | None]:
    """The pooled features brought to `spec.dim`: PCA fitted on the train split (all samples of a
    cube without one), or zero columns where there are fewer, as NeuCo-Bench pads."""
    if spec.dim is None or spec.source == "random" or F.shape[1] == spec.dim:
        return F, None
    if F.shape[1] < spec.dim:
        return pad_to(F, spec.dim), None
    train = split == "train"
    fit_on, rows = ("train", F[train]) if train.any() else ("all", F)
    mu = rows.mean(axis=0)
    _, s, vt = np.linalg.svd((rows - mu).astype(np.float64), full_matrices=False)
    comp, var = vt[: spec.dim], s**2  # the top min(dim, rank) axes
    pca = {
        "fitted_on": fit_on,
        "samples": int(rows.shape[0]),
        "components": int(comp.shape[0]),
        "explained_variance": float((var[: spec.dim] / (var.sum() or 1.0)).sum()),
    }
    return pad_to(((F - mu) @ comp.T).astype(np.float32), spec.dim), pca


def _finish(spec: EmbedSpec, cube, url: str, provenance: dict, threads: list[int]) -> None:
    """The vectors, sample ids and splits beside the features, then the attributes and marker."""
    g = _store.open_group(url, "r+")
    F = np.asarray(g["features"][:])
    bad = np.flatnonzero(~np.isfinite(F).all(axis=1))
    # a lost or unwritten chunk: never scored as vectors of NaN (the NaN -> 0 rule would hide it)
    if bad.size:
        raise UserError(
            f"{url}: features of {bad.size} samples (e.g. sample {int(bad[0])}) are missing or"
            " damaged; remove the store and run embed again"
        )
    split = as_text(np.asarray(cube.splits))
    E, pca = _project(spec, F, split)
    ids = sample_ids(open_cube(cube.url), cube.url)
    for k in ("embedding", "sample", "split", "id"):
        if k in g:
            del g[k]
    g.create_array(
        "embedding",
        data=E.astype(np.float32),
        chunks=(spec.block_samples, E.shape[1]),
        dimension_names=("sample", "dim"),
    )
    g.create_array(
        "sample", data=np.arange(E.shape[0], dtype=np.int64), dimension_names=("sample",)
    )
    # variable-length UTF-8: a specified zarr v3 type
    for name, values in (("split", split), ("id", ids)):
        g.create_array(name, shape=(len(values),), dtype=str, dimension_names=("sample",))[:] = (
            _text(values)
        )
    digest = hashlib.sha256(np.ascontiguousarray(E, dtype=np.float32).tobytes()).hexdigest()
    g.attrs.update(
        {
            **spec.describe(),
            **provenance,
            "cube": {"url": cube.url, "checksum": cube.checksum, "dataset": cube.dataset},
            "pooled_width": int(F.shape[1]),
            "pca": pca,
            "threads": threads,
            "cryocube": __version__,
            "embedding_sha256": digest,
        }
    )
    now = _dt.datetime.now(_dt.timezone.utc).isoformat()
    g.attrs[COMPLETE] = {"time": now, "n_samples": int(E.shape[0])}


def load_embeddings(url: str) -> tuple[list[str], np.ndarray, np.ndarray, dict]:
    """(ids, vectors, splits, attrs) of a complete embedding store."""
    g = _store.open_group(url, "r")
    if COMPLETE not in g.attrs:
        raise UserError(
            f"{url}: not a complete embedding store (no {COMPLETE!r} marker); run `cryocube embed`"
            " again"
        )
    ids = check_unique_ids(
        g["id"][:],
        url,
        "an embedding store made before sample ids were unique: run `cryocube embed` "
        "again with --overwrite",
    )
    X = np.asarray(g["embedding"][:])
    return [str(i) for i in ids], X, as_text(g["split"][:]), dict(g.attrs)


# what `<csv>.json` keeps of a submission CSV's provenance (beside it, so it travels with the CSV)
SIDECAR_KEYS = tuple(
    "source key model_name cube weights precision dim pca embedding_sha256".split()
)


def write_sidecar(csv: str, attrs: dict) -> str:
    """`<csv>.json`: what made the CSV, with its sha256 so an edited CSV is never credited to it."""
    out = f"{csv}.json"
    doc = {k: attrs.get(k) for k in SIDECAR_KEYS} | {
        "csv_sha256": file_digest(csv),
        "cryocube": __version__,
    }
    _store.write_atomic(out, json.dumps(doc, indent=1, sort_keys=True, default=str))
    return out


def read_sidecar(csv: str) -> dict:
    """The provenance `embed` wrote beside a CSV; {} without one or (warned) for an edited CSV."""
    path = f"{csv}.json"
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        why = f"{path}: unreadable provenance ({e}); {csv} is treated as vectors made elsewhere"
    else:
        if doc.get("csv_sha256") == file_digest(csv):
            return {k: v for k, v in doc.items() if k in SIDECAR_KEYS and v is not None}
        why = f"{csv} changed since `cryocube embed` wrote it, so its provenance in {path} is not"
        why += " used"
    warnings.warn(why, stacklevel=2)
    return {}


def embeddings_url(out: str, key: str) -> str:
    """A run's vectors under the results root, named by EmbedSpec key: one store for its runs."""
    return f"{out.rstrip('/')}/embeddings/{key}.zarr"


def prepare_store(spec: EmbedSpec, cube, url: str, runner, weights) -> dict:
    """Embeds (or resumes, or reuses) a run's store on the runner's cluster -> what records keep."""
    r = embed(spec, cube, url, runner.client, runner.progress, {"weights": weights})
    return {
        "embed_s": r.seconds,
        "blocks_run": r.blocks_run,
        "dim": r.dim,
        "embedding_sha256": r.attrs.get("embedding_sha256"),
        "pca": r.attrs.get("pca"),
        "threads": r.attrs.get("threads", []),
    }
