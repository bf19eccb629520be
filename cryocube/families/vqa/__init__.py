"""The vqa family: generative vision-language models answer question tasks about interferogram and
tile cubes (`--protocol vqa --models transformers:<checkpoint>`; docs/vlm.md), a Dask task per
block of samples (answer.py); `finish` writes the metrics, the answers and a small gallery.
"""

from __future__ import annotations

import json
from dataclasses import replace

from ... import store
from ...adapters import get as adapter
from ...adapters import names as adapter_names
from ...adapters import split_ref
from ...cube import open_cube
from ...errors import RecipeError, UserError
from ...precision import resolve, this_device
from ...questions.ask import questions
from ...questions.cells import cells, chance_cells
from ...questions.metrics import FACTS
from ...questions.render import band_facts, png_bytes
from ...questions.tasks import select
from ...record import run_dir
from .. import register
from ..base import FittedInScore, PlanContext, PlannedRun, Resolved, RunSpec
from ..split import cube_split
from .answer import Block, answer_block, block_url, draw, merge, summarize_rows
from .recipe import VqaRecipe

GALLERY_SAMPLES = 6
# a gallery answer's keys, from an answer row's
GALLERY_KEYS = dict(task="task", question="prompt", reference="refs", answer="answer", ok="ok")
N_BOOT = 1000


