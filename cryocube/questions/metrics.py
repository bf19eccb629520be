"""Per-answer scores and their means with bootstrap confidence intervals: every metric is a mean of
per-answer scores; an unparsed answer gets its metric's worst (or the task's `unparsed_value`)."""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any, Callable

import numpy as np

# metric -> (title, higher is better, percent?)
FACTS: dict[str, tuple[str, bool, bool]] = {
    "accuracy": ("accuracy", True, True),
    "mae": ("MAE", False, False),
    "box_iou": ("box IoU", True, True),
    "token_f1": ("token F1", True, True),
}


def normalize_answer(s: str) -> str:
    """SQuAD's normalisation before token F1: lower case, no punctuation or articles, one space."""
    s = str(s or "").lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def token_f1(prediction: str, reference: str) -> float:
    """SQuAD's F1 over normalised tokens (two empty answers agree; one empty scores 0)."""
    p, r = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not p or not r:
        return float(p == r)
    common = sum((Counter(p) & Counter(r)).values())
    if common == 0:
        return 0.0
    prec, rec = common / len(p), common / len(r)
    return 2 * prec * rec / (prec + rec)


def box_iou(a, b) -> float:
    """IoU of two boxes (x0, y0, x1, y1); a missing box scores 0, as two empty boxes do."""
    if a is None or b is None:
        return 0.0
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter / union) if union > 0 else 0.0


# metric -> one answer's score from (prediction, reference, parsed?, text=, unparsed_value=)
SCORES: dict[str, Callable[..., float]] = {
    "accuracy": lambda pred, ref, ok, **_: float(ok and pred == ref),
    "mae": lambda pred, ref, ok, unparsed_value=0.0, **_: float(
        abs((pred if ok else unparsed_value) - float(ref))
    ),
    "box_iou": lambda pred, ref, ok, **_: box_iou(pred if ok else None, ref),
    "token_f1": lambda pred, ref, ok, text="", **_: token_f1(text if ok else "", ref),
}


def score(name: str, pred: Any, ref: Any, ok: bool, **kw) -> float:
    """One answer's score by metric name: VLM answers and head or chance predictions alike."""
    return SCORES[name](pred, ref, ok, **kw)


def bootstrap_ci(
    values, n_boot: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (seeded: the same scores, the same interval)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(n_boot, v.size))].mean(axis=1)
    a = (1 - level) / 2
    return float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


def summarize(name: str, values, n_boot: int = 1000, seed: int = 0) -> dict[str, float]:
    """{value, ci_low, ci_high, n}: percentages for accuracy, IoU and F1, plain units for errors."""
    v = np.asarray(values, dtype=np.float64)
    k = 100.0 if FACTS[name][2] else 1.0
    lo, hi = bootstrap_ci(v, n_boot, seed=seed)
    return {
        "value": float(v.mean()) * k if v.size else float("nan"),
        "ci_low": lo * k,
        "ci_high": hi * k,
        "n": int(v.size),
    }


def confusion(refs: list[str], preds: list[str | None], labels: tuple[str, ...]) -> list[list[int]]:
    """Rows: reference class; columns: predicted class, then a last column for unparsed answers."""
    idx = {lab: i for i, lab in enumerate(labels)}
    m = np.zeros((len(labels), len(labels) + 1), dtype=np.int64)
    for r, p in zip(refs, preds):
        if r in idx:
            m[idx[r], idx.get(p, len(labels)) if p is not None else len(labels)] += 1
    return m.tolist()
