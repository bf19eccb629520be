"""The segmentation family: the Cryo-Bench protocols, scored by mIoU (docs/segmentation.md)."""

from __future__ import annotations

import hashlib
import io
import math
import operator
import time
from dataclasses import replace

import numpy as np

from ... import store as _store
from ...catalog import protocol as protocol_spec
from ...cube import as_text, open_cube
from ...decoders import decoder_kinds, decoder_options
from ...errors import UserError
from ...models import model_spec
from ...models.weights import resolve_weights
from ...precision import auto_memory_format, resolve, this_device
from ...record import run_dir
from .. import register
from ..base import Family, PlanContext, PlannedRun, Resolved, RunSpec, derive_seed
from ..encoders import (
    EncoderSpec,
    dataset_band_rule,
    encoder_facts,
    encoder_input_size,
    input_map,
    match_cube_bands,
    window_offsets,
)
from ..split import SPLITS
from .data import stratified_subset
from .memory import finetune_bytes
from .metrics import TileConfusions, metrics_from_confusion
from .recipe import SegmentationRecipe
from .sample_cubes import as_tiles
from .work import CacheSpec, FitTask, SegRun, TestTask


@register
class Segmentation(Family):
    name = "segmentation"
    warm_modules = ("timm", f"{__name__}.train", f"{__name__}.features")
    primary_metric = "mIoU"
    shown_metrics = ("mF1", "oAcc")
    recipe = SegmentationRecipe
    identity_version = 2

    def resolve(
        self, spec: RunSpec, cube, recipe: SegmentationRecipe, ctx: PlanContext
    ) -> Resolved:
        """Every user error (splits, fraction, bands, decoder) before any cluster work."""
        proto = protocol_spec(spec.protocol)
        drawn = None  # a sample cube with a per-pixel target: the split this family draws for it
        if cube.kind != "tiles":
            cube, drawn = as_tiles(cube)
        mspec, fraction, rule, match, size, subset, decoder = _checked(
            spec, cube, recipe, proto, drawn
        )
        ew = recipe.encoder_weights.get(spec.model)
        w = resolve_weights(spec.model, ew, ctx.weights_dir, ctx.allow_random_weights)
        device = ctx.device or this_device()
        precision = resolve(recipe.precision, device)
        fmt = recipe.memory_format
        fmt = auto_memory_format(device, precision) if fmt == "auto" else fmt
        arith = ctx.arithmetic_threads(recipe.threads)
        enc = EncoderSpec(mspec, cube.bands, rule, size, w.path, w.sha256, precision, arith)
        # the split is part of what is learnt
        cube_key = cube.checksum if drawn is None else f"{cube.checksum}:split-{drawn['digest']}"
        inputs = input_map(cube, match.index, recipe.normalization)
        trains = proto.trains_encoder or not mspec.pretrained
        crops, dtype = recipe.crops_per_sample, recipe.feature_dtype
        cache = CacheSpec(enc, cube.url, cube_key, inputs, cube.tile, crops, dtype, ctx.out)
        run = SegRun(
            run_id="",  # `planned` names it and its folder
            label=spec.label,
            trains_encoder=trains,
            encoder=enc,
            decoder=decoder,
            decoder_kwargs=tuple(
                (k, getattr(recipe, f"decoder_{k}")) for k in decoder_options(decoder)
            ),
            num_classes=len(cube.class_names),
            class_names=tuple(cube.class_names),
            tile=cube.tile,
            cube_url=cube.url,
            inputs=inputs,
            train_samples=subset,
            val_samples=cube.samples("val"),
            test_samples=cube.samples("test"),
            recipe=recipe,
            seed=derive_seed(spec.model, cube.dataset, spec.protocol, fraction, spec.seed),
            checkpoint="",
            cache=None if trains else cache,
            memory_format=fmt,
        )
        return _resolved(spec, cube, run, cube_key, drawn, fraction, w, device, ctx.out)

    def prepare(self, runner, runs: list[PlannedRun]) -> dict[str, dict]:
        """Extracts once what each feature cache lacks of its runs' draws; the facts per cache."""
        from .features import create_split, extract_block, extraction_tasks, settle

        caches: dict[str, tuple[CacheSpec, PlannedRun]] = {}
        drawn: dict[str, list[np.ndarray]] = {}
        for p in runs:
            if p.work.cache is not None:
                caches.setdefault(p.work.cache.key, (p.work.cache, p))
                drawn.setdefault(p.work.cache.key, []).append(p.work.train_samples)
        if not caches:
            return {}
        t0 = time.perf_counter()
        facts = {
            k: runner.submit(encoder_facts, c.encoder, key=f"cryocube-encoder-{k}")
            for k, (c, _) in caches.items()
        }
        out: dict[str, dict] = {}
        tasks = []
        needed: dict[tuple[str, str], np.ndarray] = {}
        for k, (c, p) in caches.items():
            shapes, params = runner.result(facts[k])
            out[k] = {"encoder_params": params, "encoder_items": 0, "features_s": 0.0}
            out[k] |= {"encoder_items_by_split": dict.fromkeys(SPLITS, 0)}
            out[k] |= {"threads": set(), "devices": set()}
            cfg = p.work.recipe
            for split in SPLITS:
                samples = p.cube.samples(split)
                want = np.arange(samples.size)
                if split == "train":
                    want = np.searchsorted(samples, np.unique(np.concatenate(drawn[k])))
                needed[k, split] = want
                plan = create_split(c, split, samples, shapes)
                tasks += extraction_tasks(c, split, samples, want, plan, cfg)
        if tasks:
            sizes = [t.samples.size for t in tasks]
            done = runner.map(
                extract_block, tasks, "extract features", sizes, key="cryocube-extract"
            )
            for t, r in zip(tasks, done):
                _add_block(out[t.cache.key], t.split, r)
        wall = time.perf_counter() - t0 if tasks else 0.0
        for k, (c, _) in caches.items():
            for split in SPLITS:
                settle(c, split, needed[k, split], out[k]["encoder_items"])
            out[k]["features_wall_s"] = wall
            out[k] |= {x: sorted(out[k][x]) for x in ("threads", "devices")}
        return out

    def group(self, runs: list[PlannedRun], workers: int) -> list[list[PlannedRun]]:
        """Frozen runs on one feature cache train together (one read); fine-tuning runs alone."""
        groups = [[p] for p in runs if p.work.trains_encoder]
        by_cache: dict[tuple, list[PlannedRun]] = {}
        for w, p in ((p.work, p) for p in runs if not p.work.trains_encoder):
            key = (w.cache.key, w.recipe.threads, w.recipe.cache_in_memory_mb)
            by_cache.setdefault(key, []).append(p)
        for members in by_cache.values():
            cap = members[0].work.recipe.decoders_per_task
            n = len(members)
            g = max(math.ceil(n / cap), min(n, max(1, workers)))
            groups += [members[i::g] for i in range(g)]
        return groups

    def fit(self, group: list[PlannedRun]):
        """One task trains the group's decoders (`train.fit`) over one read of their features."""
        from .train import fit

        return fit, FitTask(tuple(p.work for p in group))

    def score(self, run: PlannedRun, fitted: dict):
        """One test task per block of test samples, writing its masks into predictions.zarr."""
        from .train import test_block

        w: SegRun = run.work
        test, bs = w.test_samples, w.recipe.block_samples
        purl = w.checkpoint.rsplit("/", 1)[0] + "/predictions.zarr"
        g = _store.open_group(purl, "w")
        g.create_array(
            "pred",
            shape=(test.size, w.tile, w.tile),
            chunks=(1, w.tile, w.tile),
            dtype="int16",
            fill_value=-1,
            dimension_names=("sample", "y", "x"),
        )
        g.create_array("sample", data=test.astype(np.int64), dimension_names=("sample",))
        g.attrs.update({"cube": w.cube_url, "run_id": run.run_id, "classes": list(w.class_names)})
        blocks = [(b0, min(b0 + bs, test.size)) for b0 in range(0, test.size, bs)]
        return [(test_block, TestTask(w, np.arange(*b), test[slice(*b)], purl, b)) for b in blocks]

    reduce = staticmethod(operator.add)  # per-tile confusions join; their int64 sum is order-free

    def finish(self, run: PlannedRun, fitted: dict, total, prepared: dict) -> dict:
        """mIoU and the record fields; a test split without a labelled pixel is an error, not 0."""
        w: SegRun = run.work
        tiles: TileConfusions = total.ordered()
        cm = tiles.total()
        if cm.sum() == 0:
            raise UserError(f"{run.label}: the test split has no labelled pixel to score")
        extra = {"per_tile": write_per_tile(w, tiles)}
        prep = prepared.get(run.prep_key, {})
        trainable = fitted["trainable_params"]
        predictions = w.checkpoint.rsplit("/", 1)[0] + "/predictions.zarr"
        # an interferogram cube: the predicted masks answer deformation localisation too
        if "split" in run.record.fields:
            from .localisation import localisation

            extra["localisation"] = localisation(
                w.cube_url, predictions, w.test_samples, run.cube.labelled[w.test_samples]
            )
        return {
            **extra,
            "metrics": metrics_from_confusion(cm, w.class_names),
            "primary_metric": self.primary_metric,
            "confusion_matrix": cm.tolist(),
            # unlabelled_steps: batches of padding only, skipped (no NaN loss)
            **{k: fitted[k] for k in ("val_curve", "best_epoch", "steps", "unlabelled_steps")},
            "samples_per_s": fitted["train_samples_per_s"],
            # the scope: what the peak covers ("not measured: ..." where it cannot be)
            **{k: fitted[k] for k in ("peak_memory_mb", "peak_memory_scope", "device")},
            "threads": {"fit": fitted["threads"], "features": prep.get("threads", [])},
            # where the encoder ran for the cache (none: cached before)
            "feature_devices": prep.get("devices", []),
            "decoders_in_task": fitted["decoders_in_task"],
            "optimizer": fitted["optimizer"],
            "encoder_forward_items": prep.get("encoder_items", 0),
            # per split: a few-shot run's train items are its draw's (crops x drawn samples)
            "encoder_forward_items_by_split": prep.get(
                "encoder_items_by_split", dict.fromkeys(SPLITS, 0)
            ),
            "params": {
                "encoder": prep.get("encoder_params", fitted["encoder_params"]),
                "trainable": trainable,
                "decoder": trainable - (fitted["encoder_params"] if w.trains_encoder else 0),
            },
            "gflops": w.encoder.model.gflops,
            "predictions": predictions,
            "timings": _timings(fitted, prep),
        }


