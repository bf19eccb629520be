"""The map side: a Dask task per block of samples generates its answers (the model loaded once per
worker), keeps them in the run's folder for a rerun to read back, then parses and scores them."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass

import numpy as np

from ... import store as _store
from ...adapters import get
from ...adapters.base import ModelRef
from ...cluster.runtime import task_boundary, torch_task
from ...cube import read_samples
from ...questions.ask import Question
from ...questions.metrics import confusion, score, summarize
from ...questions.parsers import parse
from ...questions.render import render
from ...questions.tasks import TaskSpec


@dataclass(frozen=True)
class Block:
    cube: str
    bands: tuple[str, ...]
    rendered: bool
    questions: tuple[Question, ...]
    tasks: tuple[TaskSpec, ...]
    model: ModelRef
    gen_batch: int
    threads: int | None
    url: str  # where the block's answers are kept
    size: tuple[int, int] = (0, 0)  # the cube's (width, height)
    facts: tuple = ()  # tiles: the cube's bands (render.BandFacts), to pick what is drawn
    blind: bool = False  # the blind baseline: the model sees a blank picture of the same size


BLANK = 128  # the blind baseline's picture: uniform mid grey


def blank_like(picture: np.ndarray) -> np.ndarray:
    """A picture of the same size with nothing in it (what the blind baseline shows)."""
    return np.full_like(picture, BLANK)


def block_url(run_dir: str, index: int) -> str:
    """Where block `index` keeps its answers, read back by a rerun asking the same questions."""
    return f"{run_dir.rstrip('/')}/answers/block-{index:05d}.json"


def draw(b: Block, samples: list[int], sizes: dict, specs, blind: bool) -> dict:
    """{spec: {sample: picture}}: the samples as the model is shown them under each way of drawing
    (task files may differ), or blank (the blind baseline)."""
    images, _ = read_samples(b.cube, samples, labels=False)
    if images.ndim == 5:  # a time axis of one step
        images = images[:, 0]
    out: dict = {}
    for spec in specs:
        for k, s in enumerate(samples):
            w, h = sizes[s]  # the pair's own pixels: smaller pairs are padded bottom/right
            pic = images[k][:, :h, :w] if w and h else images[k]
            pic = render(pic, list(b.bands), spec, b.rendered, f"{b.cube}: sample {s}", b.facts)
            out.setdefault(spec, {})[s] = blank_like(pic) if blind else pic
    return out


def _generate(b: Block) -> tuple[list[dict], float, str]:
    samples = sorted({q.sample for q in b.questions})
    sizes = {q.sample: q.size for q in b.questions}
    pictures = draw(b, samples, sizes, dict.fromkeys(t.render for t in b.tasks), b.blind)
    gens: list[dict | None] = [None] * len(b.questions)
    with torch_task(b.threads) as (device, _threads):
        adapter = get(b.model.adapter)(b.model, device)
        t0 = time.perf_counter()
        for t in b.tasks:
            idx = [i for i, q in enumerate(b.questions) if q.task == t.name]
            for k in range(0, len(idx), b.gen_batch):
                part = idx[k : k + b.gen_batch]
                imgs = [pictures[t.render][b.questions[i].sample] for i in part]
                outs = adapter.generate(
                    imgs, [b.questions[i].prompt for i in part], t.max_new_tokens
                )
                for i, g in zip(part, outs):
                    gens[i] = {"answer": g.text, "new_tokens": g.new_tokens}
        seconds = time.perf_counter() - t0
    return [g for g in gens if g is not None], seconds, str(device)


def questions_key(questions: tuple[Question, ...]) -> str:
    """What a kept block file answered: a resume with another `block_samples` cuts other blocks
    under the same file names, and answers kept for other questions must not be read as these."""
    asked = [[q.sample, q.task, q.variant, q.prompt] for q in questions]
    return hashlib.sha256(json.dumps(asked).encode()).hexdigest()


def _kept(b: Block) -> dict | None:
    """The block's kept answers, when the file holds answers to exactly these questions."""
    if not _store.file_exists(b.url):
        return None
    kept = json.loads(_store.read_text(b.url))
    same = kept.get("questions") == questions_key(b.questions)
    return kept if same and len(kept["answers"]) == len(b.questions) else None


