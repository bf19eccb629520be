"""NeuCo-Bench scoring, probes and the Embed2Scale submission CSV, checked by hand and against
references."""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest
import torch

from cryocube.embeddings import submission
from cryocube.embeddings.submission import SubmissionError
from cryocube.errors import LabelError, UserError
from cryocube.families.embedding import neuco, probes
from cryocube.families.embedding.neuco import NeuCoError
from cryocube.families.embedding.probe import Task, fold_tasks, probe_recipe, run_probes
from cryocube.families.embedding.probes import ProbeError
from cryocube.labelfiles import split_task_name

torch.set_num_threads(1)


# --- neuco: embeddings, labels, splits -----------------------------------------------------------


def test_standardize_is_one_global_scalar_after_nan_to_zero():
    X = np.array([[1.0, np.nan, 3.0], [10.0, 20.0, 30.0]])
    Z = neuco.standardize(X)
    X0 = np.array([[1.0, 0.0, 3.0], [10.0, 20.0, 30.0]])
    assert Z.dtype == np.float32
    np.testing.assert_allclose(Z, (X0 - X0.mean()) / X0.std(), rtol=1e-6)
    assert abs(Z.mean()) < 1e-6 and abs(Z.std() - 1) < 1e-6
    assert not np.allclose(Z.mean(axis=0), 0)  # not per dimension
    np.testing.assert_array_equal(
        neuco.standardize(np.full((2, 3), 7.0)), np.zeros((2, 3), np.float32)
    )


def test_standardize_over_some_rows_applies_their_mean_and_std_to_all():
    X = np.array([[1.0, 2.0], [3.0, 5.0], [100.0, -50.0]])
    Z = neuco.standardize(X, rows=np.array([0, 1]))
    ref = X[:2]
    np.testing.assert_allclose(Z, (X - ref.mean()) / ref.std(), rtol=1e-6)
    # the third row moves the file-wide mean and std
    assert not np.allclose(Z, neuco.standardize(X))


def test_pad_to_zero_pads_and_refuses_wider():
    X = np.ones((2, 3), np.float32)
    P = submission.pad_to(X, 5)
    assert P.shape == (2, 5) and P[:, 3:].sum() == 0 and P[:, :3].sum() == 6
    assert submission.pad_to(X, 3) is X
    with pytest.raises(NeuCoError, match="3 dimensions, more than the expected 2"):
        submission.pad_to(X, 2)


def test_scale_labels_min_max_per_task():
    np.testing.assert_allclose(neuco.scale_labels([2.0, 4.0, 3.0]), [0.0, 1.0, 0.5])
    np.testing.assert_array_equal(neuco.scale_labels([5.0, 5.0]), [0.0, 0.0])  # constant: no 0/0
    y = np.array([[0.0, 1.0], [10.0, 1.0], [5.0, np.nan]])
    out = neuco.scale_labels(y)
    np.testing.assert_allclose(out[:, 0], [0.0, 1.0, 0.5])
    assert out[0, 1] == 0 and out[1, 1] == 0 and np.isnan(out[2, 1])


@pytest.mark.parametrize(
    "name,kind",
    [
        ("forest__regr", "regr"),
        ("a__b__regression", "regr"),
        ("cloud__cls", "cls"),
        ("labels/cloud__classification.csv", "cls"),
        ("x__CLS.csv", "cls"),
    ],
)
def test_task_kind_from_suffix(name, kind):
    assert split_task_name(name)[1] == kind


@pytest.mark.parametrize(
    "name", ["forest", "forest_regr", "forest__seg", "__cls", "forest__regr.txt"]
)
def test_task_kind_rejects_unknown_suffix(name):
    with pytest.raises(LabelError, match="must end in __cls"):
        split_task_name(name)


def test_split_task_name():
    assert split_task_name("labels/landcover_forest__regr.csv") == (
        "landcover_forest",
        "regr",
    )


