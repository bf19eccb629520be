"""What `cryocube probe` and `evaluate --protocol probe` read, and the NeuCo-Bench protocol edge
cases: messy label folders and embedding CSVs on disk are refused in one sentence before any cluster
starts (the CLI is pointed at a cluster address where nothing listens, so reaching it would fail
differently), rare regression targets score as NeuCo-Bench scores them, and the recipe records its
choices."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from cryocube.cli import build_parser, main
from cryocube.embeddings.submission import write_submission
from cryocube.errors import UserError
from cryocube.families.embedding import neuco
from cryocube.families.embedding.probe import (
    ProbeRecipe,
    Task,
    check_tasks,
    finish_scores,
    load_probe_inputs,
    probe_recipe,
    run_probes,
)
from cryocube.families.embedding.work import probe_embeddings
from cryocube.labelfiles import LabelError, read_label_folder

# the discard port: a command that got this far would fail to connect, not refuse
NOWHERE = "tcp://127.0.0.1:9"
IDS = [f"loc{i:03d}" for i in range(40)]


def _folder(tmp_path, files: dict[str, str | bytes], name="labels"):
    d = tmp_path / name
    d.mkdir()
    for fname, text in files.items():
        (d / fname).write_bytes(text if isinstance(text, bytes) else text.encode())
    return d


def _vectors(tmp_path, ids=IDS, d=6, seed=0):
    X = np.random.default_rng(seed).normal(size=(len(ids), d)).astype(np.float32)
    return write_submission(tmp_path / "emb.csv", ids, X), X


def _labels_csv(values: dict[str, str]) -> str:
    return "id,label\n" + "".join(f"{i},{v}\n" for i, v in values.items())


def _probe_cli(tmp_path, emb, labels, *extra):
    return main(
        [
            "probe",
            str(emb),
            "--labels",
            str(labels),
            "--out",
            str(tmp_path / "out"),
            "--quiet",
            "--cluster",
            NOWHERE,
            *extra,
        ]
    )


GOOD = {i: str(float(k % 2)) for k, i in enumerate(IDS)}


# --- label folders
# ---------------------------------------------------------------------------------


def test_excel_bom_blank_labels_and_suffixes_are_read(tmp_path):
    text = _labels_csv({**{f"{i}.zarr.zip": v for i, v in GOOD.items()}, "loc999": ""})
    d = _folder(
        tmp_path,
        {
            "cloud__cls.csv": b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode(),
            "forest__regression.csv": (
                "label,id,cvpr_earthvision_phase_dev\n"
                + "".join(f" {k / 7} ,{i},True\n" for k, i in enumerate(IDS))
            ),
        },
    )
    found = read_label_folder(str(d))
    assert set(found) == {"cloud", "forest"}
    cloud = found["cloud"]
    assert cloud.kind == "cls" and cloud.n_unlabelled == 1 and "loc999" not in cloud.labels
    # BOM understood, .zarr.zip stripped
    assert cloud.labels == {i: float(v) for i, v in GOOD.items()}
    assert found["forest"].kind == "regr" and found["forest"].labels["loc007"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "files,words",
    [
        (
            {"t__regr.csv": _labels_csv({**GOOD, "loc003": "nan"})},
            r"t__regr.csv line 5: the label of id 'loc003' is 'nan'",
        ),
        (
            {"t__regr.csv": _labels_csv({**GOOD, "loc003": "abc"})},
            r"line 5: the label of id 'loc003' is 'abc', not a finite",
        ),
        (
            {"t__regr.csv": _labels_csv({**GOOD, "loc003": "inf"})},
            r"the label of id 'loc003' is 'inf', not a finite number",
        ),
        (
            {"t__regr.csv": _labels_csv(GOOD) + "loc005.zarr.zip,1.0\n"},
            r"id 'loc005' appears twice \(lines 7 and 42\)",
        ),
        ({"t__regr.csv": _labels_csv(GOOD) + ",1.0\n"}, r"line 42: the id cell is empty"),
        (
            {"t__regr.csv": _labels_csv(GOOD) + "loc100,1.0,extra\n"},
            r"line 42: 3 fields where the header has 2",
        ),
        (
            {"x__cls.csv": _labels_csv(GOOD), "x__regr.csv": _labels_csv(GOOD)},
            r"x__cls.csv and x__regr.csv both define task 'x'",
        ),
        (
            {"x__cls.csv": _labels_csv(GOOD), "X__classification.csv": _labels_csv(GOOD)},
            r"both define task",
        ),
        (
            {"t__regr.csv": "id;label\nloc000;1\n"},
            r"needs the columns id and label, found \['id;label'\]",
        ),
        (
            {"t__regr.csv": _labels_csv({i: "" for i in IDS})},
            r"no labelled rows \(40 rows with an empty label\)",
        ),
        ({"t__seg.csv": _labels_csv(GOOD)}, r"t__seg.csv: task 't__seg.csv' must end in __cls"),
        ({"t__regr.csv": "id,label\nloc000,1\n".encode("utf-16")}, r"t__regr.csv: not UTF-8 text"),
        ({"notes.txt": "hello"}, r"no <task>__<cls\|regr>.csv label files"),
    ],
)
def test_label_files_that_would_change_a_score_are_refused(tmp_path, files, words):
    d = _folder(tmp_path, files)
    with pytest.raises(LabelError, match=words):
        read_label_folder(str(d))


@pytest.mark.parametrize(
    "values,words",
    [
        (
            {i: "1" for i in IDS},
            r"task t__cls has the single value 1 in all its 40 labelled samples",
        ),
        (
            {i: str(k % 3) for k, i in enumerate(IDS)},
            r"classification task t__cls has 3 distinct labels \(0, 1, 2\)",
        ),
    ],
)
def test_a_one_class_or_three_class_task_is_refused_before_the_cluster(
    tmp_path, capsys, values, words
):
    """NeuCo-Bench min-max scales labels: a constant task divides by zero and its F1 refuses the NaN
    (or 0.5) targets after the work; cryocube says so first, in one sentence, and never contacts the
    cluster.
    """
    emb, _ = _vectors(tmp_path)
    d = _folder(tmp_path, {"t__cls.csv": _labels_csv(values)})
    assert _probe_cli(tmp_path, emb, d) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert re.search(words, err), err
    assert not (tmp_path / "out").exists()


# --- embedding CSVs
# --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cell,words",
    [
        ("nan", r"row of id 'loc002' has a NaN \(or empty\) value in column '3' \(line 4\)"),
        ("", r"row of id 'loc002' has a NaN \(or empty\) value in column '3'"),
        ("abc", r"row of id 'loc002' has a value that is not a number in column '3' \(line 4\)"),
        ("inf", r"row of id 'loc002' has an infinite value in column '3' \(line 4\)"),
        ("-inf", r"row of id 'loc002' has an infinite value in column '3'"),
    ],
)
def test_embedding_cells_that_were_read_as_zero_are_refused(tmp_path, capsys, cell, words):
    emb, _ = _vectors(tmp_path)
    lines = emb.read_text().splitlines()
    parts = lines[3].split(",")
    parts[4] = cell
    lines[3] = ",".join(parts)
    emb.write_text("\n".join(lines) + "\n")
    labels = _folder(tmp_path, {"t__cls.csv": _labels_csv(GOOD)})
    assert _probe_cli(tmp_path, emb, labels) == 2
    err = capsys.readouterr().err
    assert re.search(words, err) and "emb.csv" in err and err.count("\n") == 1, err


def test_embedding_csv_with_bom_is_read_and_duplicates_refused(tmp_path):
    emb, X = _vectors(tmp_path)
    labels = _folder(tmp_path, {"t__cls.csv": _labels_csv(GOOD)})
    emb.write_bytes(b"\xef\xbb\xbf" + emb.read_bytes())
    inputs = load_probe_inputs(str(emb), probe_recipe(), labels=str(labels))
    assert inputs.ids == IDS
    np.testing.assert_array_equal(inputs.X, X)
    emb.write_text(
        emb.read_text(encoding="utf-8-sig")
        + emb.read_text(encoding="utf-8-sig").splitlines()[5]
        + "\n"
    )
    with pytest.raises(UserError, match=r"id 'loc004' appears more than once \(rows 6 and 42\)"):
        load_probe_inputs(str(emb), probe_recipe(), labels=str(labels))


# --- checks before work
# ----------------------------------------------------------------------------


def test_too_few_labelled_samples_for_r2_are_refused_before_any_cluster(tmp_path, capsys):
    """8 labelled samples with test_size 0.1: one test row per split, where R² needs two."""
    emb, _ = _vectors(tmp_path)
    labels = _folder(
        tmp_path, {"few__regr.csv": _labels_csv({i: str(k) for k, i in enumerate(IDS[:8])})}
    )
    assert _probe_cli(tmp_path, emb, labels) == 2
    err = capsys.readouterr().err
    assert (
        "task few__regr has 8 labelled samples: test_size 0.1 leaves 1 test row per split, and R²"
        " needs at least 2 (label at least 11 samples, or --set test_size=0.25)" in err
    ), err
    # the suggested setting is accepted, and classification needs only one test row
    check_tasks(
        [Task("few__regr", "regr", {i: float(k) for k, i in enumerate(IDS[:8])})],
        probe_recipe(overrides={"test_size": 0.25}),
    )
    check_tasks(
        [Task("few__cls", "cls", {i: float(k % 2) for k, i in enumerate(IDS[:8])})], probe_recipe()
    )


def test_evaluate_probe_refuses_too_few_labels_before_any_embedding(tmp_path, capsys, client):
    """The same check from `evaluate --protocol probe`, at planning time: nothing embedded, no
    cluster."""
    from cryocube.convert.writer import convert
    from cryocube.synthetic import make_samples

    make_samples("ssl4eo-downstream", tmp_path / "raw", n=8, size=8, seed=3)
    url = str(tmp_path / "cube.zarr")
    convert("ssl4eo-downstream", str(tmp_path / "raw"), url, client=client, progress=False)
    rc = main(
        [
            "evaluate",
            "--cubes",
            url,
            "--models",
            "mean",
            "--protocol",
            "probe",
            "--out",
            str(tmp_path / "res"),
            "--cluster",
            NOWHERE,
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and re.search(
        r"task (noise|water_fraction)__regr has [78] labelled samples: test_size 0.1 leaves 1 "
        r"test row per split, and R² needs at least 2",
        err,
    ), err
    assert not (tmp_path / "res" / "embeddings").exists()


def test_the_fix_evaluate_suggests_for_too_few_labels_works_when_followed(tmp_path, capsys, client):
    """evaluate keeps NeuCo-Bench's test size (`--set test_size` is no evaluate field): its refusal
    suggests the commands that take another one, and those, run as written, probe the same cube;
    labelling as many samples as it says makes evaluate itself run."""
    from cryocube.convert.writer import convert
    from cryocube.synthetic import make_samples

    make_samples("ssl4eo-downstream", tmp_path / "raw", n=8, size=8, seed=3)
    url = str(tmp_path / "cube.zarr")
    convert("ssl4eo-downstream", str(tmp_path / "raw"), url, client=client, progress=False)
    evaluate = [
        "evaluate",
        "--models",
        "mean",
        "--protocol",
        "probe",
        "--out",
        str(tmp_path / "res"),
        "--quiet",
    ]
    assert main([*evaluate, "--cubes", url, "--cluster", NOWHERE]) == 2
    err = capsys.readouterr().err
    m = re.search(
        r"label at least (\d+) samples, or `(cryocube embed [^`]+)` then `(cryocube probe"
        r" [^`]+--set "
        r"test_size=[0-9.]+)`: evaluate keeps test_size 0.1\)$",
        err.strip(),
    )
    assert m and err.count("\n") == 1, err
    assert main([*evaluate, "--cubes", url, "--cluster", NOWHERE, "--set", "test_size=0.25"]) == 2
    # as the sentence says: not evaluate's
    assert "unknown recipe fields ['test_size']" in capsys.readouterr().err

    # the second suggestion, as written (its placeholders named), on the session's cluster
    names = {"EMB.zarr": str(tmp_path / "emb.zarr"), "PROBE": str(tmp_path / "probe")}
    here = ["--cluster", client.scheduler.address, "--quiet"]
    for cmd in (m.group(2), m.group(3)):
        assert main([names.get(w, w) for w in cmd.split()[1:]] + here) == 0, capsys.readouterr().err
    (summary,) = (tmp_path / "probe" / "runs").glob("*/results_summary.json")
    assert math.isfinite(json.loads(summary.read_text())["overall_q_score"])

    # the first: as many labelled samples as it says, and evaluate runs
    need = int(m.group(1))
    make_samples("ssl4eo-downstream", tmp_path / "raw2", n=need + 3, size=8, seed=3)
    url2 = str(tmp_path / "cube2.zarr")
    convert("ssl4eo-downstream", str(tmp_path / "raw2"), url2, client=client, progress=False)
    from cryocube.families.embedding.probe import tasks_from_cube

    assert min(len(t.labels) for t in tasks_from_cube(url2)) >= need
    capsys.readouterr()
    assert main([*evaluate, "--cubes", url2, *here]) == 0, capsys.readouterr().err


# --- NeuCo-Bench numbers
# ---------------------------------------------------------------------------


def test_rare_targets_score_as_neuco_bench_instead_of_breaking_the_nan_rule():
    """A regression task with 3 non-zero labels among 40: most test folds hold only zeros.
    torchmetrics scores such a fold (0.0, or 1.0 for a near-exact fit); cryocube used to call it
    NaN, and then more than 3 of 10 'failed' probes made the task's Q NaN (NeuCo-Bench gave a
    number)."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(40, 8)).astype(np.float32)
    y = np.zeros(40)
    y[[3, 17, 29]] = [1.0, 2.0, 0.5]
    task = Task("rare__regr", "regr", dict(zip(IDS, y)))
    recipe = probe_recipe("linear", 10, {"epochs": 2})
    splits = neuco.shuffle_splits(40, 10)
    constant = [f for f, (_, te) in enumerate(splits) if np.ptp(y[te]) == 0]
    assert len(constant) > 3  # under the old NaN reading, this task broke the rule
    scores = run_probes(X, IDS, [task], recipe, progress=False)
    fold = scores["rare__regr"]
    assert all(math.isfinite(s) for s in fold)
    assert all(fold[f] in (0.0, 1.0) for f in constant)
    summary = finish_scores(scores, recipe)
    assert summary["tasks_failing_nan_rule"] == [] and summary["task_failed_probes"] == {
        "rare__regr": 0
    }
    assert math.isfinite(summary["overall_q_score"])


