"""Board cells: what a family contributes to a comparison board, on the one split every family scores on.

A cell is one (task, metric[, class]) figure: its unit, the split, a hash of the sample ids scored, n, the
value and its 95 % bootstrap interval (families/vqa/metrics.py). `report` lays cells out in columns and refuses
a cell whose samples or unit differ from its column's (report/vqa.py), so a column compares like with like.

The split is one per cube: a tile cube's published `split`; a sample cube's split drawn once from its checksum,
stratified by deformation box / none / unlabelled (segmentation/sample_cubes.py draws the same one). Chance rows
come from here too: the train split's majority class, mean number or mean box, scored on the test questions.
"""
from __future__ import annotations

import hashlib
from typing import Any, Callable, Iterable

import numpy as np

STRATA = ("deformation", "no deformation", "unlabelled")


def draw_split(strata: np.ndarray, fractions: dict[str, float], seed: int) -> np.ndarray:
    """Per stratum (shuffled by `seed`): round(n * fraction) samples to test and to val (at least one each from a
    stratum of >= 3 samples, none from a smaller one or from unlabelled samples), the rest to train."""
    out = np.full(strata.size, "train", dtype=object)
    rng = np.random.default_rng(seed)
    for s in STRATA:
        members = rng.permutation(np.flatnonzero(strata == s))
        if s == "unlabelled" or members.size < 3:
            continue
        n_test = max(1, round(members.size * fractions["test"]))
        n_val = max(1, round(members.size * fractions["val"]))
        n_val = min(n_val, members.size - n_test - 1)
        out[members[:n_test]] = "test"
        out[members[n_test : n_test + n_val]] = "val"
    return out.astype(str)


DEFAULT_FRACTIONS = {"train": 0.6, "val": 0.2, "test": 0.2}  # a sample cube whose catalog gives none (no mask)
ANSWER_KINDS = ("class", "number", "fraction", "box")  # answers an encoder head gives (text: cannot answer)
UNITS = {"number": "count", "fraction": "fraction of the tile"}  # mae's unit by the task's answer kind


def sample_split(ds, checksum: str) -> tuple[np.ndarray, np.ndarray, dict]:
    """(split per sample, stratum per sample, the split's record) of an open sample cube, drawn from its checksum."""
    from ..cube import as_text

    opts = dict(ds.attrs.get("mask") or {})
    fractions = dict(opts.get("split") or DEFAULT_FRACTIONS)
    n = int(ds.sizes["sample"])
    labelled = (np.asarray(ds["mask_pixels"].values).sum(axis=1) > 0) if "mask_pixels" in ds else np.ones(n, bool)
    has_box = np.isfinite(np.asarray(ds["box"].values, np.float64)).all(axis=1) if "box" in ds else np.zeros(n, bool)
    strata = np.where(~labelled, STRATA[2], np.where(has_box, STRATA[0], STRATA[1])).astype(str)
    seed = int(checksum[:8], 16)
    splits = draw_split(strata, fractions, seed)
    digest = hashlib.sha256(("|".join(splits.tolist())).encode()).hexdigest()[:12]
    origin = as_text(ds["mask_origin"].values) if "mask_origin" in ds else np.full(n, "")
    record = {"rule": "drawn per cube from its checksum, stratified by deformation box / no box / unlabelled "
                      "(unlabelled samples and strata under 3 samples go to train)",
              "fractions": fractions, "seed": seed, "digest": digest,
              "counts": {s: int((splits == s).sum()) for s in ("train", "val", "test")},
              "mask_origin": {str(o): int((origin == o).sum()) for o in sorted(set(origin.tolist()))}}
    return splits, strata, record


