"""The vqa family end to end: tiny random VLMs (built from transformers configs, no downloads)
answer the InSAR-VLM-Bench questions about a synthetic interferogram cube on a real LocalCluster;
records, resume, identical reruns, refusals before any cluster starts, and a task added by YAML
alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from cryocube.families import RunSpec

ROOT = Path(__file__).resolve().parents[1]
SETS = ("block_samples=3", "gen_batch=3", "max_new_tokens=6")  # short answers keep the tests fast


@pytest.fixture(scope="module")
def ifg_cube(insar_cube):
    return insar_cube(n=8, size=32, seed=0)


def _evaluate(cube, out, client, model="transformers", overrides=(), allow_random=True, sets=SETS):
    from cryocube.engine.evaluate import evaluate
    from cryocube.families.recipes import load_recipe

    res = evaluate(
        [RunSpec(model, cube, "vqa", overrides=overrides)],
        str(out),
        load_recipe(None, list(sets)),
        client=client,
        progress=False,
        allow_random_weights=allow_random,
    )
    return res


def _answers(rec) -> list[dict]:
    return [json.loads(x) for x in Path(rec["answers_file"]).read_text().splitlines()]


def test_tiny_random_vlm_end_to_end(ifg_cube, tmp_path, client):
    from cryocube.cube import as_text, open_cube

    cube, m = ifg_cube
    res = _evaluate(cube, tmp_path / "out", client)
    (rec,) = res.records
    assert rec["status"] == "ok", rec.get("error")
    # the record says what produced it
    assert (
        rec["weights"]["random_init"]
        and len(rec["weights"]["sha256"]) == 64
        and rec["model_name"] == "tiny random llava"
    )
    assert (
        rec["precision"]["effective"] in ("fp32", "bf16")
        and rec["generation"]["do_sample"] is False
    )
    assert set(rec["tasks"]) == {
        "coherence_classification",
        "fringe_counting",
        "deformation_localization",
        "noise_assessment",
    }
    assert all(len(t["prompt_sha256"]) == 16 for t in rec["tasks"].values())
    rows = _answers(rec)
    ds = open_cube(cube)
    tasks = list(as_text(ds["task"].values))
    # every sample with a reference is asked: coherence classes and fringe counts are derived for
    # all 8 pairs
    for t in ("coherence_classification", "fringe_counting"):
        assert (
            sum(r["task"] == t for r in rows)
            == int(np.isfinite(ds["target"].values[:, tasks.index(t)]).sum())
            == 8
        )
    # the references are the cube's, and the cube's are the generator's truth
    truth = {p.id: p for p in m.pairs}
    for r in rows:
        if r["task"] == "fringe_counting":
            assert r["refs"]["mae"] == truth[r["source"]].fringes
        if r["task"] == "coherence_classification":
            assert (
                r["refs"]["accuracy"]
                == ("low", "medium", "high")[truth[r["source"]].coherence_class]
            )
    # unparsed answers are counted, scored as wrong, and the metrics are the means of the rows
    for t, d in rec["metrics"]["tasks"].items():
        mine = [r for r in rows if r["task"] == t]
        assert d["unparsed"] == rec["unparsed"][t] == sum(not r["ok"] for r in mine)
        for metric, s in d["metrics"].items():
            vals = [r["scores"][metric] for r in mine if metric in r["scores"]]
            k = 1.0 if metric == "mae" else 100.0
            assert s["value"] == pytest.approx(k * np.mean(vals)) and s["n"] == len(vals)
            assert s["ci_low"] <= s["value"] + 1e-9 and s["value"] <= s["ci_high"] + 1e-9
    cm = rec["metrics"]["tasks"]["coherence_classification"]["confusion"]["matrix"]
    assert sum(map(sum, cm)) == 8
    assert rec["generation_stats"]["blocks"] == 3 and rec["generation_stats"]["new_tokens"] > 0
    # where it generated: a GPU check reads this
    assert rec["generation_stats"]["devices"] == ["cpu"]
    assert (
        rec["gallery"]
        and (Path(rec["answers_file"]).parent / rec["gallery"][0]["picture"]).stat().st_size > 100
    )
    # the same command again is a cache hit
    again = _evaluate(cube, tmp_path / "out", client)
    assert again.skipped == [rec["run_id"]] and not again.records
    _check_report(tmp_path / "out", tmp_path / "report", rec, rows)


def _check_report(results, out, rec, rows):
    """`cryocube report` writes the vqa section, a LEADERBOARD.md in InSAR-VLM-Bench's shape and the
    gallery."""
    from cryocube.cli import main
    from cryocube.families.vqa.report import CANNOT, cubes, leaderboard
    from cryocube.report.records import load_results

    assert main(["report", str(results), "--out", str(out)]) == 0
    board = (out / "LEADERBOARD.md").read_text()
    acc = {(c["task"], c["metric"]): c for c in rec["metrics"]["cells"] if c["class"] is None}[
        ("coherence_classification", "accuracy")
    ]  # the board's cell: the cube's test split, with n
    assert (
        "| Model | Kind | Coherence Acc (%) | Localisation IoU (%) | Localisation F1 (%) | Fringe"
        " MAE (count) | Noise F1 (%)" in board
    )
    assert (
        f"| tiny random llava (random init) | VLM | {acc['value']:.2f} [{acc['ci_low']:.2f},"
        f" {acc['ci_high']:.2f}] n={acc['n']} |" in board
    )
    assert (
        "| chance | baseline: chance |" in board
        and "| blind | baseline: blind | blind: not run |" in board
    )
    html = (out / "report.html").read_text()
    gen = rec["generation_stats"]
    cost = rec["timings"]["generate_s"] / gen["questions_generated"]
    assert gen["questions_generated"] == len(rows)
    assert (
        f"tiny random llava (random init): {cost:.3g} s per example ({len(rows)} questions"
        " generated" in html
    )
    assert (
        "Gallery: sample" in html
        and rows[0]["prompt"][:40] in html
        and "data:image/png;base64" in html
    )
    # an encoder's probe run on the same cube stays out of the board (NeuCo-Bench's metric, on other
    # samples)
    res = load_results(results)
    emb = dict(
        rec,
        run_id="e" * 20,
        family="embedding",
        model="dofa",
        model_name="DOFA",
        primary_metric="Q",
        weights={"pretrained": True, "random_init": False},
        metrics={
            "Q": 0.5,
            "task_A": {"coherence_classification__cls": 0.61, "fringe_counting__regr": 0.2},
        },
    )
    from cryocube.report.records import parse_record

    res.of("embedding").append(parse_record(emb, "test"))
    t = leaderboard(res, next(c for c in cubes(res) if c.dataset == rec["dataset"]))
    assert "DOFA" not in [r[0] for r in t.rows] and CANNOT not in str(t.texts)


# a LLaVA (the default) and a Qwen2-VL
RANDOM_VLMS = ("transformers", "transformers:random-qwen2-vl")


@pytest.mark.parametrize("model", RANDOM_VLMS)
def test_same_run_twice_and_batching_give_identical_answers(ifg_cube, tmp_path, client, model):
    cube, _ = ifg_cube
    a = _evaluate(cube, tmp_path / "a", client, model=model).records[0]
    b = _evaluate(cube, tmp_path / "b", client, model=model).records[0]
    assert a["status"] == "ok", a.get("error")
    assert (
        a["run_id"] == b["run_id"]
        and a["model_name"] == f"tiny random {model.partition('random-')[2] or 'llava'}"
    )
    assert Path(a["answers_file"]).read_bytes() == Path(b["answers_file"]).read_bytes()
    # left padding: a row's answer does not depend on what it was batched with
    one = _evaluate(
        cube, tmp_path / "c", client, model=model, overrides=(("gen_batch", 1),)
    ).records[0]
    assert one["run_id"] != a["run_id"]
    assert [r["answer"] for r in _answers(one)] == [r["answer"] for r in _answers(a)]


def test_two_random_architectures_are_two_models(ifg_cube, tmp_path, client, capsys):
    """`transformers:random-<arch>` picks the architecture: its own weights, run id and name;
    `cryocube list adapters` names them; an unknown one is one sentence."""
    from cryocube.cli import main

    cube, _ = ifg_cube
    recs = {
        r["model"]: r
        for r in _evaluate(cube, tmp_path / "out", client, model=RANDOM_VLMS[1]).records
    }
    recs.update(
        {
            r["model"]: r
            for r in _evaluate(
                cube, tmp_path / "out", client, model="transformers:random-llava"
            ).records
        }
    )
    q, ll = recs["transformers:random-qwen2-vl"], recs["transformers:random-llava"]
    assert (
        q["model_class"] == "Qwen2VLForConditionalGeneration"
        and ll["model_class"] == "LlavaForConditionalGeneration"
    )
    assert q["run_id"] != ll["run_id"] and q["weights"]["sha256"] != ll["weights"]["sha256"]
    assert q["identity"]["model"]["random"] == "qwen2-vl" and q["weights"]["random_init"]
    assert main(["list", "adapters"]) == 0
    assert "transformers:random-llava, transformers:random-qwen2-vl" in capsys.readouterr().out
    err = _refused(
        [
            "evaluate",
            "--cubes",
            cube,
            "--protocol",
            "vqa",
            "--out",
            str(tmp_path / "x"),
            "--models",
            "transformers:random-paligemma",
            "--allow-random-weights",
        ],
        capsys,
    )
    assert (
        "no random architecture 'paligemma' (random-paligemma); known: random-llava,"
        " random-qwen2-vl" in err
    )


@pytest.mark.parametrize("arch", ["llava", "qwen2-vl"])
def test_a_checkpoint_folder_is_loaded_and_hashed(ifg_cube, tmp_path, client, arch):
    """A saved model folder loads through AutoModelForImageTextToText/AutoProcessor on the workers;
    its record names the folder and the sha256 of its weight files; the same weights answer as the
    random model they came from.
    """
    import hashlib

    from cryocube.adapters.random_vlm import build

    cube, _ = ifg_cube
    model, proc = build(arch, 0)
    folder = tmp_path / f"tiny-{arch}"
    model.save_pretrained(folder)
    proc.save_pretrained(folder)
    (rec,) = _evaluate(
        cube, tmp_path / "out", client, model=f"transformers:{folder}", allow_random=False
    ).records
    assert rec["status"] == "ok", rec.get("error")
    assert rec["model_class"] == type(model).__name__
    h = hashlib.sha256(
        b"model.safetensors" + (folder / "model.safetensors").read_bytes()
    ).hexdigest()
    assert rec["weights"] == {
        "source": str(folder),
        "sha256": h,
        "files": ["model.safetensors"],
        "pretrained": True,
        "random_init": False,
    }
    rnd = _evaluate(cube, tmp_path / "rnd", client, model=f"transformers:random-{arch}").records[0]
    assert [r["answer"] for r in _answers(rec)] == [r["answer"] for r in _answers(rnd)]


def test_resume_after_sigkill(ifg_cube, tmp_path, client):
    cube, _ = ifg_cube
    out = tmp_path / "killed"
    cmd = [
        sys.executable,
        "-m",
        "cryocube.cli",
        "evaluate",
        "--cubes",
        cube,
        "--models",
        "transformers",
        "--protocol",
        "vqa",
        "--out",
        str(out),
        "--allow-random-weights",
        "--set",
        "block_samples=1",
        "--set",
        "max_new_tokens=6",
        "--set",
        "threads=1",
        "--workers",
        "1",
        "--quiet",
    ]
    proc = subprocess.Popen(
        cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT
    )
    deadline, done = time.time() + 300, 0
    while time.time() < deadline and proc.poll() is None:
        done = len(list(out.glob("runs/*/answers/block-*.json")))
        if 2 <= done:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert done >= 2 and not (out / "results.jsonl").exists(), proc.stdout.read().decode()[-2000:]
    (rec,) = _evaluate(
        cube, out, client, sets=("block_samples=1", "max_new_tokens=6", "threads=1")
    ).records
    st = rec["generation_stats"]
    # resumed, not restarted
    assert rec["status"] == "ok" and st["blocks"] == 8 and 0 < st["blocks_generated"] <= 8 - done
    fresh = _evaluate(
        cube, tmp_path / "fresh", client, sets=("block_samples=1", "max_new_tokens=6", "threads=1")
    ).records[0]
    assert Path(rec["answers_file"]).read_bytes() == Path(fresh["answers_file"]).read_bytes()


def test_a_resume_with_other_blocks_never_reads_answers_kept_for_other_questions(
    ifg_cube, tmp_path, client
):
    """block_samples is not part of the run id: a run left unfinished at one block size and resumed
    at another finds block files cut for other samples under the same names. They are answered
    again, never paired with the new blocks' questions."""
    import shutil

    cube, _ = ifg_cube
    out = tmp_path / "resumed"
    one = ("block_samples=1", "gen_batch=3", "max_new_tokens=6")
    three = ("block_samples=3", "gen_batch=3", "max_new_tokens=6")
    (rec,) = _evaluate(cube, out, client, sets=one).records
    rdir = Path(rec["answers_file"]).parent
    assert len(list(rdir.glob("answers/block-*.json"))) == 8
    # what a crash before the record leaves: the kept blocks, no record, no results table
    for p in (rdir / "record.json", rdir / "answers.jsonl", out / "results.jsonl"):
        p.unlink()
    shutil.rmtree(out / "results.parquet", ignore_errors=True)
    (out / "results.parquet").unlink(missing_ok=True)
    (res,) = _evaluate(cube, out, client, sets=three).records
    st = res["generation_stats"]
    # blocks 0..2 hold other questions now (answered again); the 3 blocks of 3,3,2 samples
    assert res["status"] == "ok" and st["blocks"] == 3 and st["blocks_generated"] == 3
    fresh = _evaluate(cube, tmp_path / "fresh3", client, sets=three).records[0]
    assert Path(res["answers_file"]).read_bytes() == Path(fresh["answers_file"]).read_bytes()