def test_k_defaults_to_neuco_bench_configs_40():
    assert ProbeRecipe().k == 40 and probe_recipe().k == 40
    args = build_parser().parse_args(["probe", "e.csv", "--labels", "l", "--out", "o"])
    assert args.k == 40 and args.standardize == "all"


def test_svm_is_neuco_benchs_sample_config_and_linear_svm_is_not_claimed(tmp_path):
    from cryocube.families.embedding.probe import differences

    svm = probe_recipe("svm").as_dict()  # NeuCo-Bench's configs/sample_config_svm.yaml
    assert (
        svm["n_iter"],
        svm["n_initial_points"],
        svm["base_estimator"],
        svm["degrees"],
        svm["C_min"],
        svm["C_max"],
        svm["gamma_min"],
        svm["gamma_max"],
        svm["coef0_min"],
        svm["coef0_max"],
        svm["epsilons"],
        svm["k"],
    ) == (50, 5, "RF", (2, 3), 1e-3, 1e3, 1e-4, 10.0, -1.0, 2.0, (0.01, 0.05, 0.1, 0.5), 40)
    assert not any("is not NeuCo-Bench's" in d for d in differences(probe_recipe("svm")))
    assert probe_recipe("linear-svm", 3).as_dict()["probe"] == "linear-svm"
    assert any(
        "probe linear-svm is not NeuCo-Bench's" in d
        for d in differences(probe_recipe("linear-svm", 3))
    )
    with pytest.raises(UserError, match="--standardize must be one of all, labelled, got 'rows'"):
        probe_recipe(standardize="rows")