@register
class Vqa(FittedInScore):
    name = "vqa"
    warm_modules = (f"{__name__}.answer",)
    # share of answers the parsers could read (each task's own metrics are in metrics.tasks)
    primary_metric = "parsed"
    recipe = VqaRecipe
    identity_version = 1
    not_tunable = (
        "a VQA run trains nothing and records no validation curve; set its fields with `evaluate"
        " --set`"
    )

    def with_overrides(self, spec: RunSpec, recipe: VqaRecipe) -> VqaRecipe:
        """Refuses follow_reference first: a generative model declares no deviation to follow."""
        vr = super().with_overrides(spec, recipe)
        if vr.follow_reference:
            raise RecipeError(
                f"{spec.label}: follow_reference=true switches an encoder's declared deviations to"
                " the reference's (docs/deviations.md); a generative model declares none, so the"
                " vqa protocol has nothing to follow: drop the setting for it"
            )
        return vr

    def resolve(self, spec: RunSpec, cube, recipe: VqaRecipe, ctx: PlanContext) -> Resolved:
        """Refuses encoders (they answer through heads); the run id hashes the identity below."""
        ref, prov, prec = _model(spec, recipe, ctx)
        tasks, qs, left_out = _tasks(cube, recipe)
        split, ids, split_record = cube_split(cube.url, cube.checksum)
        every = questions(cube.url, tasks, every_split=True)[0] if cube.kind == "tiles" else qs
        by_name = {t.name: t for t in tasks}
        blocks = -(-len({q.sample for q in qs}) // recipe.block_samples)
        return Resolved(
            identity={
                "model": {k: getattr(ref, k) for k in ("adapter", "location", "random", "sha256")},
                "precision": prec,
                "cube": cube.checksum,
                "tasks": {t.name: t.digest() for t in tasks},
                "gen_batch": recipe.gen_batch,
                **({"blind": True} if recipe.blind else {}),
                # a sample cube's drawn split decides the board's cells: another rule, another run
                **({"split": split_record["digest"]} if cube.kind != "tiles" else {}),
            },
            model_name=prov.model_name,
            weights=prov.weights,
            precision={"requested": recipe.precision, "effective": prec},
            fields={
                "model_class": prov.model_class,
                "tasks": {t.name: _task_record(t, qs) for t in tasks},
                "tasks_left_out": left_out,
                **_asked(qs, cube.kind),
                "generation": {
                    "do_sample": False,
                    "num_beams": 1,
                    "batch": recipe.gen_batch,
                    "max_new_tokens": {t.name: t.max_new_tokens for t in tasks},
                },
                "adapter": ref.adapter,
                "params": prov.facts,
                "blind": recipe.blind,
                "board_split": split_record,
            },
            work=lambda run_id: {
                "blocks": _blocks(cube, qs, tasks, ref, recipe, run_dir(ctx.out, run_id)),
                "tasks": by_name,
                "dir": run_dir(ctx.out, run_id),
                "questions": len(qs),
                "split": split,
                "ids": ids,
                "chance": chance_cells(every, by_name, split, ids, N_BOOT, spec.seed),
            },
            cube=cube,
            estimate={"steps": blocks, "encoder_items": 0, "questions": len(qs)},
        )

    def score(self, run: PlannedRun, fitted: dict):
        """One answer_block task per block of samples: generate (or read kept), parse, score."""
        return [(answer_block, b) for b in run.work["blocks"]]

    reduce = staticmethod(merge)  # two blocks' rows concatenated, their counters added up

    def report_sections(self, page, results) -> None:
        """The boards, tables, fringe plot, gallery and LEADERBOARD.md, heads' cells included."""
        from .report import sections

        sections(page, results)

    def finish(self, run: PlannedRun, fitted: dict, total, prepared: dict) -> dict:
        """Writes answers.jsonl and the gallery; `parsed`, the share of answers read, is primary."""
        rows = sorted(total["rows"], key=lambda r: (r["sample"], r["task"], r.get("variant", 0)))
        tasks = summarize_rows(rows, run.work["tasks"], N_BOOT, seed=run.spec.seed)
        rdir = run.work["dir"]
        store.write_atomic(f"{rdir}/answers.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        gallery = write_gallery(run, rows)
        n = len(rows)
        parsed = 100.0 * sum(r["ok"] for r in rows) / n if n else float("nan")
        gen_s = total["gen_s"]
        w = run.work
        board = cells(rows, w["tasks"], w["split"], w["ids"], N_BOOT, run.spec.seed)
        return {
            "metrics": {
                "parsed": parsed,
                "tasks": tasks,
                "cells": board,
                "baselines": {"chance": w["chance"]},
            },
            "summary_line": summary_line(tasks),
            "primary_metric": self.primary_metric,
            "unparsed": {k: v["unparsed"] for k, v in tasks.items()},
            "answers_file": f"{rdir}/answers.jsonl",
            "gallery": gallery,
            "generation_stats": {
                "blocks": total["blocks"],
                "blocks_generated": total["generated"],
                "questions": n,
                "questions_generated": total["questions_generated"],
                "new_tokens": total["tokens"],
                "questions_per_s": total["questions_generated"] / gen_s if gen_s else None,
                "tokens_per_s": total["tokens"] / gen_s if gen_s else None,
                "devices": sorted(set(total.get("devices", []))),
            },
            "timings": {"generate_s": gen_s, "train_s": 0.0},
        }


def _model(spec: RunSpec, recipe: VqaRecipe, ctx: PlanContext):
    """(model reference, provenance, precision) from the adapter; refuses an encoder's name."""
    adapter_name, location = split_ref(spec.model)
    if adapter_name not in adapter_names():
        raise UserError(
            f"{spec.model!r} is not a generative model: the vqa protocol takes"
            f" <adapter>[:<checkpoint>] (adapters: {', '.join(adapter_names())}); encoders"
            " answer these tasks through --protocol probe"
        )
    prec = resolve(recipe.precision, ctx.device or this_device())
    ref, prov = adapter(adapter_name).check(location, ctx.allow_random_weights, prec, spec.seed)
    return ref, prov, prec


def _tasks(cube, recipe: VqaRecipe):
    """(tasks asked, their questions, tasks left out), answer lengths capped by max_new_tokens."""
    tasks = select(recipe.task_names or None, cube.kind, cube.dataset)
    qs, left_out = questions(cube.url, tasks)
    tasks = [t for t in tasks if t.name in {q.task for q in qs}]
    if cap := recipe.max_new_tokens:
        tasks = [replace(t, max_new_tokens=min(t.max_new_tokens, cap)) for t in tasks]
    return tasks, qs, left_out


def _task_record(t, qs: list) -> dict:
    return {
        "prompt_sha256": t.digest(),
        "answer": t.answer,
        "metrics": [m for m, _, _ in t.metrics],
        "questions": sum(q.task == t.name for q in qs),
        "source": t.source,
        "unparsed_value": t.unparsed_value,
        "phrasings": len(t.phrasings),
    }


def _blocks(cube, qs: list, tasks: list, ref, recipe: VqaRecipe, rdir: str) -> list[Block]:
    """One answer task per `block_samples` samples: its questions and how its pictures are drawn."""
    ds = open_cube(cube.url)
    facts = band_facts(ds) if cube.kind == "tiles" else ()
    samples = sorted({q.sample for q in qs})
    chunks = [
        set(samples[k : k + recipe.block_samples])
        for k in range(0, len(samples), recipe.block_samples)
    ]
    return [
        Block(
            cube=cube.url,
            bands=tuple(b.name for b in cube.bands),
            rendered=bool(ds.attrs.get("rendered", False)),
            questions=tuple(q for q in qs if q.sample in chunk),
            tasks=tuple(tasks),
            model=ref,
            gen_batch=recipe.gen_batch,
            threads=recipe.threads,
            url=block_url(rdir, i),
            size=(int(ds.sizes["x"]), int(ds.sizes["y"])),
            facts=facts,
            blind=recipe.blind,
        )
        for i, chunk in enumerate(chunks)
    ]


def _asked(qs: list, kind: str) -> dict:
    """Tiles: the split and classes asked (test; every class but the task file's skip_classes)."""
    if kind != "tiles":
        return {}
    return {
        "split": "test",
        "classes": sorted({q.subject for q in qs}),
        "samples_asked": len({q.sample for q in qs}),
    }


def summary_line(tasks: dict) -> str:
    """A console line per run: each task's metrics with 95 % intervals, and its unparsed answers."""
    parts = []
    for name, d in tasks.items():
        ms = ", ".join(
            f"{FACTS[m][0]} {v['value']:.2f} [{v['ci_low']:.2f}, {v['ci_high']:.2f}]"
            for m, v in d["metrics"].items()
        )
        parts.append(f"{name}: {ms} (n {d['n']}, unparsed {d['unparsed']})")
    return "; ".join(parts)


def write_gallery(run: PlannedRun, rows: list[dict]) -> list[dict]:
    """The first samples' pictures (as the model saw them) with their questions and answers."""
    samples = sorted({r["sample"] for r in rows})[:GALLERY_SAMPLES]
    if not samples:
        return []
    sizes = {q.sample: q.size for b in run.work["blocks"] for q in b.questions}
    spec = next(iter(run.work["tasks"].values())).render
    pics = draw(run.work["blocks"][0], samples, sizes, [spec], blind=False)[spec]
    out = []
    for s in samples:
        rel = f"gallery/sample-{s:05d}.png"
        store.write_atomic(f"{run.work['dir']}/{rel}", png_bytes(pics[s]))
        out.append(
            {
                "sample": s,
                "source": next(r["source"] for r in rows if r["sample"] == s),
                "picture": rel,
                "qa": [
                    {k: r[row_key] for k, row_key in GALLERY_KEYS.items()}
                    | {k: r[k] for k in ("class", "variant") if k in r}
                    for r in rows
                    if r["sample"] == s
                ],
            }
        )
    return out
