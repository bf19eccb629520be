"""`cryocube probe`: NeuCo-Bench scoring of an embedding matrix, one Dask task per (task, split).

Embeddings come from a submission CSV or an embedding store (`cryocube embed`); tasks from a
NeuCo-Bench labels folder (`<task>__<cls|regr>.csv`) or derived from any cryocube cube: a sample
cube's own targets, or, for a tile cube, per class `<class>_present__cls` (the class occurs in the
tile) and `<class>_fraction__regr` (its share of the labelled pixels; e.g. lake fraction on GLD).
The protocol: NaN -> 0, zero-padding, one global scalar standardisation, labels min-max scaled per
task, `ShuffleSplit(k, test_size=0.1, random_state=42)`, one probe per split (seed + split), Q_t over
the k scores, overall Q = mean Q_t (cryocube.families.embedding.neuco).
"""
from __future__ import annotations

import hashlib
import inspect
import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ... import store as _store
from ...errors import UserError, task_boundary
from .neuco import NeuCoError, pad_to, shuffle_splits, standardize, summarize
from .probes import PROBES, check_labels, fold_score

_X: dict[str, np.ndarray] = {}  # per worker: the standardised matrix of an embedding store, read once
_INT = ("an integer >= 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1)
_POS = ("a number > 0", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0)
FIELD_RULES = {"epochs": _INT, "batch_size": _INT, "k": _INT, "max_iter": _INT, "lr": _POS, "temperature": _POS, "C": _POS,
               "weight_decay": ("a number >= 0", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0)}
DEFAULTS = {"linear": {"epochs": 10, "lr": 1e-3, "batch_size": 64}}  # NeuCo-Bench's challenge probe


@dataclass(frozen=True)
class ProbeRecipe:
    """The scoring protocol (defaults: NeuCo-Bench's challenge configuration)."""

    probe: str = "linear"
    k: int = 10
    test_size: float = 0.1
    split_seed: int = 42
    seed: int = 42
    dim: int | None = None  # pad to this width (a submission's 1024); None: as given
    max_nan_fraction: float = 0.3
    params: tuple[tuple[str, Any], ...] = ()  # the probe's own fields, over its DEFAULTS

    def check(self) -> "ProbeRecipe":
        if self.probe not in PROBES:
            raise UserError(f"--probe must be one of {', '.join(PROBES)}, got {self.probe!r}")
        if self.k < 1:
            raise UserError(f"--k must be >= 1 (probes per task), got {self.k}")
        if not 0 < self.test_size < 1:
            raise UserError(f"test_size must be in (0, 1), got {self.test_size}")
        fields = [n for n, q in inspect.signature(PROBES[self.probe]).parameters.items()
                  if q.kind is q.KEYWORD_ONLY and n != "seed"]
        for name, v in self.probe_params().items():
            shown = "knn_k" if (self.probe, name) == ("knn", "k") else name  # --k is the number of splits
            if name not in fields:
                raise UserError(f"the {self.probe} probe has no field {shown!r} (it takes: "
                                f"{', '.join('knn_k' if f == 'k' and self.probe == 'knn' else f for f in fields)})")
            rule, ok = FIELD_RULES.get(name, ("", lambda v: True))
            if not ok(v):
                raise UserError(f"probe field {shown} must be {rule}, got {v!r}")
        return self

    def probe_params(self) -> dict[str, Any]:
        return {**DEFAULTS.get(self.probe, {}), **dict(self.params)}

    def as_dict(self) -> dict[str, Any]:
        return {"probe": self.probe, "k": self.k, "test_size": self.test_size, "split_seed": self.split_seed,
                "seed": self.seed, "dim": self.dim, "max_nan_fraction": self.max_nan_fraction, **self.probe_params()}


def probe_recipe(probe: str = "linear", k: int = 10, overrides: dict | None = None, dim: int | None = None) -> ProbeRecipe:
    """The recipe, with `key=value` overrides: recipe fields or probe parameters (epochs, lr, k_neighbours...)."""
    r = ProbeRecipe(probe=probe, k=k, dim=dim)
    params: dict[str, Any] = {}
    fields = {"k", "test_size", "split_seed", "seed", "max_nan_fraction", "dim"}
    for key, v in (overrides or {}).items():
        v = _number(key, v)
        if key in fields:
            r = replace(r, **{key: v})
        elif key == "knn_k":
            params["k"] = int(v)
        else:
            params[key] = v
    return replace(r, params=tuple(sorted(params.items()))).check()


def _number(key: str, v: Any) -> Any:
    """YAML reads `1e-3` as a string: probe fields are numbers, said so in one sentence when not."""
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            try:
                return float(v)
            except ValueError:
                raise UserError(f"probe field {key} must be a number, got {v!r}") from None
    return v


# -- tasks -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    name: str  # <name>__<cls|regr>
    kind: str
    labels: dict[str, float]  # id -> label (unlabelled ids left out)


def tasks_from_labels(folder: str) -> list[Task]:
    """A NeuCo-Bench labels folder (`<task>__<cls|regr>.csv`, columns id,label)."""
    from ...convert.ssl4eo import read_label_csvs

    found = read_label_csvs(folder)
    if not found:
        raise UserError(f"{folder}: no <task>__<cls|regr>.csv label files")
    return [Task(f"{t}__{kind}", kind, values) for t, (kind, values) in found.items()]


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "class"


def tasks_from_cube(url: str) -> list[Task]:
    """Image-level tasks of a cube: a sample cube's targets; a tile cube's class presence and fraction."""
    from ...cube import as_text, open_cube

    ds = open_cube(url)
    ids = [str(i) for i in as_text(ds["source"].values)]
    if ds.attrs.get("kind") == "samples":
        target = np.asarray(ds["target"].values, dtype=np.float64)
        return [Task(f"{t}__{k}", k, {i: float(v) for i, v in zip(ids, target[:, j]) if np.isfinite(v)})
                for j, (t, k) in enumerate(zip(as_text(ds["task"].values), as_text(ds["task_type"].values)))]
    frac = np.asarray(ds["class_fraction"].values, dtype=np.float64)  # share of each class among labelled pixels
    labelled = frac.sum(axis=1) > 0
    out = []
    for c, name in enumerate(as_text(ds["class"].values)):
        f = frac[:, c]
        pres = (f > 0).astype(float)
        if np.unique(pres[labelled]).size == 2:  # a class in every tile (or none) is no task
            out.append(Task(f"{_slug(name)}_present__cls", "cls", {i: v for i, v, ok in zip(ids, pres, labelled) if ok}))
        if np.ptp(f[labelled]) > 0 if labelled.any() else False:
            out.append(Task(f"{_slug(name)}_fraction__regr", "regr", {i: v for i, v, ok in zip(ids, f, labelled) if ok}))
    if not out:
        raise UserError(f"{url}: no class varies between tiles, so no image-level task can be derived")
    return out


def align(ids: list[str], tasks: list[Task]) -> list[tuple[Task, np.ndarray, np.ndarray]]:
    """(task, embedding rows, labels) per task; a labelled id without an embedding is an error."""
    from .submission import strip_id

    pos = {strip_id(i): r for r, i in enumerate(ids)}
    out = []
    for t in tasks:
        missing = [i for i in t.labels if strip_id(i) not in pos]
        if missing:
            raise UserError(f"task {t.name}: {len(missing)} labelled ids have no embedding, e.g. {missing[0]!r}")
        rows = np.array([pos[strip_id(i)] for i in t.labels], dtype=np.int64)
        y = np.array(list(t.labels.values()), dtype=np.float64)
        check_labels(y, t.kind, t.name)  # here, not in the k fold tasks of the workers
        out.append((t, rows, y))
    return out


def tasks_digest(tasks: list[Task]) -> str:
    h = hashlib.sha256()
    for t in sorted(tasks, key=lambda t: t.name):
        h.update(t.name.encode())
        for i, v in sorted(t.labels.items()):
            h.update(f"{i}={v!r};".encode())
    return h.hexdigest()[:16]


# -- the fold tasks --------------------------------------------------------------------------------


@dataclass(frozen=True)
class FoldTask:
    url: str | None  # embedding store the worker reads (None: the matrix comes as the task's second argument)
    digest: str  # of the embedding matrix (worker cache key)
    task: str
    kind: str
    rows: np.ndarray
    y: np.ndarray
    fold: int
    train: np.ndarray  # positions in rows
    test: np.ndarray
    recipe: ProbeRecipe


def standardized(X: np.ndarray, dim: int | None) -> np.ndarray:
    """NeuCo-Bench's input: zero-padded to `dim`, then NaN -> 0 and one global scalar standardisation."""
    return standardize(pad_to(X, dim) if dim else X)


def _matrix(t: FoldTask) -> np.ndarray:
    X = _X.get(t.digest)
    if X is None:
        from .embed import load_embeddings

        _, E, _, _ = load_embeddings(t.url)
        _X.clear()
        X = _X[t.digest] = standardized(E, t.recipe.dim)
    return X


@task_boundary
def probe_fold(t: FoldTask, X: np.ndarray | None = None) -> dict[str, list]:
    """One probe on one split of one task -> {task: [(fold, score)]} (the reduce merges these)."""
    from ...cluster.runtime import torch_task

    with torch_task(1):  # a linear probe is tiny: one thread each, many tasks side by side
        X = _matrix(t) if X is None else X
        s = fold_score(X[t.rows], t.y, t.kind, t.train, t.test, t.recipe.probe, t.recipe.seed + t.fold, task=t.task,
                       **t.recipe.probe_params())
    return {t.task: [(t.fold, float(s))]}


def merge(a: dict, b: dict) -> dict:
    out = {k: list(v) for k, v in a.items()}
    for k, v in b.items():
        out.setdefault(k, []).extend(v)
    return out


def fold_tasks(aligned, recipe: ProbeRecipe, url: str | None, digest: str) -> list[FoldTask]:
    out = []
    for task, rows, y in aligned:
        try:
            splits = shuffle_splits(rows.size, recipe.k, test_size=recipe.test_size, seed=recipe.split_seed)
        except NeuCoError as e:
            raise UserError(f"task {task.name}: {e}") from None
        out += [FoldTask(url, digest, task.name, task.kind, rows, y, f, tr, te, recipe) for f, (tr, te) in enumerate(splits)]
    return out


def task_scores(total: dict[str, list]) -> dict[str, list[float]]:
    return {t: [s for _, s in sorted(v)] for t, v in sorted(total.items())}


def finish_scores(scores: dict[str, list[float]], recipe: ProbeRecipe) -> dict[str, Any]:
    """NeuCo-Bench's summary, with the NaN rule applied: a task with too many NaN probes has Q NaN."""
    summary = summarize(scores)
    for t in summary["tasks_failing_nan_rule"]:
        summary["task_q_scores"][t] = math.nan
    if summary["tasks_failing_nan_rule"]:
        summary["overall_q_score"] = math.nan
    return summary


@dataclass
class ProbeResult:
    summary: dict
    record: dict
    out: str
    scores: dict[str, list[float]] = field(default_factory=dict)


def run_probes(X: np.ndarray, ids: list[str], tasks: list[Task], recipe: ProbeRecipe, client=None,
               progress: bool = True) -> dict[str, list[float]]:
    """k probes per task, as Dask tasks over one scattered matrix (in this process without a client)."""
    from ...progress import gather, progress_bar

    Xs = standardized(X, recipe.dim)
    digest = hashlib.sha256(Xs.tobytes()).hexdigest()[:16]
    folds = fold_tasks(align(ids, tasks), recipe, None, digest)
    total: dict = {}
    if client is None:
        with progress_bar(f"probe ({recipe.probe})", len(folds), progress) as bar:
            for f in folds:
                total = merge(total, probe_fold(f, Xs))
                bar.advance(1)
    else:
        xf = client.scatter(Xs, broadcast=True)
        futs = [client.submit(probe_fold, f, xf, pure=False, key=f"cryocube-probe-{f.task}-{f.fold}-{digest}") for f in folds]
        for part in gather(futs, f"probe ({recipe.probe})", len(folds), progress, lambda i, r: 1):
            total = merge(total, part)
    return task_scores(total)


def read_embedding_input(path: str, dim: int | None) -> tuple[list[str], np.ndarray, dict]:
    """A submission CSV (validated by the challenge rules) or an embedding store -> (ids, X, provenance)."""
    if path.rstrip("/").endswith(".csv"):
        from .submission import read_submission

        ids, X, notes = read_submission(path, None, dim, strict=dim is not None)
        return ids, X, {"source": path, "format": "csv", **({"notes": notes} if notes else {})}
    if not _store.exists(path):
        raise UserError(f"{path}: no such embedding store or submission CSV")
    from .embed import load_embeddings

    ids, X, _, attrs = load_embeddings(path)
    return ids, X, {"format": "zarr", **attrs}


def probe_inputs(embeddings: str, recipe: ProbeRecipe, labels: str | None = None, tasks_from: str | None = None):
    """(ids, X, provenance, tasks), every input checked: what `probe` reads before any cluster starts."""
    if (labels is None) == (tasks_from is None):
        raise UserError("probe needs exactly one of --labels DIR and --tasks-from CUBE")
    ids, X, prov = read_embedding_input(embeddings, recipe.dim)
    tasks = tasks_from_labels(labels) if labels else tasks_from_cube(tasks_from)
    align(ids, tasks)  # every labelled id has a vector, every task's labels can be probed
    return ids, X, prov, tasks


def probe_embeddings(embeddings: str, out: str, recipe: ProbeRecipe, labels: str | None = None,
                     tasks_from: str | None = None, client=None, progress: bool = True, inputs=None) -> ProbeResult:
    """`cryocube probe`: score one embedding matrix; writes NeuCo-Bench's result files into `out` and a
    run record (family embedding) into `out`/results.jsonl. Everything is checked before any probe runs
    (`inputs`: what `probe_inputs` returned, read before the caller started its cluster)."""
    import datetime as _dt

    from ...engine.records import write_record
    from ..base import content_hash
    from .neuco import write_results

    ids, X, prov, tasks = inputs or probe_inputs(embeddings, recipe, labels, tasks_from)
    digest = hashlib.sha256(np.ascontiguousarray(X, dtype=np.float32).tobytes()).hexdigest()
    identity = {"family": "embedding", "embedding": digest, "tasks": tasks_digest(tasks), "probe": recipe.as_dict(), "v": 1}
    run_id = content_hash(identity)
    scores = run_probes(X, ids, tasks, recipe, client, progress)
    summary = finish_scores(scores, recipe)
    meta = {"run_id": run_id, "embeddings": embeddings, "probe": recipe.as_dict(),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat()}
    write_results(out, scores, meta, summary)
    cube = prov.get("cube") or {}
    source = prov.get("source", embeddings)
    record = {"run_id": run_id, "family": "embedding", "model": source,
              "model_name": prov.get("model_name") or source, "dataset": cube.get("dataset") or
              (tasks_from.rstrip("/").rsplit("/", 1)[-1].removesuffix(".zarr") if tasks_from else "labels"),
              "protocol": "probe", "fraction": 1.0, "seed": recipe.seed, "status": "ok", "error": None,
              "cube": cube or None, "embedding": {"input": embeddings, "sha256": digest, "format": prov.get("format"),
                                                  "dim": int(X.shape[1]), "pca": prov.get("pca")},
              "weights": prov.get("weights") or {"source": "unknown (vectors made elsewhere)"},
              "precision": prov.get("precision") or {"effective": prov.get("precision", "unknown")},
              "probe": recipe.as_dict(), "tasks": sorted(t.name for t in tasks),
              "labels": labels or tasks_from, "identity": identity, "primary_metric": "Q",
              "metrics": {"Q": summary["overall_q_score"], "A": summary["overall_acc_score"],
                          "task_Q": summary["task_q_scores"], "task_A": summary["task_acc_scores"]},
              "summary_file": f"{out.rstrip('/')}/results_summary.json"}
    rec = write_record(out, record)
    return ProbeResult(summary, rec, out, scores)