@pytest.mark.parametrize("n", [10, 30, 57, 100, 1001])
@pytest.mark.parametrize("seed", [42, 7])
def test_shuffle_splits_reproduce_sklearn(n, seed):
    from sklearn.model_selection import ShuffleSplit

    ours = neuco.shuffle_splits(n, 5, test_size=0.1, seed=seed)
    theirs = list(
        ShuffleSplit(n_splits=5, test_size=0.1, random_state=seed).split(np.zeros((n, 1)))
    )
    assert len(ours) == len(theirs) == 5
    for (a_tr, a_te), (b_tr, b_te) in zip(ours, theirs):
        np.testing.assert_array_equal(a_tr, b_tr)
        np.testing.assert_array_equal(a_te, b_te)


def test_shuffle_splits_too_few_rows():
    with pytest.raises(NeuCoError, match="1 labelled samples are too few"):
        neuco.shuffle_splits(1, 3)


# --- neuco: Q and the NaN rule -------------------------------------------------------------------


def q_score(scores) -> float:
    return neuco.task_stats(scores)[2]


def test_q_score_by_hand():
    assert q_score([1.0, 1.0, 1.0]) == pytest.approx(100.0)  # the FAQ's cap
    assert q_score([0.8, 0.8]) == pytest.approx(80.0)
    assert neuco.task_stats([0.5, 0.7]) == pytest.approx((0.6, 0.1, 2 * 0.6 / (0.02 + 0.1)))
    assert q_score([0.5, np.nan, 0.7, None]) == pytest.approx(10.0)  # NaN folds ignored
    assert q_score([-0.2, -0.4]) == pytest.approx(-5.0)  # negative R² -> negative Q
    assert all(math.isnan(x) for x in neuco.task_stats([np.nan, np.nan]))


def test_nan_rule_three_and_four_of_ten():
    three = [0.5] * 7 + [np.nan] * 3
    four = [0.5] * 6 + [np.nan] * 4
    assert neuco.nan_rule(three) is True
    assert neuco.nan_rule(four) is False
    assert neuco.nan_rule([0.5] * 10) is True
    # a probe whose score is infinite failed too (no finite score), and counts as such
    assert neuco.nan_rule([0.5] * 6 + [np.nan] * 3 + [-np.inf]) is False
    assert neuco.failed_probes([0.0, np.inf, None, 0.3]) == 2
    assert neuco.allowed_failures(40) == 12


def test_summarize_and_write_results(tmp_path):
    scores = {
        "forest__regr": [0.5, 0.7],
        "cloud__cls": [0.9, np.nan] + [0.9] * 2,
        "dead__regr": [np.nan] * 4,
    }
    s = neuco.summarize({k: v for k, v in scores.items() if k != "dead__regr"})
    assert s["task_q_scores"] == {
        "forest__regr": pytest.approx(10.0),
        "cloud__cls": pytest.approx(90.0),
    }
    assert s["task_acc_scores"] == {
        "forest__regr": pytest.approx(0.6),
        "cloud__cls": pytest.approx(0.9),
    }
    assert s["overall_q_score"] == pytest.approx(50.0) and s["overall_acc_score"] == pytest.approx(
        0.75
    )
    assert s["task_std_scores"]["forest__regr"] == pytest.approx(0.1)

    path = neuco.write_results(tmp_path / "run", scores, {"model": "m1"})
    strict = dict(parse_constant=lambda c: pytest.fail(f"{c} written into JSON"))
    summary = json.loads(path.read_text(), **strict)
    assert summary["overall_q_score"] is None  # a task with no valid fold makes the run's Q NaN
    assert summary["task_q_scores"]["dead__regr"] is None
    assert summary["task_fold_scores"]["cloud__cls"] == [0.9, None, 0.9, 0.9]
    assert summary["tasks_failing_nan_rule"] == ["dead__regr"]
    assert summary["meta"] == {"model": "m1"}
    task = json.loads(
        (tmp_path / "run" / "forest__regr" / "forest__regr_result.json").read_text(), **strict
    )
    assert task == {
        "q_stat": pytest.approx(10.0),
        "mean_score": pytest.approx(0.6),
        "std_dev": pytest.approx(0.1),
        "q_t": [0.5, 0.7],
    }
    assert not [p for p in (tmp_path / "run").rglob("*") if ".tmp" in p.name]