def test_standardisation_choice_changes_the_input_and_is_recorded(tmp_path):
    """`labelled` takes the mean and std over the labelled rows only (NeuCo-Bench's code), `all`
    over the file (its docs): both runs say which, in the record and in results_summary.json, and
    score differently.
    """
    ids = IDS + [f"unlabelled{i}" for i in range(20)]
    rng = np.random.default_rng(5)
    X = rng.normal(size=(60, 6)).astype(np.float32)
    X[40:] = 50 + 10 * X[40:]  # unlabelled rows far away: they move the file-wide mean and std
    emb = write_submission(tmp_path / "emb.csv", ids, X)
    y = X[:40, 0] + 0.1 * rng.normal(size=40)
    labels = _folder(
        tmp_path,
        {
            "sig__regr.csv": _labels_csv(
                {**{i: repr(float(v)) for i, v in zip(IDS, y)}, "unlabelled0": ""}
            )
        },
    )
    res = {}
    for mode in ("all", "labelled"):
        recipe = probe_recipe("linear", 3, {"epochs": 3, "lr": 1e-2}, standardize=mode)
        r = probe_embeddings(
            str(emb), str(tmp_path / mode), recipe, labels=str(labels), progress=False
        )
        summary = json.loads(Path(r.record["summary_file"]).read_text())
        assert r.record["probe"]["standardize"] == mode == summary["meta"]["probe"]["standardize"]
        assert any(
            d.startswith(f"standardisation {mode}") for d in r.record["neuco_bench_differences"]
        )
        assert r.record["labelled"] == {"sig__regr": {"labelled": 40, "empty_label_skipped": 1}}
        res[mode] = r
    assert res["all"].record["run_id"] != res["labelled"].record["run_id"]
    assert res["all"].scores != res["labelled"].scores
