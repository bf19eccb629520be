"""The two kinds of probe run the embedding family takes through the engine's stages.

`CubeProbe` (`evaluate --protocol probe`): a model's embeddings of a cube, made in `prepare`, probed
on the cube's tasks. `MatrixProbe` (`cryocube probe`, planned by `probe_run`): vectors made
elsewhere (a submission CSV or an embedding store), placed on the workers once in `prepare` and
probed on the given tasks. Both score one Dask task per (task, split) and write NeuCo-Bench's result
files into the run's folder. `probe_embeddings` scores a `MatrixProbe` in this process, for library
use without a cluster.
"""

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
    probe_inputs,
    run_probes,
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
        return [
            (probe_fold, t)
            for t in fold_tasks(
                align(ids, self.tasks, self.probe.fold_order), self.probe, self.url, digest
            )
        ]

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
        return [
            (probe_fold_on, (f, self.matrix))
            for f in fold_tasks(self.aligned, self.probe, None, self.digest)
        ]

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


def matrix_probe(inputs, recipe, out: str, embeddings: str) -> MatrixProbe:
    """The standardised matrix and its folds' rows; a task too small to split is refused here."""
    aligned, Xs, digest = standardized_matrix(inputs.X, inputs.ids, inputs.tasks, recipe)
    fold_tasks(aligned, recipe, None, digest)
    return MatrixProbe(Xs, digest, aligned, recipe, out, embeddings)


def probe_run(
    embeddings: str,
    out: str,
    recipe,
    inputs,
    labels: str | None = None,
    tasks_from: str | None = None,
):
    """`cryocube probe`'s one run, for the engine: its id hashes the vectors, tasks and recipe."""
    from .. import get
    from ..base import Resolved, RunSpec

    X, prov, tasks = inputs.X, inputs.prov, inputs.tasks
    digest = sha256(np.ascontiguousarray(X, dtype=np.float32).tobytes()).hexdigest()
    source = prov.get("source", embeddings)
    work = matrix_probe(inputs, recipe, out, embeddings)
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
    return get("embedding").planned(spec, resolved, seed=None)


def probe_embeddings(
    embeddings: str,
    out: str,
    recipe,
    labels: str | None = None,
    tasks_from: str | None = None,
    progress: bool = True,
    inputs=None,
):
    """Score one embedding matrix in this process: NeuCo-Bench's result files into `out`, a run
    record into `out`/results.jsonl, every input checked first (`inputs`: read already). `cryocube
    probe` hands the same run (`probe_run`) to the engine."""
    reads = probe_inputs(embeddings, labels, tasks_from)
    outputs.claim(out, "results", "probe", inputs=reads, write_marker=False)
    inputs = inputs or load_probe_inputs(embeddings, recipe, labels, tasks_from)
    run = probe_run(embeddings, out, recipe, inputs, labels, tasks_from)
    outputs.mark(out, "results", "probe")
    scores = run_probes(inputs.X, inputs.ids, inputs.tasks, recipe, progress=progress)
    total = {t: list(enumerate(v)) for t, v in scores.items()}
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