def _add_block(facts: dict, split: str, r: dict) -> None:
    """One extraction block's items, seconds, threads, device and phases into its cache's facts."""
    facts["encoder_items"] += r["items"]
    facts["encoder_items_by_split"][split] += r["items"]
    facts["features_s"] += r["seconds"]
    facts["threads"] |= set(r["threads"])
    facts["devices"].add(r["device"])
    ph = facts.setdefault("phases", {})
    for name, v in r.get("phases", {}).items():
        ph[name] = round(ph.get(name, 0.0) + v, 4)


def _timings(fitted: dict, prep: dict) -> dict:
    """A run's record timings: its cache's extraction (shared), its fit, their phases."""
    return {
        "features_s": prep.get("features_s", 0.0),
        "features_wall_s": prep.get("features_wall_s", 0.0),
        "train_s": fitted["train_s"],
        "setup_s": fitted["setup_s"],
        **({"fit_phases": fitted["phases"]} if "phases" in fitted else {}),
        **({"feature_phases": prep["phases"]} if "phases" in prep else {}),
    }


def _checked(spec: RunSpec, cube, recipe, proto, drawn):
    """(model, fraction, band rule, band match, input size, draw, decoder), each checked."""
    mspec = model_spec(spec.model)
    if recipe.follow_reference:
        mspec = mspec.following_reference()
    fraction = proto.fraction if spec.fraction is None else float(spec.fraction)
    where = f"{spec.model} on {cube.dataset} ({spec.protocol})"
    if not 0 < fraction <= 1:
        raise UserError(f"{where}: the label fraction must be in (0, 1], got {fraction}")
    rule = proto.bands
    # the dataset's own rule (interferograms: cross_sensor), as `embed` uses
    if rule == "named" and drawn is not None:
        rule = dataset_band_rule(cube.dataset, rule)
    rule, match = match_cube_bands(mspec, cube.bands, rule)  # SAR-only cube: cross-sensor
    size = int(encoder_input_size(mspec, cube.tile, recipe.input_size, where))
    subset = _training_subset(cube, spec, fraction, where)
    decoder = mspec.decoder or recipe.decoder
    if decoder not in decoder_kinds():
        raise UserError(
            f"recipe field decoder must be one of {', '.join(decoder_kinds())}, got {decoder!r}"
        )
    return mspec, fraction, rule, match, size, subset, decoder