def cube_split(url: str, checksum: str) -> tuple[np.ndarray, list[str], dict]:
    """(split per sample, sample ids, record): the split every family scores a cube's board on."""
    from ..cube import as_text, open_cube, sample_ids

    ds = open_cube(url)
    ids = [str(i) for i in sample_ids(ds, url)]
    if ds.attrs.get("kind") == "samples":
        splits, _, record = sample_split(ds, checksum)
        return splits, ids, record
    splits = np.asarray(as_text(ds["split"].values)).astype(str)
    return splits, ids, {"rule": "the dataset's published split", "digest": hashlib.sha256(
        "|".join(splits.tolist()).encode()).hexdigest()[:12], "counts": {s: int((splits == s).sum()) for s in ("train", "val", "test")}}


def samples_hash(ids: Iterable[str]) -> str:
    """The identity of a set of scored samples (order-free)."""
    return hashlib.sha256("\n".join(sorted(set(map(str, ids)))).encode()).hexdigest()[:12]


def unit(task, metric: str) -> str:
    from .vqa.metrics import FACTS

    return "%" if FACTS[metric][2] else UNITS.get(task.answer, task.answer)


def cells(rows: list[dict], tasks: dict, split: np.ndarray, ids: list[str], n_boot: int, seed: int,
          how: Callable[[Any, str], str | None] = lambda t, m: None) -> list[dict]:
    """The test split's cells of scored rows ({sample, task, scores, ok[, class]}): per task and metric, over every
    class (class None) and, where rows have classes, per class; each with n, unparsed, interval and sample hash."""
    from .vqa.metrics import summarize

    test = [r for r in rows if split[r["sample"]] == "test"]
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
                s = summarize(m, np.asarray([r["scores"][m] for r in scored]), n_boot=n_boot, seed=seed)
                out.append({"task": name, "metric": m, "class": c, "unit": unit(t, m), "split": "test",
                            "samples": samples_hash(ids[r["sample"]] for r in scored), **s,
                            "unparsed": sum(not r.get("ok", True) for r in scored), "how": how(t, m)})
    return out


def answerable(t) -> bool:
    """Whether an encoder head (and chance) gives this task's kind of answer."""
    return t.answer in ANSWER_KINDS


def target_of(t, q) -> Any:
    """The question's reference in the task's answer kind (the first metric that is not scored against text)."""
    kinds = {m: kind for m, kind, _ in t.metrics}
    for m, ref in q.refs:
        if kinds[m] != "answer":
            return tuple(ref) if t.answer == "box" else ref
    return None


def scored_rows(questions, tasks: dict, predict: Callable[[Any], Any]) -> list[dict]:
    """Rows of predictions (`predict(question)`: a value of the task's answer kind) scored as the VLM's parsed
    answers are, against the same references; metrics scored against text are left out (no text to score)."""
    from .vqa.metrics import score

    rows = []
    for q in questions:
        t = tasks.get(q.task)
        if t is None or not answerable(t):
            continue
        kinds = {m: kind for m, kind, _ in t.metrics}
        p = predict(q)
        sc = {m: score(m, p, ref, p is not None, text="", unparsed_value=t.unparsed_value)
              for m, ref in q.refs if kinds[m] != "answer"}
        rows.append({"sample": q.sample, "task": q.task, "scores": sc, "ok": p is not None}
                    | ({"class": q.subject} if q.subject else {}))
    return rows


def chance(questions, tasks: dict, split: np.ndarray) -> Callable[[Any], Any]:
    """The chance answer per (task, class), from the train split: majority class (ties: the task's label order),
    mean number, mean box."""
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


CHANCE_HOW = {"class": "majority train class", "number": "train mean", "fraction": "train mean", "box": "mean train box"}


def chance_cells(questions, tasks: dict, split: np.ndarray, ids: list[str], n_boot: int, seed: int) -> list[dict]:
    rows = scored_rows([q for q in questions if split[q.sample] == "test"], tasks, chance(questions, tasks, split))
    return cells(rows, tasks, split, ids, n_boot, seed, how=lambda t, m: CHANCE_HOW[t.answer])
