"""`evaluate`: plan runs, fill the feature caches, train every run, map-reduce test confusion matrices.

Everything runs on the Dask client given (or the default one). Unit of work: a block of samples x one
model for feature extraction and testing; one run for training. Finished runs are skipped; cached
feature blocks are not recomputed; a run that fails (e.g. non-finite loss) is recorded as an error
and the others go on.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field

import numpy as np

from .. import store as _store
from ..errors import UserError
from ..progress import gather, progress_bar
from .features import CacheSpec, block_tasks, cache_url, create_split, encoder_facts, extract_block, mark_complete
from .metrics import metrics_from_confusion, tree_reduce_futures
from .protocols import TrainConfig
from .runs import PlannedRun, RunSpec, cube_info, load_record, plan_run, run_dir, versions, write_record
from .train import test_block, train_run


@dataclass
class EvaluateResult:
    records: list[dict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # run ids already done
    encoder_items: dict[str, int] = field(default_factory=dict)  # cache key -> items encoded now


def plan(runs: list[RunSpec], cfg: TrainConfig, storage_options: dict | None = None) -> list[PlannedRun]:
    """Plan every run up front: an incomplete cube or a model that does not fit fails before any work."""
    cubes = {}
    planned = []
    for r in runs:
        if r.cube not in cubes:
            cubes[r.cube] = cube_info(r.cube, storage_options)
        planned.append(plan_run(r, cubes[r.cube], cfg))
    return planned


def _cache_spec(p: PlannedRun) -> CacheSpec:
    return CacheSpec(model=p.spec.model, cube_url=p.cube.url, cube_checksum=p.cube.checksum, bands=p.cube.bands,
                     inputs=p.inputs, mode=p.mode, input_size=p.input_size, tile=p.cube.tile,
                     crops_per_sample=p.config.crops_per_sample, feature_dtype=p.config.feature_dtype, weights=p.weights)


def evaluate(runs: list[RunSpec], out: str, config: TrainConfig | None = None, client=None, progress: bool = True,
             storage_options: dict | None = None, save_predictions: bool = True) -> EvaluateResult:
    """Run (or resume) the given runs; returns the records written to `out`/results.jsonl."""
    from .cluster import get_client, gpu_resources

    cfg = config or TrainConfig()
    client = get_client(client)
    resources = gpu_resources(client)
    threads = cfg.threads or _worker_threads(client)
    planned = plan(runs, cfg, storage_options)
    res = EvaluateResult()
    todo = []
    for p in planned:
        if (rec := load_record(out, p.run_id)) is not None and rec.get("status") == "ok":
            res.skipped.append(p.run_id)
        else:
            todo.append(p)
    if not todo:
        return res

    # 1. feature caches for frozen runs (shared by all runs with the same model, cube and inputs)
    caches: dict[str, tuple[CacheSpec, str, PlannedRun]] = {}
    for p in todo:
        if p.kind == "frozen":
            cs = _cache_spec(p)
            caches.setdefault(cs.key, (cs, cache_url(out, cs), p))
    encoder_params: dict[str, int] = {}
    feat_time: dict[str, float] = {}
    tasks, owners = [], []
    t_feat = time.perf_counter()
    facts = {key: client.submit(encoder_facts, {"spec": cs, "threads": threads}, pure=False, resources=resources)
             for key, (cs, _, _) in caches.items()}
    for key, (cs, url, p) in caches.items():
        shapes, encoder_params[key] = facts[key].result()
        res.encoder_items[key] = 0
        for split in ("train", "val", "test"):
            samples = p.cube.samples(split)
            pl = create_split(url, split, samples, cs, shapes, cfg.block_samples)
            if not pl["complete"]:
                for t in block_tasks(url, split, samples, cs, pl, cfg.block_samples, threads):
                    tasks.append(t)
                    owners.append((key, split))
    if tasks:
        futs = client.map(extract_block, tasks, pure=False, resources=resources)
        done = gather(futs, "extract features", sum(t["samples"].size for t in tasks), progress,
                      lambda i, r: tasks[i]["samples"].size)
        for (key, _), r in zip(owners, done):
            res.encoder_items[key] += r["items"]
            feat_time[key] = feat_time.get(key, 0.0) + r["seconds"]
    features_wall = time.perf_counter() - t_feat if tasks else 0.0  # all caches of this call, on all workers
    for key, (cs, url, p) in caches.items():
        for split in ("train", "val", "test"):
            g = _store.open_group(url, "r")[split]
            if "cryocube_features_complete" not in g.attrs:
                mark_complete(url, split, res.encoder_items[key])

    # 2. train every run (one task each), then 3. test blocks reduced to one confusion matrix per run
    train_tasks = [_train_task(p, out, caches, threads, save_predictions) for p in todo]
    train_futs = {client.submit(train_run, t, pure=False, resources=resources, key=f"train-{t['run_id']}"): i
                  for i, t in enumerate(train_tasks)}
    from distributed import as_completed

    started = {i: time.perf_counter() for i in range(len(todo))}
    ac = as_completed(list(train_futs))
    test_futs: dict = {}
    with progress_bar("train + test runs", total=len(todo), enabled=progress) as bar:
        for fut in ac:
            if fut in train_futs:
                i = train_futs[fut]
                p, t = todo[i], train_tasks[i]
                try:
                    tr = fut.result()
                except Exception as e:  # a failed run is recorded; the others go on
                    res.records.append(_error_record(p, e, out))
                    bar.advance(1)
                    continue
                t0 = time.perf_counter()
                blocks = _test_tasks(p, t, out, save_predictions)
                parts = client.map(test_block, blocks, pure=False, resources=resources)
                total = tree_reduce_futures(client, parts)
                test_futs[total] = (i, tr, t0)
                ac.add(total)
            else:
                i, tr, t0 = test_futs.pop(fut)
                p = todo[i]
                try:
                    cm = np.asarray(fut.result())
                except Exception as e:
                    res.records.append(_error_record(p, e, out))
                    bar.advance(1)
                    continue
                test_s = time.perf_counter() - t0
                ck = _cache_spec(p).key if p.kind == "frozen" else None
                rec = _record(p, cm, tr, test_s, time.perf_counter() - started[i], feat_time.get(ck, 0.0) if ck else 0.0,
                              res.encoder_items.get(ck, 0) if ck else 0,
                              encoder_params.get(ck) if ck else tr.get("encoder_params"), client, out,
                              features_wall if ck else 0.0)
                write_record(out, rec)
                res.records.append(rec)
                bar.advance(1)
    return res


def _worker_threads(client) -> int:
    info = client.scheduler_info()["workers"]
    return max(1, min(w.get("nthreads", 1) for w in info.values())) if info else 1


def _train_task(p: PlannedRun, out: str, caches, threads: int, save_predictions: bool) -> dict:
    t = {
        "run_id": p.run_id, "kind": p.kind, "model": p.spec.model, "bands": p.cube.bands, "inputs": p.inputs,
        "mode": p.mode, "input_size": p.input_size, "tile": p.cube.tile, "num_classes": len(p.cube.class_names),
        "class_names": p.cube.class_names, "cube_url": p.cube.url, "weights": p.weights, "config": p.config,
        "run_seed": p.run_seed, "train_samples": p.train_samples, "val_samples": p.cube.samples("val"),
        "threads": threads, "checkpoint": f"{run_dir(out, p.run_id)}/best.pt",
    }
    if p.kind == "frozen":
        t["cache_url"] = cache_url(out, _cache_spec(p))
    return t


def _test_tasks(p: PlannedRun, t: dict, out: str, save_predictions: bool) -> list[dict]:
    test = p.cube.samples("test")
    bs = p.config.block_samples
    purl = f"{run_dir(out, p.run_id)}/predictions.zarr" if save_predictions else None
    if purl:
        g = _store.open_group(purl, "w")
        g.create_array("pred", shape=(test.size, p.cube.tile, p.cube.tile), chunks=(1, p.cube.tile, p.cube.tile),
                       dtype="int16", fill_value=-1, dimension_names=("sample", "y", "x"))
        g.create_array("sample", data=test.astype(np.int64), dimension_names=("sample",))
        g.attrs.update({"cube": p.cube.url, "run_id": p.run_id, "classes": p.cube.class_names})
    tasks = []
    for b0 in range(0, test.size, bs):
        tt = dict(t)
        tt.update({"positions": np.arange(b0, min(b0 + bs, test.size)), "samples": test[b0 : b0 + bs],
                   "predictions_url": purl, "pred_range": (b0, min(b0 + bs, test.size))})
        tasks.append(tt)
    return tasks


def _base_record(p: PlannedRun) -> dict:
    return {"run_id": p.run_id, "model": p.spec.model, "model_name": p.model_name, "dataset": p.cube.dataset,
            "protocol": p.spec.protocol, "fraction": p.fraction, "seed": p.spec.seed, "kind": p.kind,
            "cube": {"url": p.cube.url, "checksum": p.cube.checksum}, "config": p.config.as_dict(),
            "input_size": p.input_size, "band_mode": p.mode, "band_index": list(p.inputs.index),
            "subset": p.train_samples.tolist() if p.fraction < 1 else None, "versions": versions()}


def _error_record(p: PlannedRun, e: BaseException, out: str) -> dict:
    rec = _base_record(p) | {"status": "error", "error": f"{type(e).__name__}: {e}",
                             "traceback": "".join(traceback.format_exception(e))[-4000:]}
    write_record(out, rec)
    return rec


def _record(p, cm, tr, test_s, total_s, features_s, encoder_items, encoder_params, client, out, features_wall_s=0.0) -> dict:
    from ..models import model_spec
    from .cluster import cluster_info

    metrics = metrics_from_confusion(cm, p.cube.class_names)
    spec = model_spec(p.spec.model)
    return _base_record(p) | {
        "status": "ok", "error": None, "metrics": metrics, "confusion_matrix": cm.tolist(),
        "val_curve": tr["val_curve"], "best_epoch": tr["best_epoch"],
        # features_s: worker seconds spent on this run's cache; features_wall_s: the extraction phase's wall time
        "timings": {"features_s": features_s, "features_wall_s": features_wall_s, "train_s": tr["train_s"],
                    "test_s": test_s, "total_s": total_s},
        "samples_per_s": tr["train_samples_per_s"], "peak_memory_mb": tr["peak_memory_mb"], "device": tr["device"],
        "encoder_forward_items": encoder_items, "steps": tr["steps"],
        "params": {"encoder": encoder_params, "trainable": tr["trainable_params"],
                   "decoder": tr["trainable_params"] - (tr["encoder_params"] if p.kind == "finetune" else 0)},
        "gflops": spec.gflops, "cluster": cluster_info(client),
        "predictions": f"{run_dir(out, p.run_id)}/predictions.zarr",
    }


def runs_from_grid(models: list[str], cubes: list[str], protocols: list[str], fractions: list[float | None], seeds: list[int]) -> list[RunSpec]:
    out = []
    for c in cubes:
        for m in models:
            for pr in protocols:
                for f in fractions:
                    for s in seeds:
                        out.append(RunSpec(model=m, cube=c, protocol=pr, fraction=f, seed=s))
    if not out:
        raise UserError("no runs selected")
    return out