def test_write_results_refuses_a_task_name_that_is_a_path(tmp_path):
    with pytest.raises(NeuCoError, match="cannot be used as a folder name"):
        neuco.write_results(tmp_path, {"../evil": [0.5]})


# --- neuco: leaderboard --------------------------------------------------------------------------


def test_leaderboard_ties_take_the_minimum_rank():
    lb = neuco.leaderboard(
        {"a": {"t1": 10.0, "t2": 5.0}, "b": {"t1": 10.0, "t2": 4.0}, "c": {"t1": 1.0, "t2": 6.0}}
    )
    ranks = {r["run"]: r["task_ranks"] for r in lb.rows}
    assert ranks["a"]["t1"] == ranks["b"]["t1"] == 1 and ranks["c"]["t1"] == 3
    assert (ranks["c"]["t2"], ranks["a"]["t2"], ranks["b"]["t2"]) == (1, 2, 3)
    np.testing.assert_array_equal(neuco.rank_min([3.0, 1.0, 3.0, 2.0]), [3, 1, 3, 2])


def test_leaderboard_rank_disagrees_with_mean_q():
    # A edges out B on the task where a bad run C spreads the scores (large std, large weight);
    # B wins the low-spread task by a wide margin and has the higher mean Q, yet ranks second.
    q = {"A": {"t1": 11.0, "t2": 5.0}, "B": {"t1": 10.0, "t2": 20.0}, "C": {"t1": -50.0, "t2": 0.0}}
    lb = neuco.leaderboard(q)
    s1, s2 = statistics.stdev([11, 10, -50]), statistics.stdev([5, 20, 0])
    w1, w2 = s1 / (s1 + s2), s2 / (s1 + s2)
    assert lb.weights == {"t1": pytest.approx(w1), "t2": pytest.approx(w2)}
    assert [r["run"] for r in lb.rows] == ["A", "B", "C"]
    a, b, c = lb.rows
    assert a["weighted_score"] == pytest.approx(1 * w1 + 2 * w2)
    assert b["weighted_score"] == pytest.approx(2 * w1 + 1 * w2)
    assert c["weighted_score"] == pytest.approx(3.0)
    assert [r["aggregated_rank"] for r in lb.rows] == [1, 2, 3]
    assert a["mean_score"] == pytest.approx(8.0) and b["mean_score"] == pytest.approx(15.0)


def test_leaderboard_drops_nan_runs_and_handles_a_single_run():
    lb = neuco.leaderboard(
        {
            "ok": {"t1": 3.0, "t2": -1.0},
            "bad": {"t1": 5.0, "t2": float("nan")},
            "short": {"t1": 9.0},
        }
    )
    assert lb.dropped == ["bad", "short"]
    assert len(lb.rows) == 1
    row = lb.rows[0]
    assert (
        row["run"] == "ok"
        and row["aggregated_rank"] == 1
        and row["mean_score"] == pytest.approx(1.0)
    )
    assert lb.weights == {"t1": 0.5, "t2": 0.5}  # single run: uniform
    assert row["weighted_score"] == pytest.approx(1.0)
    rows, dropped, _ = lb  # unpacks like a tuple


def test_leaderboard_zero_spread_gives_uniform_weights_and_shared_rank():
    lb = neuco.leaderboard(
        {"a": {"t1": 2.0, "t2": 1.0, "t3": 0.0}, "b": {"t1": 2.0, "t2": 1.0, "t3": 0.0}}
    )
    assert lb.weights == {t: pytest.approx(1 / 3) for t in ("t1", "t2", "t3")}
    assert [r["aggregated_rank"] for r in lb.rows] == [1, 1]
    # equal spread, swapped ranks: the same weighted score (1.5) in a different summation order ties
    lb = neuco.leaderboard({"a": {"t1": 2.0, "t2": 1.0}, "b": {"t1": 1.0, "t2": 2.0}})
    assert [r["weighted_score"] for r in lb.rows] == [pytest.approx(1.5)] * 2
    assert [r["aggregated_rank"] for r in lb.rows] == [1, 1]


# --- probes: metrics -----------------------------------------------------------------------------