def _training_subset(cube, spec: RunSpec, fraction: float, where: str):
    """The run's draw of the training split; empty or unlabelled splits and draws are refused."""
    for split in SPLITS:
        if not cube.samples(split).size:
            raise UserError(
                f"{cube.url}: split {split!r} is empty; {spec.model} cannot be"
                " trained/evaluated on it"
            )
        if not cube.labelled[cube.samples(split)].any():
            raise UserError(
                f"{cube.url}: split {split!r} has no labelled pixel (every label is ignore);"
                f" nothing to {'train on' if split == 'train' else 'score'}"
            )
    train = cube.samples("train")
    seed = derive_seed("subset", cube.checksum, fraction, spec.seed)
    subset = train[stratified_subset(cube.strata[train], fraction, seed)]
    if not cube.labelled[subset].any():
        raise UserError(
            f"{where}: the {fraction:g} subset of the training split has no labelled pixel;"
            " raise the fraction"
        )
    return subset


def _resolved(spec, cube, run: SegRun, cube_key, drawn, fraction, weights, device, out) -> Resolved:
    """The identity and record fields of a segmentation run (`run`: its tasks, not yet named)."""
    enc, recipe = run.encoder, run.recipe
    return Resolved(
        identity={
            "model": spec.model,
            "arch": enc.model.arch,
            "cube": cube_key,
            "protocol": spec.protocol,
            "fraction": fraction,
            "recipe": recipe.identity(),
            "weights": weights.sha256 or weights.source,
            "input_size": enc.input_size,
            "precision": enc.precision,
            "band_rule": enc.rule,
        },
        model_name=enc.model.display_name,
        weights=weights.as_record(),
        precision={
            "requested": recipe.precision,
            "effective": enc.precision,
            "device": device.describe(),
        },
        fields={
            "trains_encoder": run.trains_encoder,
            "config": recipe.as_dict(),
            "input_size": enc.input_size,
            "band_rule": enc.rule,
            "band_index": list(run.inputs.index),
            "normalization": recipe.normalization,
            "decoder": run.decoder,
            "memory_format": run.memory_format,
            "deviations": enc.model.deviation_record(),
            "subset": run.train_samples.tolist() if fraction < 1 else None,
            **({"split": drawn} if drawn is not None else {}),
        },
        work=lambda run_id: replace(
            run, run_id=run_id, checkpoint=f"{run_dir(out, run_id)}/best.pt"
        ),
        cube=cube,
        fraction=fraction,
        prep_key=run.cache.key if run.cache else None,
        estimate=_estimate(cube, run),
    )


