"""`cryocube probe` is one run of the embedding family on the engine's scheduler (no loop of its
own): its record says which cluster scored it, its scores equal the in-process path's bit for bit,
and the same command again resumes (the cached run is shown, not recomputed)."""

from __future__ import annotations

import json

import numpy as np

from cryocube.cli import main
from cryocube.embeddings.submission import write_submission
from cryocube.families.embedding.probe import probe_recipe
from cryocube.families.embedding.work import probe_embeddings


def _inputs(tmp_path):
    rng = np.random.default_rng(3)
    ids = [f"loc{i:03d}" for i in range(60)]
    y = rng.normal(size=60)
    X = rng.normal(size=(60, 8)).astype(np.float32)
    X[:, :2] += 2 * y[:, None]
    emb = write_submission(tmp_path / "emb.csv", ids, X)
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "sig__regr.csv").write_text(
        "id,label\n" + "".join(f"{i},{float(v)!r}\n" for i, v in zip(ids, y))
    )
    (tmp_path / "labels" / "pos__cls.csv").write_text(
        "id,label\n" + "".join(f"{i},{int(v > 0)}\n" for i, v in zip(ids, y))
    )
    return str(emb), str(tmp_path / "labels")


def test_probe_command_runs_on_the_scheduler_and_resumes(tmp_path, client, capsys):
    emb, labels = _inputs(tmp_path)
    out = tmp_path / "out"
    argv = [
        "probe",
        emb,
        "--labels",
        labels,
        "--out",
        str(out),
        "--k",
        "3",
        "--set",
        "epochs=2",
        "--cluster",
        client.scheduler.address,
        "--quiet",
    ]
    assert main(argv) == 0
    first = capsys.readouterr().out
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    # the engine recorded it
    assert rec["status"] == "ok" and rec["cluster"]["scheduler"] == client.scheduler.address
    assert rec["summary_file"] in first and "overall Q" in first

    here = probe_embeddings(
        emb,
        str(tmp_path / "here"),
        probe_recipe("linear", 3, {"epochs": 2}),
        labels=labels,
        progress=False,
    )
    assert here.record["run_id"] == rec["run_id"]
    # the same folds, seeds and arithmetic on the workers
    assert here.record["metrics"] == rec["metrics"]
    there = json.loads((out / "runs" / rec["run_id"] / "results_summary.json").read_text())
    assert here.scores == there["task_fold_scores"]

    assert main(argv) == 0  # again: the run is cached, shown as before, not run a second time
    assert capsys.readouterr().out == first
    assert (out / "results.jsonl").read_text().splitlines() == lines