def test_binary_f1_matches_torchmetrics():
    from torchmetrics.classification import BinaryF1Score

    g = torch.Generator().manual_seed(0)
    # logits, probabilities
    for preds in (torch.randn(200, generator=g) * 3, torch.rand(200, generator=g)):
        target = (torch.rand(200, generator=g) > 0.6).int()
        expected = float(BinaryF1Score()(preds, target))
        assert probes.binary_f1(preds.numpy(), target.numpy()) == pytest.approx(expected, abs=1e-6)
    assert probes.binary_f1(np.full(5, -3.0), np.zeros(5)) == 0.0  # no positives anywhere
    assert probes.binary_f1(np.array([0.2, 0.7]), np.array([0, 1])) == 1.0  # in [0,1]: no sigmoid


_R2_EDGES = {
    "random": (
        np.random.default_rng(1).normal(size=100),
        np.random.default_rng(2).normal(size=100),
    ),
    "close fit": (np.linspace(0, 1, 50) + 0.01, np.linspace(0, 1, 50)),
    "all targets equal": (np.array([0.1, 0.2, 0.3, 0.4]), np.full(4, 0.5)),
    "all targets equal, exact fit": (np.full(4, 0.5), np.full(4, 0.5)),
    "targets nearly equal (TSS < 1e-4)": (
        np.array([0.0, 0.5, 1.0]),
        np.array([0.5, 0.5 + 5e-3, 0.5]),
    ),
    "residuals nearly zero (RSS < 1e-4)": (
        np.array([0.5, 0.5 + 1e-3, 0.5]),
        np.array([0.5, 0.5 + 3e-3, 0.5]),
    ),
    "rare target, zero fold": (np.array([0.02, -0.1, 0.3]), np.zeros(3)),
    "NaN prediction, equal targets": (np.array([np.nan, 0.1, 0.2]), np.full(3, 0.3)),
    "NaN prediction": (np.array([np.nan, 0.1, 0.2]), np.array([0.0, 1.0, 2.0])),
    "two rows": (np.array([-5.0, 5.0]), np.array([0.0, 1.0])),
}


@pytest.mark.parametrize("case", list(_R2_EDGES))
def test_r2_is_torchmetrics_r2score_on_its_edge_cases(case):
    """NeuCo-Bench scores R² with torchmetrics' R2Score (float32): a constant test fold is 0.0, not
    NaN."""
    from torchmetrics.regression import R2Score

    preds, target = _R2_EDGES[case]
    expected = float(
        R2Score()(
            torch.tensor(preds, dtype=torch.float32), torch.tensor(target, dtype=torch.float32)
        )
    )
    got = probes.r2(preds, target)
    assert got == pytest.approx(expected, abs=1e-6, nan_ok=True), case
    if case == "all targets equal":
        assert got == 0.0


def test_r2_of_one_row_is_nan_where_torchmetrics_refuses():
    from torchmetrics.regression import R2Score

    with pytest.raises(ValueError, match="at least two samples"):
        R2Score()(torch.tensor([0.1]), torch.tensor([0.5]))
    assert math.isnan(probes.r2(np.array([0.1]), np.array([0.5])))


# --- probes: the protocol on planted and random signals ------------------------------------------


@pytest.fixture(scope="module")
def planted():
    """~500 rows, D=32, y = X @ w + small noise; cls labels threshold it at 0; plus random
    labels."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((500, 32)).astype(np.float32)
    w = rng.standard_normal(32) / np.sqrt(32)
    y = X @ w + 0.05 * rng.standard_normal(500)
    return neuco.standardize(X), y, (y > 0).astype(float), rng.standard_normal(500)


# Few hundred rows give ~140 AdamW steps in 20 epochs; lr 1e-2 converges there (lr 1e-3 needs the
# ~1000 steps that 8000 challenge rows give in 10 epochs).
FAST = dict(epochs=20, lr=1e-2)


def task_scores(X, y, kind, probe="linear", k=10, seed=42, **params) -> list[float]:
    """One task's k ShuffleSplits, a probe per split seeded seed + fold, as `cryocube probe`."""
    splits = neuco.shuffle_splits(len(y), k, seed=seed)
    return [
        probes.fold_score(X, y, kind, tr, te, probe, seed + f, **params)
        for f, (tr, te) in enumerate(splits)
    ]


