"""From a cube to questions: which sample is asked which task, its prompt and its references, read
from coordinates and small variables (docs/insar-cube.md), never pixels; a task the cube holds no
reference for is left out (said in the record), a cube that serves none of them refused."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cube import TileCube, as_text, open_view, sample_ids
from ..errors import UserError
from ..families.class_labels import class_labels
from .render import band_facts, tile_bands
from .tasks import TaskSpec, fill


@dataclass(frozen=True)
class Question:
    sample: int  # index in the cube
    source: str
    task: str
    prompt: str
    refs: tuple[tuple[str, Any], ...]  # (metric, reference) where the sample has a reference
    size: tuple[int, int] = (0, 0)  # the pair's own (width, height): the cube pads smaller ones
    subject: str = ""  # tiles: the class asked about
    variant: int = 0  # which phrasing of the task (TaskSpec.phrasings; 0: the board's)


def _text(a) -> list[str]:
    return [str(x) for x in as_text(np.asarray(a))]


class _References:
    """A sample cube's references per sample, checked against its digests (a damaged chunk is an
    error, not fill values); each lookup gives them, or why the cube has none for anyone."""

    def __init__(self, cube, url: str):
        self.url, n = url, cube.n
        self.tnames, self.classes = cube.tasks, _text(cube.values("task_classes"))
        self.ws, self.hs = (np.asarray(cube.values(k), np.int64) for k in ("width", "height"))
        self.target_values = (
            np.asarray(cube.checked("target"), np.float64) if self.tnames else np.zeros((n, 0))
        )
        box = cube.checked("box")
        self.boxes = None if box is None else np.asarray(box, np.float64)
        self.text_tasks = _text(cube.values("text_task"))
        self.answers = (
            [_text(row) for row in cube.checked("answer")]
            if cube.has("answer") and self.text_tasks
            else []
        )

    def __call__(self, t: TaskSpec, kind: str, name: str):
        return getattr(self, kind if kind in ("target", "box") else "text")(t, name)

    def target(self, t: TaskSpec, name: str):
        if name not in self.tnames:
            return None, f"the cube has no target {name!r}"
        j = self.tnames.index(name)
        col = self.target_values[:, j]
        if t.answer != "class":
            return [float(v) if math.isfinite(v) else None for v in col], None
        names = self.classes[j].split("|") if self.classes[j] else []
        if bad := [c for c in names if c not in t.labels]:
            raise UserError(
                f"{self.url}: target {name!r} has class {bad[0]!r}, which task {t.name} cannot"
                f" answer (its labels: {', '.join(t.labels)}; {t.source})"
            )
        return [names[int(v)] if math.isfinite(v) else None for v in col], None

    def box(self, t: TaskSpec, name: str):
        if self.boxes is None:
            return None, "the cube has no box variable"
        return [
            tuple(float(c) for c in b / (w, h, w, h)) if np.isfinite(b).all() else None
            for b, w, h in zip(self.boxes, self.ws, self.hs)
        ], None

    def text(self, t: TaskSpec, name: str):
        if name not in self.text_tasks:
            return None, f"the cube has no reference answers for {name!r}"
        j = self.text_tasks.index(name)
        return [a[j] if a[j] else None for a in self.answers], None


def _served(tasks: list[TaskSpec], reference, unavailable: dict) -> tuple[dict, dict[str, str]]:
    """{task: (spec, [(metric, references)])} of the tasks with references; {task: why not}."""
    served, left_out = {}, {}
    for t in tasks:
        per_metric, why = [], []
        for m, kind, name in t.metrics:
            vals, reason = reference(t, kind, name)
            if vals is None or all(v is None for v in vals):
                why.append(f"{m}: {reason or 'no sample has a reference'}")
            else:
                per_metric.append((m, vals))
        if per_metric:
            served[t.name] = (t, per_metric)
        else:
            reason = unavailable.get(t.name)
            left_out[t.name] = "; ".join(why) + (f" ({reason})" if reason else "")
    return served, left_out


def questions(
    url: str, tasks: list[TaskSpec], every_split: bool = False
) -> tuple[list[Question], dict[str, str]]:
    """Every question of the cube for `tasks` in (sample, task) order, and {task: why left out};
    `every_split`: a tile cube's train and val tiles too (what heads and chance learn from)."""
    cube = open_view(url)
    if isinstance(cube, TileCube) and "class_fraction" in cube.ds:
        return tile_questions(url, cube.ds, tasks, every_split)
    if isinstance(cube, TileCube) or not cube.has("image"):
        raise UserError(
            f"{url}: the vqa protocol needs an interferogram sample cube (cryocube convert"
            " insar|hephaestus); this cube has no image-level references"
        )
    src = _text(cube.ds["source"].values)
    ref = _References(cube, url)
    served, left_out = _served(tasks, ref, cube.ds.attrs.get("unavailable") or {})
    # the interferogram facts, with declared defaults where the cube has none (SAMPLE_VARS)
    facts = {k: _text(cube.values(k)) for k in ("primary_date", "secondary_date", "frame")}
    lam = np.asarray(cube.values("radar_wavelength_m"), np.float64)
    out: list[Question] = []
    for i in range(cube.n):
        size = (int(ref.ws[i]), int(ref.hs[i]))
        sample = {k: v[i] for k, v in facts.items()} | {"radar_wavelength_m": lam[i]}
        sample |= {"width": size[0], "height": size[1], "rendered": cube.rendered}
        for name, (t, per_metric) in served.items():
            if refs := tuple((m, vals[i]) for m, vals in per_metric if vals[i] is not None):
                out += [
                    Question(i, src[i], name, fill(t, sample, k), refs, size, variant=k)
                    for k in range(len(t.phrasings))
                ]
    if not out:
        raise UserError(
            f"{url}: the cube serves none of the tasks {', '.join(t.name for t in tasks)} ("
            + "; ".join(f"{k}: {v}" for k, v in left_out.items())
            + ")"
        )
    return out, left_out