def test_a_task_is_one_yaml(ifg_cube, lab_tasks, tmp_path, client):
    """A lab's task file (new prompt, drawn as the phase alone) runs with no code; workers never saw
    the folder."""
    cube, _ = ifg_cube
    (lab_tasks / "mine.yaml").write_text(
        yaml.safe_dump(
            {
                "render": {"layout": "phase", "phase": {"colormap": "hsv"}},
                "tasks": {
                    "fringes_short": {
                        "answer": "number",
                        "metrics": {"mae": {"target": "fringe_counting"}},
                        "prompt": "{picture} Fringes between {primary_date} and {secondary_date}?",
                        "max_new_tokens": 4,
                    }
                },
            }
        )
    )
    (rec,) = _evaluate(
        cube, tmp_path / "out", client, overrides=(("vqa_tasks", "fringes_short"), ("gen_batch", 4))
    ).records
    assert rec["status"] == "ok", rec.get("error")
    assert list(rec["tasks"]) == ["fringes_short"] and rec["tasks"]["fringes_short"][
        "source"
    ].endswith("mine.yaml")
    rows = _answers(rec)
    assert len(rows) == 8 and rows[0]["prompt"].startswith(
        "The picture shows the wrapped phase in a cyclic colour map (hsv"
    )
    assert all(r["new_tokens"] <= 4 for r in rows)