def test_linear_probe_scores_the_planted_regression_signal(planted):
    X, y, _, _ = planted
    scores = task_scores(X, y, "regr", probe="linear", k=10, **FAST)
    assert len(scores) == 10
    assert q_score(scores) > 20 and np.mean(scores) > 0.9


def test_linear_probe_scores_the_planted_classification_signal(planted):
    X, _, yc, _ = planted
    scores = task_scores(X, yc, "cls", probe="linear", k=10, **FAST)
    assert all(0 <= s <= 1 for s in scores)
    assert q_score(scores) > 20 and np.mean(scores) > 0.9


def test_random_labels_score_near_zero(planted):
    X, _, _, noise = planted
    for probe, params in (("linear", FAST), ("knn", {}), ("linear-svm", {})):
        scores = task_scores(X, noise, "regr", probe=probe, k=10, **params)
        assert abs(np.mean(scores)) < 0.3, probe
        assert abs(q_score(scores)) < 5, probe


def test_linear_probe_is_deterministic_and_ignores_the_global_seed(planted):
    X, y, _, _ = planted
    ((tr, te),) = neuco.shuffle_splits(len(y), 1)
    torch.manual_seed(0)
    a = probes.fold_score(X, y, "regr", tr, te, "linear", seed=3, epochs=3)
    torch.manual_seed(12345)
    torch.randn(100)
    b = probes.fold_score(X, y, "regr", tr, te, "linear", seed=3, epochs=3)
    c = probes.fold_score(X, y, "regr", tr, te, "linear", seed=4, epochs=3)
    assert a == b and a != c


def test_linear_probe_keeps_the_best_epoch(planted):
    # Same seed: the first epoch is the same run, so the best of three cannot be worse than the
    # first.
    X, y, _, _ = planted
    ((tr, te),) = neuco.shuffle_splits(len(y), 1)
    one = probes.fold_score(X, y, "regr", tr, te, "linear", seed=0, epochs=1)
    three = probes.fold_score(X, y, "regr", tr, te, "linear", seed=0, epochs=3)
    assert three >= one


def test_fold_score_matches_the_in_process_protocol(planted):
    X, y, _, _ = planted
    ids = [f"s{i:04d}" for i in range(len(y))]
    task = Task("sig__regr", "regr", dict(zip(ids, y.tolist())))
    recipe = probe_recipe(k=3, overrides={"split_seed": 5, "seed": 5, "epochs": 2})
    scores = run_probes(X, ids, [task], recipe, progress=False)["sig__regr"]
    tr, te = neuco.shuffle_splits(len(y), 3, seed=5)[2]
    Xs = neuco.standardize(X)
    assert probes.fold_score(Xs, y, "regr", tr, te, "linear", seed=5 + 2, epochs=2) == scores[2]


def test_knn_and_linear_svm_score_the_planted_signal(planted):
    X, y, yc, _ = planted
    knn_cls = task_scores(X, yc, "cls", probe="knn", k=10)
    knn_regr = task_scores(X, y, "regr", probe="knn", k=10)
    # kNN in 32-D with 450 rows: smooth, not exact
    assert np.mean(knn_cls) > 0.8 and np.mean(knn_regr) > 0.3
    svm_cls = task_scores(X, yc, "cls", probe="linear-svm", k=10)
    svm_regr = task_scores(X, y, "regr", probe="linear-svm", k=10)
    assert q_score(svm_cls) > 20 and q_score(svm_regr) > 20
    # k is capped at the number of training rows
    assert 0 <= probes.knn_probe(X[:20], yc[:20], X[20:40], yc[20:40], "cls") <= 1