def tile_questions(
    url: str, ds, tasks: list[TaskSpec], every_split: bool = False
) -> tuple[list[Question], dict[str, str]]:
    """A tile cube's questions: every test tile with labelled pixels, each task, each class but the
    task's skip_classes, against the class's derived label (`class: present|fraction`)."""
    ids = [str(i) for i in sample_ids(ds, url)]
    split = np.asarray(as_text(ds["split"].values))
    labelled, per_class = class_labels(ds)
    asked = np.flatnonzero((split == "test") & labelled)
    if every_split and asked.size:
        asked = np.flatnonzero(labelled)
    if not asked.size:
        raise UserError(
            f"{url}: no test-split tile has a labelled pixel, and the Cryo-Bench questions ask the"
            " test split"
        )
    h, w = int(ds.sizes["y"]), int(ds.sizes["x"])
    facts = band_facts(ds)
    plan = []
    for t in tasks:
        presence = any(kind == "class" and ref == "present" for _, kind, ref in t.metrics)
        if t.answer == "class" and presence and len(t.labels) != 2:
            raise UserError(
                f"{t.source}: task {t.name}: a presence answer needs two labels (absent, present), "
                f"got {', '.join(t.labels)}"
            )
        classes = [c for c in per_class if c.name not in t.skip_classes]
        plan.append((t, classes, tile_bands(facts, t.render, f"{url}: task {t.name}")[1]))

    def ref(t: TaskSpec, name: str, c, i: int):
        v = float(c.present[i] if name == "present" else c.fraction[i])
        return t.labels[int(v)] if t.answer == "class" else v

    sample = {"dataset": str(ds.attrs.get("dataset", "")), "width": w, "height": h}
    out = []
    for i in map(int, asked):
        for t, classes, picture in plan:
            for c in classes:
                filled = sample | {"class_name": c.name, "picture": picture}
                refs = tuple((m, ref(t, name, c, i)) for m, _, name in t.metrics)
                out += [
                    Question(i, ids[i], t.name, fill(t, filled, k), refs, (w, h), c.name, k)
                    for k in range(len(t.phrasings))
                ]
    return out, {}