def _refused(argv, capsys) -> str:
    from cryocube.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and "local cluster" not in err  # no cluster was started
    return err


def test_bad_input_is_one_sentence_before_any_cluster(ifg_cube, lab_tasks, tmp_path, capsys):
    cube, _ = ifg_cube
    base = ["evaluate", "--cubes", cube, "--protocol", "vqa", "--out", str(tmp_path / "o")]
    err = _refused(base + ["--models", f"transformers:{tmp_path}/nowhere"], capsys)
    assert (
        f"no checkpoint folder (config.json) at {tmp_path}/nowhere" in err
        and "--allow-random-weights" in err
    )
    err = _refused(base + ["--models", "ssl4eo_moco"], capsys)
    assert "'ssl4eo_moco' is not a generative model" in err and "--protocol probe" in err
    # a model folder without an image processor
    from cryocube.adapters.random_vlm import build

    model, proc = build("llava", 0)
    folder = tmp_path / "noimg"
    model.save_pretrained(folder)
    proc.tokenizer.save_pretrained(folder)
    err = _refused(base + ["--models", f"transformers:{folder}"], capsys)
    assert f"{folder}: the model has no image processor" in err
    # a prompt naming a field no sample has
    (lab_tasks / "bad.yaml").write_text(
        yaml.safe_dump(
            {
                "tasks": {
                    "t": {
                        "answer": "text",
                        "metrics": {"token_f1": {"answer": "noise_assessment"}},
                        "prompt": "Describe {orbit_number}.",
                    }
                }
            }
        )
    )
    err = _refused(base + ["--models", "transformers", "--allow-random-weights"], capsys)
    assert "bad.yaml: task t: prompt names unknown field {orbit_number}" in err