def test_probe_inputs_are_checked():
    X = np.zeros((20, 4), np.float32)
    ((tr, te),) = neuco.shuffle_splits(20, 1)
    with pytest.raises(ProbeError, match="unknown probe 'mlp' for task 'cloud'"):
        probes.fold_score(X, np.zeros(20), "cls", tr, te, probe="mlp", task="cloud")
    with pytest.raises(ProbeError, match="kind 'seg'"):
        probes.fold_score(X, np.zeros(20), "seg", tr, te)
    with pytest.raises(ProbeError, match="task 'forest' has 1 empty labels"):
        probes.fold_score(X, np.r_[np.zeros(19), np.nan], "regr", tr, te, task="forest")
    with pytest.raises(ProbeError, match="has 3 distinct labels"):
        probes.fold_score(X, np.arange(20) % 3, "cls", tr, te)
    tiny = [(Task("tiny__regr", "regr", {"a": 0.0}), np.zeros(1, np.int64), np.zeros(1))]
    with pytest.raises(ProbeError, match="task tiny__regr: 1 labelled samples are too few"):
        fold_tasks(tiny, probe_recipe(), None, "")
    assert issubclass(ProbeError, UserError) and issubclass(SubmissionError, UserError)


# --- submission ----------------------------------------------------------------------------------


