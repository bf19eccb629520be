"""The embedding family's two kinds of run: `CubeProbe` (`evaluate --protocol probe`) embeds a cube
in `prepare`, `MatrixProbe` (`cryocube probe`) scatters vectors made elsewhere to the workers."""

from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass
from hashlib import sha256
from typing import Any

import numpy as np

from ... import outputs
from ... import store as _store
from ...embeddings.embed import load_embeddings, prepare_store
from ...record import run_dir, write_record
from .neuco import write_results
from .probe import (
    ProbeResult,
    align,
    differences,
    finish_scores,
    fold_tasks,
    load_probe_inputs,
    probe_fold,
    score_here,
    standardized_matrix,
    task_scores,
    tasks_digest,
)


def probe_fold_on(task: tuple) -> dict[str, list]:
    """`probe_fold` on a matrix passed beside the fold (the scattered one: workers hold it once)."""
    return probe_fold(*task)


@dataclass
class CubeProbe:
    embed: Any  # the EmbedSpec `prepare` runs
    probe: Any  # ProbeRecipe
    tasks: list  # probe.Task
    url: str  # the embedding store

    def prepare(self, runner, run) -> dict:
        """Embeds (or reuses) the run's store; the facts its records keep."""
        return prepare_store(self.embed, run.cube, self.url, runner, run.record.weights)

    def folds(self) -> list:
        """Fold tasks that read the store on the workers (once per worker, cached by its sha256)."""
        ids, _, _, attrs = load_embeddings(self.url)
        digest = str(attrs.get("embedding_sha256", ""))[:16]
        aligned = align(ids, self.tasks, self.probe.fold_order)
        return [(probe_fold, t) for t in fold_tasks(aligned, self.probe, self.url, digest)]

    def results(self, run) -> tuple[str, dict]:
        """(the run's folder, the meta of its results_summary.json)."""
        url = run.record.fields["embedding"]["url"]
        rdir = f"{url.rsplit('/embeddings/', 1)[0]}/runs/{run.run_id}"
        return rdir, {
            "run_id": run.run_id,
            "model": run.spec.model,
            "dataset": run.dataset,
            "probe": run.record.fields["probe"],
            "differences": run.record.fields["neuco_bench_differences"],
        }

    def fields(self, run, prepared: dict) -> dict:
        """The record's embedding, threads, timings from `prepare` (shared by one store's runs)."""
        prep = prepared.get(run.prep_key, {})
        made = {"sha256": prep.get("embedding_sha256"), "pca": prep.get("pca")}
        return {
            "embedding": run.record.fields["embedding"] | made,
            "threads": {"embed": prep.get("threads", [])},
            "timings": {"embed_s": prep.get("embed_s", 0.0), "train_s": 0.0},
        }


@dataclass
class MatrixProbe:
    X: np.ndarray  # standardised as the recipe says (what every fold reads)
    digest: str  # of X (the folds' cache key)
    aligned: list  # (task, rows, labels) per task
    probe: Any  # ProbeRecipe
    out: str
    embeddings: str  # what the user gave (for the summary's meta)
    matrix: Any = None  # X on the workers, once `prepare` placed it there

    def prepare(self, runner, run) -> dict:
        """Scatters the standardised matrix to the workers once; fold tasks take the future."""
        self.matrix = runner.scatter(self.X)
        return {}

    def folds(self) -> list:
        """Fold tasks taking the scattered matrix (`probe_fold_on`): vectors made elsewhere."""
        folds = fold_tasks(self.aligned, self.probe, None, self.digest)
        return [(probe_fold_on, (f, self.matrix)) for f in folds]

    def results(self, run) -> tuple[str, dict]:
        """A folder per run under `out`: a second probe never overwrites files a record names."""
        return run_dir(self.out, run.run_id), {
            "run_id": run.run_id,
            "embeddings": self.embeddings,
            "probe": self.probe.record(),
            "differences": run.record.fields["neuco_bench_differences"],
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        }

    def fields(self, run, prepared: dict) -> dict:
        """Nothing: `probe_run` put the vectors' provenance into the record when planning."""
        return {}


