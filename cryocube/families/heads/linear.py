"""Linear heads on pooled features per (task, class), tuned on val (docs/vlm.md, Encoder heads)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...cluster.runtime import task_boundary
from ...embeddings.embed import load_embeddings
from ...questions.cells import answerable, scored_rows, target_of
from ...questions.metrics import box_iou

C_GRID = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0)  # logistic: inverse regularisation strength
ALPHA_GRID = (1000.0, 100.0, 10.0, 1.0, 0.1, 0.01)  # ridge: regularisation, strongest first


@dataclass(frozen=True)
class HeadsJob:
    embeddings: str  # the embedding store (families/embedding)
    questions: tuple  # every split's questions (vqa/questions.py)
    tasks: tuple  # TaskSpecs the heads answer
    split: tuple[str, ...]  # per cube sample
    ids: tuple[str, ...]  # per cube sample


def _clip(t, v: np.ndarray) -> np.ndarray:
    if t.answer == "number":
        return np.maximum(v, 0.0)
    if t.answer == "box":
        v = np.clip(v, 0.0, 1.0)  # corners sorted: (x0, y0) the smaller
        lo, hi = v[:, :2], v[:, 2:]
        return np.concatenate([np.minimum(lo, hi), np.maximum(lo, hi)], axis=1)
    return np.clip(v, 0.0, 1.0) if t.answer == "fraction" else v


def _val_score(t, pred, y) -> float:
    """Higher is better: accuracy, -MAE, mean box IoU (the task's own metrics)."""
    if t.answer == "class":
        return float(np.mean(pred == y))
    if t.answer == "box":
        return float(np.mean([box_iou(tuple(p), tuple(r)) for p, r in zip(pred, y)]))
    return -float(np.mean(np.abs(pred - y)))


def fit_head(t, Xtr, ytr, Xva, yva) -> tuple[object, dict]:
    """(a fitted predictor X -> answers, what was chosen)."""
    from sklearn.linear_model import LogisticRegression, Ridge

    classify = t.answer == "class"
    if classify and len(set(ytr.tolist())) < 2:  # nothing to learn: say so
        only = ytr[0]
        return (lambda X: np.full(len(X), only, dtype=object)), {
            "head": "constant (one class in train)",
            "class": str(only),
        }
    mu, sd = Xtr.mean(axis=0), Xtr.std(axis=0)
    sd = np.where(sd > 0, sd, 1.0)
    grid, param = (C_GRID, "C") if classify else (ALPHA_GRID, "alpha")

    def make(g):
        model = LogisticRegression(C=g, max_iter=5000) if classify else Ridge(alpha=g)
        return model.fit((Xtr - mu) / sd, ytr)

    def predict(m, X):
        return _clip(t, m.predict((X - mu) / sd))

    if len(Xva):
        scores = [(_val_score(t, predict(make(g), Xva), yva), -k) for k, g in enumerate(grid)]
        best = grid[-max(scores)[1]]
        val = {str(g): s for g, (s, _) in zip(grid, scores)}
        chosen = {"chosen_on": f"val ({len(Xva)} samples)", "val": val}
    else:
        best, chosen = 1.0, {"chosen_on": "no val samples: the default"}
    m = make(best)
    head = f"linear ({'logistic' if classify else 'ridge'})"
    return (lambda X: predict(m, X)), {"head": head, param: best, **chosen, "train": int(len(Xtr))}


@task_boundary
def answer_heads(job: HeadsJob) -> dict:
    """Fit a head per (task, class asked), answer the test questions, rows scored as VLM answers."""
    ids, E, _, _ = load_embeddings(job.embeddings)
    pos = {i: k for k, i in enumerate(ids)}
    X = np.asarray(E, np.float64)
    tasks = {t.name: t for t in job.tasks if answerable(t)}
    groups: dict[tuple, list] = {}
    for q in job.questions:
        if q.task in tasks:
            groups.setdefault((q.task, q.subject), []).append(q)
    answers: dict[tuple, object] = {}
    chosen: dict[str, dict] = {}
    for (name, subject), qs in sorted(groups.items()):
        t, key = tasks[name], f"{name}/{subject}" if subject else name
        part = {
            s: [q for q in qs if job.split[q.sample] == s and target_of(t, q) is not None]
            for s in ("train", "val")
        }
        if not part["train"]:
            chosen[key] = {"head": "none (no train sample has a reference)"}
            continue

        def xy(qq):
            y = [target_of(t, q) for q in qq]
            dtype = object if t.answer == "class" else np.float64
            return X[[pos[job.ids[q.sample]] for q in qq]], np.asarray(y, dtype=dtype)

        predict, chosen[key] = fit_head(t, *xy(part["train"]), *xy(part["val"]))
        test = [q for q in qs if job.split[q.sample] == "test"]
        if test:
            typed = {"box": lambda p: tuple(map(float, p)), "class": str}.get(t.answer, float)
            pred = predict(X[[pos[job.ids[q.sample]] for q in test]])
            answers |= {(q.sample, name, subject): typed(p) for q, p in zip(test, pred)}
    test_qs = [q for q in job.questions if job.split[q.sample] == "test"]
    rows = scored_rows(test_qs, tasks, lambda q: answers.get((q.sample, q.task, q.subject)))
    return {"rows": rows, "heads": chosen}