def _csv(tmp_path, text, name="sub.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_strip_id():
    assert submission.strip_id("abc.zarr.zip") == "abc"
    assert submission.strip_id("abc.zarr") == "abc"
    assert submission.strip_id("abc") == "abc"
    assert submission.strip_id("abc.zip") == "abc.zip"


def test_round_trip(tmp_path):
    rng = np.random.default_rng(3)
    X = (rng.standard_normal((4, 6)) * 10.0 ** rng.integers(-8, 8, (4, 6))).astype(np.float32)
    ids = ["a1.zarr.zip", "b2", "0033", 'd,"4".zarr']
    path = submission.write_submission(tmp_path / "sub.csv", ids, X)
    assert path.read_text().splitlines()[0] == "id,0,1,2,3,4,5"
    got_ids, got, notes = submission.read_submission(path, dim=6)
    assert got_ids == ["a1", "b2", "0033", 'd,"4"']
    np.testing.assert_array_equal(got, X)
    assert got.dtype == np.float32
    assert notes["zarr_zip_not_removed_from_id_column"] is False
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_write_refuses_nan_and_mismatch(tmp_path):
    with pytest.raises(SubmissionError, match="id 'b' has a non-finite value in column 1"):
        submission.write_submission(tmp_path / "s.csv", ["a", "b"], np.array([[0, 0], [0, np.nan]]))
    with pytest.raises(SubmissionError, match="3 ids do not match"):
        submission.write_submission(tmp_path / "s.csv", ["a", "b", "c"], np.zeros((2, 2)))


def test_rule_1_missing_id_column(tmp_path):
    p = _csv(tmp_path, "name,0,1\na,1,2\n")
    with pytest.raises(SubmissionError, match=r"sub\.csv has no 'id' column"):
        submission.read_submission(p, dim=2)


def test_rule_2_missing_expected_ids(tmp_path):
    p = _csv(tmp_path, "id,0,1\na,1,2\n")
    expected = ["a", "b", "c", "d", "e", "f", "g", "h"]
    with pytest.raises(
        SubmissionError, match=r"lacks 7 expected ids, among them 'b', 'c', 'd', 'e', 'f', \.\.\."
    ) as e:
        submission.read_submission(p, expected_ids=expected, dim=2)
    assert "'g'" not in str(e.value) and "sub.csv" in str(e.value)


def test_rule_3_value_column_count(tmp_path):
    p = _csv(tmp_path, "id,0,1,2\na,1,2,3\n")
    with pytest.raises(
        SubmissionError,
        match="has 3 value columns after 'id', expected 2 .the first beyond 2 is '2'",
    ):
        submission.read_submission(p, dim=2)
    with pytest.raises(SubmissionError, match="has 3 value columns after 'id', expected 1024"):
        submission.read_submission(p)


def test_rule_4_value_that_is_not_a_number(tmp_path):
    p = _csv(tmp_path, "id,0,1\na,1,2\nb,3,x7\nc,oops,1\n")
    with pytest.raises(
        SubmissionError, match="row of id 'b' has a value that is not a number in column '1'"
    ):
        submission.read_submission(p, dim=2)


def test_rule_5_nan(tmp_path):
    p = _csv(tmp_path, "id,0,1\na,1,2\nb,,2\nc,nan,1\n")
    with pytest.raises(
        SubmissionError, match="row of id 'b' has a NaN .or empty. value in column '0'"
    ):
        submission.read_submission(p, dim=2)


def test_rules_apply_in_order(tmp_path):
    # missing ids (rule 2) beat the wrong width (rule 3)
    p = _csv(tmp_path, "id,0,1,2\na,1,2,3\n")
    with pytest.raises(SubmissionError, match="lacks 1 expected ids"):
        submission.read_submission(p, expected_ids=["a", "z"], dim=2)
    # a text value (rule 4) beats a NaN in an earlier row (rule 5)
    p = _csv(tmp_path, "id,0,1\na,nan,2\nb,3,x7\n")
    with pytest.raises(SubmissionError, match="not a number"):
        submission.read_submission(p, dim=2)
    # no id column (rule 1) beats everything
    p = _csv(tmp_path, "ID,0\na,x\n")
    with pytest.raises(SubmissionError, match="no 'id' column"):
        submission.read_submission(p, expected_ids=["q"], dim=2)


def test_suffix_note_and_expected_ids_with_suffix(tmp_path):
    p = _csv(tmp_path, "id,0,1\na.zarr.zip,1,2\nb,3,4\nextra,5,6\n")
    ids, X, notes = submission.read_submission(p, expected_ids=["a.zarr.zip", "b"], dim=2)
    assert ids == ["a", "b"] and notes["zarr_zip_not_removed_from_id_column"] is True
    np.testing.assert_array_equal(X, [[1, 2], [3, 4]])
    assert notes["n_dropped_ids"] == 1


def test_duplicate_ids_are_refused(tmp_path):
    p = _csv(tmp_path, "id,0\na,1\na.zarr.zip,2\n")
    with pytest.raises(SubmissionError, match="id 'a' appears more than once .rows 2 and 3"):
        submission.read_submission(p, dim=1)


def test_lenient_mode_follows_neuco_bench(tmp_path):
    p = _csv(tmp_path, "note,id,10,2,0\nx,a,1,2,3\ny,b,nan,oops,6\nz,c,7,8,9\n")
    ids, X, notes = submission.read_submission(
        p, expected_ids=["a", "b", "missing"], dim=5, strict=False
    )
    assert ids == ["a", "b"]  # 'c' is not expected: dropped; 'missing' is tolerated
    # digit columns sorted numerically (0, 2, 10), 'note' ignored, NaN/text -> 0, padded to 5
    np.testing.assert_array_equal(X, [[3, 2, 1, 0, 0], [6, 0, 0, 0, 0]])
    assert notes["n_values_set_to_zero"] == 2 and notes["n_padded_columns"] == 2
    assert notes["n_missing_ids"] == 1 and notes["n_dropped_ids"] == 1
    # no digit columns: every non-id column, in file order
    p = _csv(tmp_path, "id,f_b,f_a\na,1,2\n", "named.csv")
    assert submission.read_submission(p, dim=2, strict=False)[1].tolist() == [[1.0, 2.0]]
    # wider than dim is an error
    with pytest.raises(SubmissionError, match="3 embedding columns, more than the expected 2"):
        submission.read_submission(
            _csv(tmp_path, "id,0,1,2\na,1,2,3\n", "wide.csv"), dim=2, strict=False
        )


def test_unreadable_files(tmp_path):
    with pytest.raises(SubmissionError, match="does not exist"):
        submission.read_submission(tmp_path / "nope.csv")
    with pytest.raises(SubmissionError, match="not a readable CSV"):
        submission.read_submission(_csv(tmp_path, ""))


# --- NeuCo-Bench's SVM probe and its folds, against figures stored from its own evaluator ---------

# benchmarks/bench_neuco.py --save
NEUCO_SMALL = __import__("pathlib").Path(__file__).parent / "data" / "neuco_small"


def _probe_small(tmp_path, client, *extra):
    from cryocube.cli import main

    out = tmp_path / ("out" + "".join(e.replace("=", "-") for e in extra if "=" in e))
    rc = main(
        [
            "probe",
            str(NEUCO_SMALL / "embeddings.csv"),
            "--labels",
            str(NEUCO_SMALL / "labels"),
            "--out",
            str(out),
            "--standardize",
            "labelled",
            "--quiet",
            "--cluster",
            client.scheduler.address,
            *extra,
        ]
    )
    rec = json.loads((out / "results.jsonl").read_text().splitlines()[-1])
    summary = json.loads((out / "runs" / rec["run_id"] / "results_summary.json").read_text())
    return (
        rc,
        rec,
        {t.rsplit("__", 1)[0]: v for t, v in summary["task_fold_scores"].items()},
        {t.rsplit("__", 1)[0]: q for t, q in summary["task_q_scores"].items()},
    )


def test_svm_probe_with_file_folds_equals_neuco_bench_stored_figures(tmp_path, client):
    """The SVM (scikit-optimize's BayesSearchCV, random_state 42) draws the same random numbers as
    NeuCo-Bench's evaluator, so on its folds (fold_order=file over shuffled label files) every
    split's score and every task's Q equal the figures its own main.py gave (NeuCo-Bench commit in
    figures.json), within float arithmetic.
    """
    fig = json.loads((NEUCO_SMALL / "figures.json").read_text())
    assert fig["neuco_bench"]["commit"] == "a89ba06"
    svm = fig["probes"]["svm"]
    rc, rec, folds, q = _probe_small(
        tmp_path,
        client,
        "--probe",
        "svm",
        "--k",
        str(svm["k"]),
        "--set",
        f"n_iter={svm['n_iter']}",
        "--set",
        "fold_order=file",
    )
    assert (
        rc == 0 and rec["probe"]["fold_order"] == "file" and rec["probe"]["n_iter"] == svm["n_iter"]
    )
    assert set(q) == set(svm["neuco_task_q"]) == {"biomass", "soil_moisture", "cloud", "forest"}
    for t, ref in svm["neuco_split_scores"].items():
        np.testing.assert_allclose(folds[t], ref, rtol=1e-9, atol=1e-12, err_msg=t)
        assert q[t] == pytest.approx(svm["neuco_task_q"][t], rel=1e-9)
    # cryocube's default (id order) draws other folds from the same shuffled files: other per-split
    # scores
    _, rec_id, folds_id, _ = _probe_small(
        tmp_path, client, "--probe", "svm", "--k", str(svm["k"]), "--set", f"n_iter={svm['n_iter']}"
    )
    assert rec_id["run_id"] != rec["run_id"] and rec_id["probe"]["fold_order"] == "id"
    assert any(not np.allclose(folds_id[t], svm["neuco_split_scores"][t]) for t in folds_id)
    assert any("fold_order=file" in d for d in rec_id["neuco_bench_differences"])


def test_fold_order_switch_orders_rows_by_file_or_by_id():
    from cryocube.families.embedding.probe import Task, align, probe_recipe

    t = Task("x__regr", "regr", {"b": 2.0, "c": 3.0, "a": 1.0})
    ids = ["a", "b", "c"]
    assert align(ids, [t])[0][1].tolist() == [0, 1, 2]
    assert align(ids, [t], "file")[0][1].tolist() == [1, 2, 0]
    assert align(ids, [t], "file")[0][2].tolist() == [2.0, 3.0, 1.0]
    # the default keeps the run ids made before the switch
    assert "fold_order" not in probe_recipe().as_dict()
    assert probe_recipe(overrides={"fold_order": "file"}).as_dict()["fold_order"] == "file"
    with pytest.raises(UserError, match="fold_order must be one of id, file, got 'files'"):
        probe_recipe(overrides={"fold_order": "files"})


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"n_iter": 0}, "probe field n_iter must be an integer >= 1"),
        ({"degrees": "2,x"}, "probe field degrees must be a number"),
        ({"C_min": 10, "C_max": 1}, "C_min \\(10\\) must be below C_max"),
        ({"epochs": 3}, "the svm probe has no field 'epochs'"),
    ],
)
def test_svm_fields_are_checked_before_any_work(overrides, message):
    from cryocube.families.embedding.probe import probe_recipe

    with pytest.raises(UserError, match=message):
        probe_recipe("svm", overrides=overrides)
    r = probe_recipe("svm", overrides={"degrees": "2,3,4", "epsilons": "0.1"})
    assert r.probe_params()["degrees"] == (2, 3, 4) and r.probe_params()["epsilons"] == (0.1,)
