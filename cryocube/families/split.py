"""The one split every family scores a cube's board on (a tile cube's published `split`, a sample
cube's drawn from its checksum by `RULE`), and a board cell's samples' identity (`samples_hash`)."""

from __future__ import annotations

import hashlib
from typing import Iterable

import numpy as np

from ..cube import as_text, open_cube, sample_ids

SPLITS = ("train", "val", "test")
RULE = (
    "drawn per cube from its checksum, stratified on the joint answer classes of the cube's class"
    " tasks and the presence of a deformation box; a sample with a label for any task is labelled;"
    " each class with at least as many labelled samples as splits is placed in val and test first"
    " (rarest first, never taking a class's last train sample), then each joint class is split by"
    " the fractions; unlabelled samples go to train"
)
BOX, NO_BOX = "box", "no box"  # the box axis' two answers


def draw_split(classes: np.ndarray, fractions: dict[str, float], seed: int) -> np.ndarray:
    """The split, by `RULE` (its two steps: docs/segmentation.md), of samples whose answer classes
    are `classes` (n samples x k axes, "" where a sample has no label on an axis)."""
    classes = np.asarray(classes, dtype=object).reshape(len(classes), -1)
    n, k = classes.shape
    out = np.full(n, "train", dtype=object)
    rng = np.random.default_rng(seed)
    order = rng.permutation(np.flatnonzero((classes != "").any(axis=1)))
    # one column per (axis, class), rarest first
    labels = sorted(
        {(j, c) for j in range(k) for c in set(classes[:, j].tolist()) - {""}},
        key=lambda lab: (int((classes[:, lab[0]] == lab[1]).sum()), lab),
    )
    member = np.stack(
        [classes[order, j] == c for j, c in labels] or [np.zeros(order.size, bool)], axis=1
    )
    size = member.sum(axis=0)
    big = size >= len(SPLITS)
    for split in ("test", "val"):
        if fractions.get(split, 0) <= 0:
            continue
        for li in range(len(labels)):
            where = out[order]
            present = member[where == split].any(axis=0)
            if not big[li] or present[li]:
                continue
            train = where == "train"
            last = big & (member[train].sum(axis=0) < 2)  # classes with one train sample left
            cands = np.flatnonzero(train & member[:, li] & ~member[:, last].any(axis=1))
            if cands.size:  # in seeded order, the first naming most classes the split lacks
                gain = member[cands][:, ~present].sum(axis=1)
                out[order[cands[int(np.argmax(gain))]]] = split
    joint = ["\x1f".join(map(str, row)) for row in classes[order].tolist()]
    groups: dict[str, list[int]] = {}
    for i, key in zip(order.tolist(), joint):
        groups.setdefault(key, []).append(i)
    for members in groups.values():
        for split in ("test", "val"):
            want = round(len(members) * fractions.get(split, 0))
            have = sum(out[i] == split for i in members)
            free = [i for i in members if out[i] == "train"]
            for i in free[: max(0, min(want - have, len(free) - 1))]:
                out[i] = split
    return out.astype(str)


DEFAULT_FRACTIONS = {"train": 0.6, "val": 0.2, "test": 0.2}  # of a cube whose mask gives none


def answer_classes(ds) -> tuple[np.ndarray, list[str], np.ndarray]:
    """(answer class per sample and axis, axes' names, labelled per sample) of a sample cube."""
    n = int(ds.sizes["sample"])
    cols, names = [], []
    labelled = np.zeros(n, bool)
    if "target" in ds and "task" in ds.dims:
        target = np.asarray(ds["target"].values, np.float64).reshape(n, -1)
        labelled |= np.isfinite(target).any(axis=1)
        tasks = [str(t) for t in as_text(ds["task"].values)]
        kinds = as_text(ds["task_type"].values) if "task_type" in ds else [""] * len(tasks)
        named = as_text(ds["task_classes"].values) if "task_classes" in ds else [""] * len(tasks)
        for j, (task, kind, cls) in enumerate(zip(tasks, kinds, named)):
            if str(kind) != "cls":
                continue
            labs = dict(enumerate(str(cls).split("|"))) if cls else {}
            col = [labs.get(int(v), str(int(v))) if np.isfinite(v) else "" for v in target[:, j]]
            cols.append(np.array(col, dtype=object))
            names.append(task)
    if "box" in ds:
        has_box = np.isfinite(np.asarray(ds["box"].values, np.float64)).all(axis=1)
        cols.append(np.where(has_box, BOX, NO_BOX).astype(object))
        names.append(str(ds.attrs.get("box_task") or "box"))
        labelled |= has_box
    if "mask_pixels" in ds:
        labelled |= np.asarray(ds["mask_pixels"].values).sum(axis=1) > 0
    if "answer" in ds:
        labelled |= (np.asarray(as_text(ds["answer"].values)).reshape(n, -1) != "").any(axis=1)
    classes = np.stack(cols, axis=1) if cols else np.full((n, 0), "", dtype=object)
    classes[~labelled] = ""
    return classes, names, labelled


def class_counts(classes: np.ndarray, names: list[str], splits: np.ndarray) -> dict:
    """{axis: {class: {train, val, test}}}: where each answer class of a sample cube went."""
    out: dict = {}
    for j, name in enumerate(names):
        col = classes[:, j]
        out[name] = {
            str(c): {s: int(((col == c) & (splits == s)).sum()) for s in SPLITS}
            for c in sorted(set(col.tolist()) - {""})
        }
    return out


def sample_split(ds, checksum: str) -> tuple[np.ndarray, np.ndarray, dict]:
    """(split per sample, joint answer class per sample, the split's record) of a sample cube."""
    opts = dict(ds.attrs.get("mask") or {})
    fractions = dict(opts.get("split") or DEFAULT_FRACTIONS)
    n = int(ds.sizes["sample"])
    classes, names, labelled = answer_classes(ds)
    seed = int(checksum[:8], 16)
    splits = draw_split(classes, fractions, seed)
    strata = np.array(
        [", ".join(c for c in row if c) or "unlabelled" for row in classes.tolist()]
        if classes.shape[1]
        else ["labelled" if x else "unlabelled" for x in labelled]
    ).astype(str)
    origin = as_text(ds["mask_origin"].values) if "mask_origin" in ds else np.full(n, "")
    record = {
        "rule": RULE,
        "fractions": fractions,
        "seed": seed,
        **_facts(splits),
        "classes": class_counts(classes, names, splits),
        "mask_origin": {str(o): int((origin == o).sum()) for o in sorted(set(origin.tolist()))},
    }
    return splits, strata, record


def cube_split(url: str, checksum: str) -> tuple[np.ndarray, list[str], dict]:
    """(split per sample, sample ids, record): the split every family scores a cube's board on."""
    ds = open_cube(url)
    ids = [str(i) for i in sample_ids(ds, url)]
    if ds.attrs.get("kind") == "samples":
        splits, _, record = sample_split(ds, checksum)
        return splits, ids, record
    splits = np.asarray(as_text(ds["split"].values)).astype(str)
    return splits, ids, {"rule": "the dataset's published split", **_facts(splits)}


def _facts(splits: np.ndarray) -> dict:
    """A split's digest and counts per split, as its record holds them."""
    digest = hashlib.sha256("|".join(splits.tolist()).encode()).hexdigest()[:12]
    return {"digest": digest, "counts": {s: int((splits == s).sum()) for s in SPLITS}}


def samples_hash(ids: Iterable[str]) -> str:
    """The identity of a set of scored samples (order-free)."""
    return hashlib.sha256("\n".join(sorted(set(map(str, ids)))).encode()).hexdigest()[:12]