def finish_fields(run, total: dict, prepared: dict) -> dict:
    """A probe run's record fields from its merged fold scores; result files into its folder."""
    scores = task_scores(total)
    summary = finish_scores(scores, run.work.probe)
    rdir, meta = run.work.results(run)
    write_results(rdir, scores, meta, summary)
    return {
        "metrics": {
            "Q": summary["overall_q_score"],
            "A": summary["overall_acc_score"],
            "task_Q": summary["task_q_scores"],
            "task_A": summary["task_acc_scores"],
        },
        "primary_metric": "Q",
        # each task's fold scores: the report's interval of Q over folds (docs/statistics.md)
        "task_folds": summary["task_fold_scores"],
        "summary_file": f"{rdir}/results_summary.json",
        **run.work.fields(run, prepared),
    }


def probe_run(embeddings: str, out: str, recipe, labels: str | None, tasks_from: str | None):
    """`cryocube probe`'s one run: `out` claimed and every input checked before any cluster."""
    from .. import get
    from ..base import Resolved, RunSpec

    reads = [("EMBEDDINGS", embeddings), ("--labels", labels), ("--tasks-from", tasks_from)]
    outputs.claim(out, "results", "probe", inputs=reads, write_marker=False)  # marked once checked
    inputs = load_probe_inputs(embeddings, recipe, labels, tasks_from)
    X, prov, tasks = inputs.X, inputs.prov, inputs.tasks
    digest = sha256(np.ascontiguousarray(X, dtype=np.float32).tobytes()).hexdigest()
    source = prov.get("source", embeddings)
    aligned, Xs, key = standardized_matrix(X, inputs.ids, tasks, recipe)
    fold_tasks(aligned, recipe, None, key)  # a task too small to split is refused here
    work = MatrixProbe(Xs, key, aligned, recipe, out, embeddings)
    label_set = tasks_digest(tasks)
    cube = prov.get("cube") or {}
    folder = tasks_from.rstrip("/").rsplit("/", 1)[-1].removesuffix(".zarr") if tasks_from else None
    resolved = Resolved(
        # no seed of its own: the probe recipe's is in `probe`
        identity={"embedding": digest, "tasks": label_set, "probe": recipe.as_dict()},
        model_name=prov.get("model_name") or source,
        weights=prov.get("weights") or {"source": "unknown (vectors made elsewhere)"},
        precision=prov.get("precision") or {"effective": prov.get("precision", "unknown")},
        fields={
            "embedding": {
                "input": embeddings,
                "sha256": digest,
                "format": prov.get("format"),
                "dim": int(X.shape[1]),
                "pca": prov.get("pca"),
            },
            "probe": recipe.record(),
            "neuco_bench_differences": differences(recipe, tasks),
            "tasks": sorted(t.name for t in tasks),
            "labelled": {
                t.name: {"labelled": len(t.labels), "empty_label_skipped": t.n_unlabelled}
                for t in tasks
            },
            "labels": labels or tasks_from,
            "label_set": label_set,
        },
        work=work,
        cube=cube or None,
        dataset=cube.get("dataset") or folder or "labels",
        model=source,
        estimate={"steps": recipe.k * len(tasks)},
    )
    # the progress board names the run by the vectors' file and the tasks' folder (or cube)
    spec = RunSpec(
        source.rstrip("/").rsplit("/", 1)[-1], tasks_from or labels or "", "probe", seed=recipe.seed
    )
    outputs.mark(out, "results", "probe")
    return get("embedding").planned(spec, resolved, seed=None)


def probe_embeddings(
    embeddings: str,
    out: str,
    recipe,
    labels: str | None = None,
    tasks_from: str | None = None,
    progress: bool = True,
):
    """`cryocube probe`'s run scored in this process (library use): results and record in `out`."""
    run = probe_run(embeddings, out, recipe, labels, tasks_from)
    w = run.work
    total = score_here(w.aligned, w.X, w.digest, recipe, progress)
    rec = write_record(
        out, run.record.merged(finish_fields(run, total, {}) | {"status": "ok", "error": None})
    )
    return probe_result(rec, recipe, out)


def probe_result(rec: dict, recipe, out: str):
    """A record's scores and summary, read back from its results_summary.json (cached runs too)."""
    summary = json.loads(_store.read_text(rec["summary_file"]))
    scores = {
        t: [math.nan if s is None else s for s in v] for t, v in summary["task_fold_scores"].items()
    }
    return ProbeResult(finish_scores(scores, recipe), rec, out, scores)
