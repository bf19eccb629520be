"""Board cells: a family's (task, metric[, class]) figures on the test split's first phrasing, with
unit, sample hash, n and 95 % interval, so `report` can refuse a cell unlike its column's; and the
chance baseline's (the train split's majority class, mean number or mean box)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..families.split import samples_hash
from .metrics import FACTS, score, summarize

# answers an encoder head gives (text: cannot answer)
ANSWER_KINDS = ("class", "number", "fraction", "box")
# mae's unit by the task's answer kind
UNITS = {"number": "count", "fraction": "fraction of the tile"}


def unit(task, metric: str) -> str:
    """A cell's unit, which must match its column's: %, else the task's or its answer kind's."""
    return "%" if FACTS[metric][2] else (task.unit or UNITS.get(task.answer, task.answer))


def cells(
    rows: list[dict],
    tasks: dict,
    split: np.ndarray,
    ids: list[str],
    n_boot: int,
    seed: int,
    how: Callable[[Any, str], str | None] = lambda t, m: None,
) -> list[dict]:
    """The test split's cells of scored rows ({sample, task, scores, ok[, class]}) per task and
    metric, over every class (None) and per class."""
    # the first phrasing's
    test = [r for r in rows if split[r["sample"]] == "test" and r.get("variant", 0) == 0]
    out = []
    for name, t in tasks.items():
        rs = [r for r in test if r["task"] == name]
        classes = sorted({r["class"] for r in rs if r.get("class")})
        for c in [None] + classes:
            part = [r for r in rs if c is None or r.get("class") == c]
            for m, _, _ in t.metrics:
                scored = [r for r in part if m in r["scores"]]
                if not scored:
                    continue
                s = summarize(
                    m, np.asarray([r["scores"][m] for r in scored]), n_boot=n_boot, seed=seed
                )
                out.append(
                    {
                        "task": name,
                        "metric": m,
                        "class": c,
                        "unit": unit(t, m),
                        "split": "test",
                        "samples": samples_hash(ids[r["sample"]] for r in scored),
                        **s,
                        "unparsed": sum(not r.get("ok", True) for r in scored),
                        "how": how(t, m),
                    }
                )
    return out


def answerable(t) -> bool:
    """Whether an encoder head (and chance) gives this task's kind of answer."""
    return t.answer in ANSWER_KINDS


def target_of(t, q) -> Any:
    """The question's reference in the task's answer kind (its first metric not scored on text)."""
    kinds = {m: kind for m, kind, _ in t.metrics}
    for m, ref in q.refs:
        if kinds[m] != "answer":
            return tuple(ref) if t.answer == "box" else ref
    return None


def scored_rows(questions, tasks: dict, predict: Callable[[Any], Any]) -> list[dict]:
    """Rows of predictions (`predict(question)`) scored as the VLM's answers are, text left out."""
    rows = []
    for q in questions:
        t = tasks.get(q.task)
        if t is None or not answerable(t):
            continue
        kinds = {m: kind for m, kind, _ in t.metrics}
        p = predict(q)
        sc = {
            m: score(m, p, ref, p is not None, text="", unparsed_value=t.unparsed_value)
            for m, ref in q.refs
            if kinds[m] != "answer"
        }
        rows.append(
            {"sample": q.sample, "task": q.task, "scores": sc, "ok": p is not None}
            | ({"class": q.subject} if q.subject else {})
        )
    return rows


def chance(questions, tasks: dict, split: np.ndarray) -> Callable[[Any], Any]:
    """The chance answer per (task, class) from train: majority class, mean number, mean box."""
    by: dict[tuple, list] = {}
    for q in questions:
        t = tasks.get(q.task)
        if t is not None and answerable(t) and split[q.sample] == "train":
            v = target_of(t, q)
            if v is not None:
                by.setdefault((q.task, q.subject), []).append(v)
    guess = {}
    for (name, c), vs in by.items():
        t = tasks[name]
        if t.answer == "class":
            guess[(name, c)] = max(t.labels, key=lambda lab: (vs.count(lab), -t.labels.index(lab)))
        elif t.answer == "box":
            guess[(name, c)] = tuple(float(x) for x in np.mean(np.asarray(vs, np.float64), axis=0))
        else:
            guess[(name, c)] = float(np.mean(vs))
    return lambda q: guess.get((q.task, q.subject))


# how chance answers, by answer kind (numbers and fractions: the train mean)
CHANCE_HOW = dict.fromkeys(ANSWER_KINDS, "train mean") | {
    "class": "majority train class",
    "box": "mean train box",
}


def chance_cells(
    questions, tasks: dict, split: np.ndarray, ids: list[str], n_boot: int, seed: int
) -> list[dict]:
    """The chance baseline's cells: train-split guesses scored on the test questions."""
    # a sample once, however many phrasings
    questions = [q for q in questions if getattr(q, "variant", 0) == 0]
    test = [q for q in questions if split[q.sample] == "test"]
    rows = scored_rows(test, tasks, chance(questions, tasks, split))
    return cells(rows, tasks, split, ids, n_boot, seed, how=lambda t, m: CHANCE_HOW[t.answer])