def _row(q: Question, g: dict, t: TaskSpec, panel: tuple[int, int]) -> dict:
    """One answer parsed and scored against each of the question's references."""
    # boxes are fractions of the phase panel: an answer in pixels is read against the panel shown
    size = ((q.size[0] or panel[0]) * t.render.scale, (q.size[1] or panel[1]) * t.render.scale)
    options = t.parser_options(q.variant) | ({"size": size} if t.answer == "box" else {})
    p = t.checked(parse(t.answer, g["answer"], prompt=q.prompt, **options))
    return (
        {
            "sample": q.sample,
            "source": q.source,
            "task": q.task,
            "prompt": q.prompt,
            "answer": g["answer"],
            "new_tokens": g["new_tokens"],
            "parsed": list(p.value) if isinstance(p.value, tuple) else p.value,
            "ok": p.ok,
            "refs": {m: list(r) if isinstance(r, tuple) else r for m, r in q.refs},
            "scores": {
                m: score(m, p.value, ref, p.ok, text=p.text, unparsed_value=t.unparsed_value)
                for m, ref in q.refs
            },
        }
        | ({"class": q.subject} if q.subject else {})
        | ({"variant": q.variant} if t.variants else {})
    )


@task_boundary
def answer_block(b: Block) -> dict:
    """The score task: the block's answers (generated, or kept) parsed and scored into rows."""
    kept = _kept(b)
    generated = kept is None
    if generated:
        gens, seconds, device = _generate(b)
        kept = {"answers": gens, "seconds": seconds, "model_sha256": b.model.sha256}
        _store.write_atomic(b.url, json.dumps(kept | {"questions": questions_key(b.questions)}))
    gens = kept["answers"]
    by_task = {t.name: t for t in b.tasks}
    return {
        "rows": [_row(q, g, by_task[q.task], b.size) for q, g in zip(b.questions, gens)],
        "blocks": 1,
        "generated": int(generated),
        "gen_s": kept["seconds"] if generated else 0.0,
        "tokens": sum(g["new_tokens"] for g in gens) if generated else 0,
        "questions_generated": len(gens) if generated else 0,
        # where this run generated (blocks kept from before: not)
        "devices": [device] if generated else [],
    }


def merge(a: dict, b: dict) -> dict:
    """The reduce: rows concatenated, every other field added (counts summed, lists joined)."""
    return {"rows": a["rows"] + b["rows"]} | {k: a[k] + b[k] for k in a if k != "rows"}


def _part(rows: list[dict], t: TaskSpec, n_boot: int, seed: int, every: bool = True) -> dict:
    """n, unparsed and each metric's mean and bootstrap CI (`every=False`: metrics with scores)."""
    metrics = {}
    for m, _, _ in t.metrics:
        vals = [r["scores"][m] for r in rows if m in r["scores"]]
        if vals or every:
            metrics[m] = summarize(m, np.asarray(vals), n_boot=n_boot, seed=seed)
    return {"n": len(rows), "unparsed": sum(not r["ok"] for r in rows), "metrics": metrics}


def summarize_rows(rows: list[dict], tasks: dict[str, TaskSpec], n_boot: int, seed: int) -> dict:
    """Per task on its first phrasing (the board's): n, unparsed, `unparsed_value`, each metric's
    mean and bootstrap CI; class tasks add a confusion matrix, phrased ones each phrasing's too."""
    out = {}
    for name, t in tasks.items():
        every = [r for r in rows if r["task"] == name]
        rs = [r for r in every if r.get("variant", 0) == 0]
        if not rs:
            continue
        d = _part(rs, t, n_boot, seed, every=False) | {"unparsed_value": t.unparsed_value}
        if t.variants:
            mc = [bool(t.parser_options(k).get("letters")) for k in range(len(t.phrasings))]
            d["phrasings"] = [
                {"variant": k, "prompt": p, "multiple_choice": mc[k]}
                | _part([r for r in every if r.get("variant", 0) == k], t, n_boot, seed)
                for k, p in enumerate(t.phrasings)
            ]
        subjects = sorted({r["class"] for r in rs if "class" in r})
        if subjects:  # tiles: each metric per class too (the board's rows)
            d["by_class"] = {
                c: _part([r for r in rs if r.get("class") == c], t, n_boot, seed) for c in subjects
            }
        m0 = t.metrics[0][0]
        refd = [r for r in rs if m0 in r["refs"]]
        if t.answer == "class":
            matrix = confusion([r["refs"][m0] for r in refd], [r["parsed"] for r in refd], t.labels)
            d["confusion"] = {"labels": list(t.labels), "matrix": matrix}
        if t.answer == "number":
            d["pairs"] = [[r["refs"][m0], r["parsed"] if r["ok"] else None] for r in refd]
        out[name] = d
    return out
