"""Cheap probes that score frozen embeddings on one scalar task: `fit_score(Xtr, ytr, Xte, yte,
kind, *, seed, **params) -> float`, seeded by its argument so a fold scores alike on any worker."""

from __future__ import annotations

import inspect
import math
from typing import Callable

import numpy as np
import torch

from cryocube.errors import ProbeError
from cryocube.families.embedding.neuco import scale_labels

KINDS = ("cls", "regr")


def binary_f1(preds: np.ndarray, target: np.ndarray, threshold: float = 0.5) -> float:
    """torchmetrics' BinaryF1Score: sigmoid if any value is outside [0,1], then `> threshold`."""
    p = np.asarray(preds, dtype=np.float64).ravel()
    t = np.asarray(target).ravel() > 0.5
    if not np.all((p >= 0) & (p <= 1)):
        with np.errstate(over="ignore"):
            p = 1.0 / (1.0 + np.exp(-p))
    hard = p > threshold
    denom = int(np.sum(hard)) + int(np.sum(t))  # 2 TP + FP + FN
    return 2 * int(np.sum(hard & t)) / denom if denom else 0.0


# torchmetrics' R2Score: a residual or total sum of squares within 1e-4 of zero counts as zero
R2_ATOL = 1e-4


def r2(preds: np.ndarray, target: np.ndarray) -> float:
    """torchmetrics' R2Score (NeuCo-Bench's metric), float32 sums: 1.0 when RSS ~ 0, 0.0 when only
    TSS ~ 0 (equal targets are scored, not failed), NaN below two rows."""
    p = torch.as_tensor(np.asarray(preds, dtype=np.float32).ravel())
    t = torch.as_tensor(np.asarray(target, dtype=np.float32).ravel())
    if t.numel() < 2:
        return math.nan
    s, ss = torch.sum(t), torch.sum(t * t)
    tss = float(ss - s * (s / t.numel()))
    rss = float(torch.sum((t - p) * (t - p)))
    if abs(rss) <= R2_ATOL:  # (NaN compares False everywhere, as in torch.isclose)
        return 1.0
    if abs(tss) <= R2_ATOL:
        return 0.0
    return 1.0 - rss / tss


def _check_kind(kind: str, task: str = "task") -> None:
    if kind not in KINDS:
        raise ProbeError(f"task {task!r} has kind {kind!r}; expected 'cls' or 'regr'.")


def metric(preds: np.ndarray, target: np.ndarray, kind: str) -> float:
    """Binary F1 for "cls", R² for "regr"."""
    _check_kind(kind)
    return binary_f1(preds, target) if kind == "cls" else r2(preds, target)


def linear_probe(
    Xtr: np.ndarray,
    ytr: np.ndarray,
    Xte: np.ndarray,
    yte: np.ndarray,
    kind: str,
    *,
    seed: int = 0,
    epochs: int = 10,
    lr: float = 1e-3,
    weight_decay: float = 0.01,
    batch_size: int = 64,
) -> float:
    """NeuCo-Bench's probe: Linear(D, 1) + AdamW, scored on the test rows per epoch (best wins)."""
    _check_kind(kind)
    g = torch.Generator().manual_seed(int(seed))
    xtr = torch.as_tensor(np.ascontiguousarray(Xtr, dtype=np.float32))
    xte = torch.as_tensor(np.ascontiguousarray(Xte, dtype=np.float32))
    ttr = torch.as_tensor(np.asarray(ytr, dtype=np.float32).reshape(-1, 1))
    yte = np.asarray(yte, dtype=np.float64)
    d = xtr.shape[1]
    layer = torch.nn.utils.skip_init(torch.nn.Linear, d, 1)  # leaves the global RNG untouched
    bound = 1.0 / math.sqrt(d) if d else 0.0  # torch's default init, drawn from our generator
    with torch.no_grad():
        layer.weight.uniform_(-bound, bound, generator=g)
        layer.bias.uniform_(-bound, bound, generator=g)
    opt = torch.optim.AdamW(layer.parameters(), lr=lr, weight_decay=weight_decay)
    loss_fn = torch.nn.BCEWithLogitsLoss() if kind == "cls" else torch.nn.MSELoss()
    best = math.nan
    for _ in range(int(epochs)):
        # a random-subset sampler over the train rows
        order = torch.randperm(xtr.shape[0], generator=g)
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(layer(xtr[idx]), ttr[idx])
            loss.backward()
            opt.step()
        with torch.no_grad():
            out = layer(xte).numpy().ravel()
        score = metric(out, yte, kind)
        if not math.isnan(score) and (math.isnan(best) or score > best):
            best = score
    return best