def _estimate(cube, run: SegRun) -> dict:
    """What `--dry-run` prints and `engine/estimate.py` prices (memory: a worker's least)."""
    recipe, enc, n = run.recipe, run.encoder, run.train_samples.size
    size, bf16 = enc.input_size, enc.precision == "bf16"
    windows = len(window_offsets(cube.tile, size))
    held_out = run.val_samples.size + run.test_samples.size
    items = 0 if run.trains_encoder else int(n * recipe.crops_per_sample + held_out * windows)
    memory = finetune_bytes(enc.model.params_m, enc.model.arch, size, recipe.batch_size, bf16)
    return {
        "train_samples": int(n),
        "steps": max(1, n // recipe.batch_size) * recipe.epochs,
        "validations": len(range(0, recipe.epochs, recipe.val_every)) + 1,
        "windows_per_tile": windows,
        "encoder_items": items,
        "memory_bytes": memory if run.trains_encoder else 0,  # frozen runs: not bounded
    }


PER_TILE_FILE = "per_tile.npz"


def write_per_tile(w: SegRun, tiles: TileConfusions) -> dict:
    """Per-tile matrices and scenes beside record.json, for the bootstrap (docs/statistics.md)."""
    samples = np.asarray(w.test_samples, dtype=np.int64)[tiles.positions]
    ds = open_cube(w.cube_url)
    source = as_text(ds["source"].values)[samples] if "source" in ds else samples.astype(str)
    buf = io.BytesIO()
    np.savez_compressed(buf, confusion=tiles.cms, sample=samples, source=np.asarray(source, str))
    data = buf.getvalue()
    url = w.checkpoint.rsplit("/", 1)[0] + "/" + PER_TILE_FILE
    _store.write_atomic(url, data)
    return {
        "file": PER_TILE_FILE,
        "url": url,
        "sha256": hashlib.sha256(data).hexdigest(),
        "tiles": int(samples.size),
        "scenes": int(np.unique(source).size),
    }