def test_a_checkpoint_at_an_s3_url(ifg_cube, tmp_path, client, s3_bucket):
    """transformers:s3://... (moto on loopback): planned from its small files, hashed where it lies,
    copied once per worker host into a cache named by that hash; the answers are those of the same
    weights on local disk.
    """
    import s3fs

    from cryocube import store
    from cryocube.adapters.random_vlm import build

    cube, _ = ifg_cube
    bucket, opts = s3_bucket
    model, proc = build("llava", 0)
    folder = tmp_path / "tiny"
    model.save_pretrained(folder)
    proc.save_pretrained(folder)
    fs = s3fs.S3FileSystem(**opts)
    for f in folder.iterdir():
        fs.put(str(f), f"{bucket}/models/tiny/{f.name}")
    url = f"s3://{bucket}/models/tiny"
    store.register_options(url, opts)
    (rec,) = _evaluate(
        cube, tmp_path / "out", client, model=f"transformers:{url}", allow_random=False
    ).records
    assert rec["status"] == "ok", rec.get("error")
    (loc,) = _evaluate(
        cube, tmp_path / "loc", client, model=f"transformers:{folder}", allow_random=False
    ).records
    assert rec["weights"]["sha256"] == loc["weights"]["sha256"] and rec["weights"]["source"] == url
    assert [r["answer"] for r in _answers(rec)] == [r["answer"] for r in _answers(loc)]