def knn_probe(
    Xtr: np.ndarray,
    ytr: np.ndarray,
    Xte: np.ndarray,
    yte: np.ndarray,
    kind: str,
    *,
    seed: int = 0,
    k: int = 200,
    temperature: float = 0.1,
    chunk: int = 1024,
) -> float:
    """PANGAEA-style weighted kNN on cosine similarity: top-k train rows, weights exp(sim / T)."""
    del seed  # deterministic; accepted for a uniform probe signature
    # rows scaled to unit L2 norm (zero rows stay zero)
    a, b = (
        X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)
        for X in (np.asarray(Xte, np.float32), np.asarray(Xtr, np.float32))
    )
    ytr = np.asarray(ytr, dtype=np.float64).ravel()
    kk = max(1, min(int(k), b.shape[0]))
    preds = np.empty(a.shape[0])
    for s in range(0, a.shape[0], chunk):
        sim = a[s : s + chunk] @ b.T
        top = np.argpartition(-sim, kk - 1, axis=1)[:, :kk]
        st = np.take_along_axis(sim, top, axis=1).astype(np.float64)
        # shift cancels in the normalised vote
        w = np.exp((st - st.max(axis=1, keepdims=True)) / temperature)
        preds[s : s + chunk] = (w * ytr[top]).sum(axis=1) / w.sum(axis=1)
    # cls: the weighted vote for class 1 is a probability in [0, 1]: F1 thresholds it at 0.5
    return metric(preds, yte, kind)


def linear_svm_probe(
    Xtr: np.ndarray,
    ytr: np.ndarray,
    Xte: np.ndarray,
    yte: np.ndarray,
    kind: str,
    *,
    seed: int = 0,
    C: float = 1.0,
    max_iter: int = 10_000,
    loss: str = "squared_epsilon_insensitive",
) -> float:
    """LinearSVC/SVR at a fixed C (not NeuCo-Bench's); the squared loss lets liblinear go fast."""
    from sklearn.svm import LinearSVC, LinearSVR

    ytr = np.asarray(ytr, dtype=np.float64).ravel()
    if kind == "cls":
        yb = (ytr > 0.5).astype(int)
        if np.unique(yb).size < 2:  # one class in the train rows: predict it
            return metric(np.full(len(Xte), float(yb[0])), yte, kind)
        model = LinearSVC(C=C, random_state=int(seed), max_iter=max_iter, dual="auto")
        model.fit(Xtr, yb)
        return metric(model.predict(Xte).astype(np.float64), yte, kind)
    model = LinearSVR(C=C, loss=loss, random_state=int(seed), max_iter=max_iter, dual="auto")
    model.fit(Xtr, ytr)
    return metric(model.predict(Xte), yte, kind)


def svm_search(
    X: np.ndarray,
    ys: np.ndarray,
    kind: str,
    splits: list[tuple[np.ndarray, np.ndarray]],
    *,
    seed: int = 42,
    # NeuCo-Bench's configs/sample_config_svm.yaml (@a89ba06): search space, BayesSearchCV settings
    C_min: float = 1e-3,
    C_max: float = 1e3,
    degrees: tuple[int, ...] = (2, 3),
    gamma_min: float = 1e-4,
    gamma_max: float = 10.0,
    coef0_min: float = -1.0,
    coef0_max: float = 2.0,
    epsilons: tuple[float, ...] = (0.01, 0.05, 0.1, 0.5),
    n_iter: int = 50,
    n_initial_points: int = 5,
    base_estimator: str = "RF",
) -> list[float]:
    """NeuCo-Bench's SVM probe for one task (its `SVMHPOptimizer`, docs/embeddings.md): one
    BayesSearchCV over the task's k splits; a split scores the best test metric reached."""
    _check_kind(kind)
    try:
        from skopt import BayesSearchCV
        from skopt.space import Categorical, Real
    except ImportError:
        raise ProbeError(
            "--probe svm needs scikit-optimize: pip install 'cryocube[neuco]'"
        ) from None
    from sklearn.svm import SVC, SVR

    y = np.array(ys, dtype=np.float64).ravel()
    space = {
        "C": Real(C_min, C_max, prior="log-uniform"),
        "degree": Categorical(list(degrees)),
        "kernel": Categorical(["poly"]),
        "gamma": Real(gamma_min, gamma_max, prior="log-uniform"),
        "coef0": Real(coef0_min, coef0_max, prior="uniform"),
    }
    if kind == "cls":
        model, scoring = SVC(), {"metric": "f1", "scoring": "accuracy"}
        y[y == 0] = -1  # NeuCo-Bench's prepare_targets
    else:
        model, scoring = SVR(), {"metric": "r2", "scoring": "neg_mean_squared_error"}
        space["epsilon"] = Categorical(list(epsilons))
    opt = BayesSearchCV(
        model,
        space,
        return_train_score=True,
        scoring=scoring,
        cv=list(splits),
        refit="scoring",
        optimizer_kwargs={
            "base_estimator": base_estimator,
            "n_initial_points": int(n_initial_points),
        },
        n_iter=int(n_iter),
        random_state=int(seed),
        n_jobs=1,
        n_points=1,
    )
    opt.fit(np.asarray(X, dtype=np.float32), y)
    # each split's best test metric over the settings tried, as NeuCo-Bench reads it
    return [float(max(opt.cv_results_[f"split{f}_test_metric"])) for f in range(len(splits))]


def keywords(fn: Callable) -> dict[str, object]:
    """A probe's own fields (what a recipe may set) with their defaults: keywords but the seed."""
    params = inspect.signature(fn).parameters.items()
    return {n: p.default for n, p in params if p.kind is p.KEYWORD_ONLY and n != "seed"}


ProbeFn = Callable[..., float]
PROBES: dict[str, ProbeFn] = {
    "linear": linear_probe,
    "knn": knn_probe,
    "linear-svm": linear_svm_probe,
}
# probes that score a task's splits at once (one search): name -> fn(X, ys, kind, splits)
TASK_PROBES: dict[str, Callable[..., list[float]]] = {"svm": svm_search}


def _prepare(
    X: np.ndarray, y: np.ndarray, kind: str, probe: str, task: str
) -> tuple[np.ndarray, np.ndarray, ProbeFn]:
    """Check one task's inputs and return (X float32, labels scaled to [0,1], probe function)."""
    _check_kind(kind, task)
    fn = PROBES.get(probe)
    if fn is None:
        raise ProbeError(
            f"unknown probe {probe!r} for task {task!r}; choose one of {sorted(PROBES)}."
        )
    X = np.asarray(X, dtype=np.float32)
    y = np.asarray(y, dtype=np.float64).ravel()
    if X.ndim != 2 or X.shape[0] != y.shape[0]:
        raise ProbeError(
            f"task {task!r}: embeddings of shape {X.shape} do not match {y.shape[0]} labels."
        )
    return X, check_labels(y, kind, task), fn


def check_labels(y: np.ndarray, kind: str, task: str) -> np.ndarray:
    """One task's labels, scaled to [0, 1], or a ProbeError naming the task (before any probe)."""
    y = np.asarray(y, dtype=np.float64).ravel()
    n_nan = int(np.isnan(y).sum())
    if n_nan:
        raise ProbeError(f"task {task!r} has {n_nan} empty labels; drop those rows before probing.")
    ys = scale_labels(y)
    if kind == "cls" and np.setdiff1d(np.unique(ys), [0.0, 1.0]).size:
        raise ProbeError(
            f"classification task {task!r} has {np.unique(y).size} distinct labels; binary F1"
            " needs two."
        )
    return ys


def fold_score(
    X: np.ndarray,
    y: np.ndarray,
    kind: str,
    train_idx: np.ndarray,
    test_idx: np.ndarray,
    probe: str = "linear",
    seed: int = 42,
    *,
    task: str = "task",
    **params,
) -> float:
    """One split of one task (raw labels, min-max scaled over all rows of y) -> its metric."""
    X, ys, fn = _prepare(X, y, kind, probe, task)
    return float(
        fn(X[train_idx], ys[train_idx], X[test_idx], ys[test_idx], kind, seed=seed, **params)
    )