def test_every_phrasing_is_asked_and_the_board_keeps_the_first(
    ifg_cube, lab_tasks, tmp_path, client
):
    """A task with three phrasings (one multiple-choice): every sample is asked each; the task's
    metrics (the board) are the first phrasing's, each phrasing's metrics are in the record, and the
    report gives mean and spread.
    """
    from cryocube.cli import main

    cube, _ = ifg_cube
    (lab_tasks / "worded.yaml").write_text(
        yaml.safe_dump(
            {
                "tasks": {
                    "coherence_worded": {
                        "answer": "class",
                        "labels": ["low", "medium", "high"],
                        "metrics": {"accuracy": {"target": "coherence_classification"}},
                        "max_new_tokens": 4,
                        "prompts": [
                            "{picture} How coherent is it? Answer {labels}.",
                            "{picture} Rate the coherence: {labels}.",
                            "{picture} Coherence? {choices}. Answer with a letter.",
                        ],
                    }
                }
            }
        )
    )
    (rec,) = _evaluate(
        cube, tmp_path / "out", client, overrides=(("vqa_tasks", "coherence_worded"),)
    ).records
    assert rec["status"] == "ok", rec.get("error")
    rows = _answers(rec)
    assert len(rows) == 24 and sorted({r["variant"] for r in rows}) == [0, 1, 2]
    assert all("A. low; B. medium; C. high" in r["prompt"] for r in rows if r["variant"] == 2)
    d = rec["metrics"]["tasks"]["coherence_worded"]
    assert (
        rec["tasks"]["coherence_worded"]["phrasings"] == 3
        and d["n"] == 8
        and d["unparsed_value"] == 0.0
    )
    first = [r for r in rows if r["variant"] == 0]
    assert d["metrics"]["accuracy"]["value"] == pytest.approx(
        100 * np.mean([r["scores"]["accuracy"] for r in first])
    )
    assert d["unparsed"] == sum(not r["ok"] for r in first)
    ph = d["phrasings"]
    assert [p["n"] for p in ph] == [8, 8, 8] and [p["multiple_choice"] for p in ph] == [
        False,
        False,
        True,
    ]
    for k, p in enumerate(ph):
        mine = [r["scores"]["accuracy"] for r in rows if r["variant"] == k]
        assert p["metrics"]["accuracy"]["value"] == pytest.approx(100 * np.mean(mine))
    assert main(["report", str(tmp_path / "out"), "--out", str(tmp_path / "report")]) == 0
    html = (tmp_path / "report" / "report.html").read_text()
    vals = [p["metrics"]["accuracy"]["value"] for p in ph]
    assert "Prompt phrasings on" in html and f"{np.mean(vals):.2f}" in html
    # the gallery: a row per phrasing, each with the model's answer to that phrasing
    from cryocube.families.vqa.report import cubes, gallery
    from cryocube.report.records import load_results

    qa = rec["gallery"][0]["qa"]
    assert [q["variant"] for q in qa] == [0, 1, 2]
    res = load_results(tmp_path / "out")
    (cube,) = (c for c in cubes(res) if c.dataset == rec["dataset"])
    (_, _, table), *_ = gallery(res, cube, tmp_path / "figs")
    assert [row[3] for row in table.rows] == [q["answer"] or "(empty)" for q in qa]


def test_a_hephaestus_cube_is_asked_its_annotations_and_gets_their_board(tmp_path, client):
    """A cube converted from the Hephaestus layout is asked the Hephaestus task file (with its
    phrasings) beside the localisation and noise tasks; the record keeps each task's unparsed count
    and unparsed_value; the board is the Hephaestus one."""
    from cryocube.cli import main
    from cryocube.convert.writer import convert
    from cryocube.insar_synthetic import make_interferograms

    make_interferograms(tmp_path / "raw", n=4, size=24, seed=0, dataset="hephaestus")
    cube = str(tmp_path / "heph.zarr")
    convert("hephaestus", str(tmp_path / "raw"), cube, client=client, progress=False)
    (rec,) = _evaluate(
        cube, tmp_path / "out", client, sets=("block_samples=4", "gen_batch=4", "max_new_tokens=4")
    ).records
    assert rec["status"] == "ok", rec.get("error")
    asked = set(rec["tasks"])
    assert {
        "deformation",
        "deformation_type",
        "low_coherence",
        "atmospheric_fringes",
        "intensity",
        "caption",
    } <= asked
    assert "coherence_classification" in rec["tasks_left_out"]  # Hephaestus has no coherence values
    tasks = rec["metrics"]["tasks"]
    assert (
        rec["tasks"]["atmospheric_fringes"]["unparsed_value"]
        == tasks["atmospheric_fringes"]["unparsed_value"]
        == 0.0
    )
    assert rec["unparsed"]["atmospheric_fringes"] == tasks["atmospheric_fringes"]["unparsed"]
    assert tasks["deformation"]["n"] == 4 and len(tasks["deformation"]["phrasings"]) == 2
    assert main(["report", str(tmp_path / "out"), "--out", str(tmp_path / "report")]) == 0
    board = (tmp_path / "report" / "LEADERBOARD.md").read_text()
    assert (
        "Hephaestus annotations" in board
        and "| Atmospheric level MAE (level) |" in board
        and "Caption F1 (%)" in board
    )
    # tasks the cube has no reference for read "not in cube" in every row, chance's too (issue 38)
    lines = [
        [c.strip() for c in x.strip().strip("|").split("|")]
        for x in board.splitlines()
        if x.startswith("| ")
    ]
    head = lines[0]
    for row in lines[1:]:
        by = dict(zip(head, row))
        for col in ("Coherence Acc (%)", "Fringe MAE (count)"):
            assert by[col] == "– (not in cube)", (row[0], col, by[col])
