"""The vqa family: generative vision-language models answer the InSAR-VLM-Bench questions about
interferogram cubes, and image-level yes/no and "what fraction" questions about Cryo-Bench tile
cubes (`cryocube evaluate --protocol vqa --models transformers:<checkpoint>`); the cube's kind picks
the task file.

`plan` reads the questions from the cube (questions.py) and checks the model through its adapter
(cryocube.adapters: weights there, an image processor) before any work; `score` is one Dask task per
block of samples that generates, keeps, parses and scores the block's answers (answer.py); the
reduce concatenates rows, and `finish` computes each task's metrics with bootstrap CIs and writes
the answers and a small gallery beside the record. Tasks, prompts and metrics are catalog data
(tasks.py).
"""

from __future__ import annotations

from ...errors import RecipeError, UserError
from ...record import run_dir
from .. import register
from ..base import FittedInScore, PlanContext, PlannedRun, RunSpec, content_hash
from .recipe import VqaRecipe

IDENTITY_VERSION = 1
GALLERY_SAMPLES = 6
N_BOOT = 1000


@register
class Vqa(FittedInScore):
    name = "vqa"
    warm_modules = (f"{__name__}.answer",)
    # share of answers the parsers could read (each task's own metrics are in metrics.tasks)
    primary_metric = "parsed"
    recipe = VqaRecipe
    not_tunable = (
        "a VQA run trains nothing and records no validation curve; set its fields with `evaluate"
        " --set`"
    )

    def plan(self, spec: RunSpec, cube, recipe: VqaRecipe, ctx: PlanContext) -> PlannedRun:
        """Refuses encoders (they answer through heads or probe); the run id hashes the model,
        precision, cube (a sample cube's board split too), each task's prompt digest, gen_batch,
        seed, blind and any fixed threads."""
        from ...adapters import get, names, split_ref
        from ...catalog import protocol as protocol_spec
        from ...precision import resolve, this_device
        from ...questions.ask import questions
        from ...questions.cells import chance_cells
        from ...questions.tasks import select
        from ..split import cube_split
        from .answer import Block, block_url

        protocol_spec(spec.protocol)
        vr = (
            recipe.updated(dict(spec.overrides), f"{spec.label}: overrides")
            if spec.overrides
            else recipe
        )
        if vr.follow_reference:
            raise RecipeError(
                f"{spec.label}: follow_reference=true switches an encoder's declared deviations to"
                " the reference's (docs/deviations.md); a generative model declares none, so the"
                " vqa protocol has nothing to follow: drop the setting for it"
            )
        adapter_name, location = split_ref(spec.model)
        if adapter_name not in names():
            raise UserError(
                f"{spec.model!r} is not a generative model: the vqa protocol takes"
                f" <adapter>[:<checkpoint>] (adapters: {', '.join(names())}); encoders answer these"
                " tasks through --protocol probe"
            )
        tasks = select(vr.task_names or None, cube.kind, cube.dataset)
        qs, left_out = questions(cube.url, tasks)
        asked = {q.task for q in qs}
        tasks = [t for t in tasks if t.name in asked]
        if vr.max_new_tokens:
            import dataclasses

            tasks = [
                dataclasses.replace(t, max_new_tokens=min(t.max_new_tokens, vr.max_new_tokens))
                for t in tasks
            ]
        prec = resolve(vr.precision, ctx.device or this_device())
        # fixed for every block: CPU reductions (and so answers) follow it
        threads = ctx.run_threads(vr.threads)
        arith = ctx.arithmetic_threads(threads)
        ref, prov = get(adapter_name).check(location, ctx.allow_random_weights, prec, spec.seed)
        split, ids, split_record = cube_split(cube.url, cube.checksum)
        identity = {
            "family": self.name,
            "model": {
                "adapter": ref.adapter,
                "location": ref.location,
                "random": ref.random,
                "sha256": ref.sha256,
            },
            "precision": prec,
            "cube": cube.checksum,
            "tasks": {t.name: t.digest() for t in tasks},
            "gen_batch": vr.gen_batch,
            "seed": spec.seed,
            **({"threads": arith} if arith else {}),
            **({"blind": True} if vr.blind else {}),
            # a sample cube's drawn split decides the board's cells: another rule, another run
            **({"split": split_record["digest"]} if cube.kind != "tiles" else {}),
            "v": IDENTITY_VERSION,
        }
        run_id = content_hash(identity)
        rdir = run_dir(ctx.out, run_id)
        bs = vr.block_samples
        samples = sorted({q.sample for q in qs})
        blocks = []
        bands = tuple(b.name for b in cube.bands)
        from ...cube import open_cube
        from ...questions.render import band_facts

        ds = open_cube(cube.url)
        facts = band_facts(ds) if cube.kind == "tiles" else ()
        rendered = bool(ds.attrs.get("rendered", False))
        size = (int(ds.sizes["x"]), int(ds.sizes["y"]))
        for k in range(0, len(samples), bs):
            chunk = set(samples[k : k + bs])
            blocks.append(
                Block(
                    index=len(blocks),
                    cube=cube.url,
                    bands=bands,
                    rendered=rendered,
                    questions=tuple(q for q in qs if q.sample in chunk),
                    tasks=tuple(tasks),
                    model=ref,
                    gen_batch=vr.gen_batch,
                    threads=threads,
                    url=block_url(rdir, len(blocks)),
                    size=size,
                    facts=facts,
                    blind=vr.blind,
                )
            )
        generation = {
            "do_sample": False,
            "num_beams": 1,
            "batch": vr.gen_batch,
            "max_new_tokens": {t.name: t.max_new_tokens for t in tasks},
        }
        every = questions(cube.url, tasks, every_split=True)[0] if cube.kind == "tiles" else qs
        chance = chance_cells(every, {t.name: t for t in tasks}, split, ids, N_BOOT, spec.seed)
        record = self.base_record(
            spec,
            run_id,
            identity,
            cube,
            model_name=prov.model_name,
            weights=prov.weights,
            precision={"requested": vr.precision, "effective": prec},
            model_class=prov.model_class,
            tasks={
                t.name: {
                    "prompt_sha256": t.digest(),
                    "answer": t.answer,
                    "metrics": [m for m, _, _ in t.metrics],
                    "questions": sum(q.task == t.name for q in qs),
                    "source": t.source,
                    "unparsed_value": t.unparsed_value,
                    "phrasings": len(t.phrasings),
                }
                for t in tasks
            },
            tasks_left_out=left_out,
            **_asked(qs, cube.kind),
            generation=generation,
            adapter=ref.adapter,
            params=prov.facts,
            torch_threads=threads,
            blind=vr.blind,
            board_split=split_record,
        )
        work = {
            "blocks": blocks,
            "tasks": {t.name: t for t in tasks},
            "dir": rdir,
            "questions": len(qs),
            "split": split,
            "ids": ids,
            "chance": chance,
        }
        return PlannedRun(
            spec=spec,
            family=self.name,
            run_id=run_id,
            identity=identity,
            dataset=cube.dataset,
            model_name=prov.model_name,
            fraction=1.0,
            record=record,
            work=work,
            cube=cube,
            estimate={"steps": len(blocks), "encoder_items": 0, "questions": len(qs)},
        )

    def score(self, run: PlannedRun, fitted: dict):
        """One answer_block task per block of samples: generate (or read kept answers), parse,
        score."""
        from .answer import answer_block

        return [(answer_block, b) for b in run.work["blocks"]]

    @staticmethod
    def reduce(a, b):
        """Concatenates two blocks' rows and adds up their counters (answer.merge)."""
        from .answer import merge

        return merge(a, b)

    def report_sections(self, page, results) -> None:
        """The question-task boards, tables, fringe plot, gallery and LEADERBOARD.md (report.py);
        the heads family's cells appear on these boards."""
        from .report import sections

        sections(page, results)

    def finish(self, run: PlannedRun, fitted: dict, total, prepared: dict) -> dict:
        """Writes answers.jsonl and the gallery beside the record; `parsed`, the share of answers
        read, is the primary metric."""
        import json

        from ... import store as _store
        from ...questions.cells import cells
        from .answer import summarize_rows

        rows = sorted(total["rows"], key=lambda r: (r["sample"], r["task"], r.get("variant", 0)))
        tasks = summarize_rows(rows, run.work["tasks"], N_BOOT, seed=run.spec.seed)
        rdir = run.work["dir"]
        _store.write_atomic(f"{rdir}/answers.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
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


def _asked(qs: list, kind: str) -> dict:
    """Tiles: which split and classes were asked (the test split; every class but the task file's
    skip_classes)."""
    if kind != "tiles":
        return {}
    return {
        "split": "test",
        "classes": sorted({q.subject for q in qs}),
        "samples_asked": len({q.sample for q in qs}),
    }


def summary_line(tasks: dict) -> str:
    """One line per run for the console: each task's metrics with their 95 % intervals and its
    unparsed answers."""
    from ...questions.metrics import FACTS

    parts = []
    for name, d in tasks.items():
        ms = ", ".join(
            f"{FACTS[m][0]} {v['value']:.2f} [{v['ci_low']:.2f}, {v['ci_high']:.2f}]"
            for m, v in d["metrics"].items()
        )
        parts.append(f"{name}: {ms} (n {d['n']}, unparsed {d['unparsed']})")
    return "; ".join(parts)


def write_gallery(run: PlannedRun, rows: list[dict]) -> list[dict]:
    """The first samples' pictures (as the model saw them) beside their questions, references and
    answers."""
    from ... import store as _store
    from ...cube import read_samples
    from ...questions.render import png_bytes, render
    from .answer import crop

    tasks = run.work["tasks"]
    samples = sorted({r["sample"] for r in rows})[:GALLERY_SAMPLES]
    if not samples:
        return []
    b0 = run.work["blocks"][0]
    images, _ = read_samples(run.cube.url, samples, labels=False)
    if images.ndim == 5:
        images = images[:, 0]
    out = []
    first = next(iter(tasks.values()))
    for k, s in enumerate(samples):
        rel = f"gallery/sample-{s:05d}.png"
        size = next(q.size for b in run.work["blocks"] for q in b.questions if q.sample == s)
        _store.write_atomic(
            f"{run.work['dir']}/{rel}",
            png_bytes(
                render(
                    crop(images[k], size), list(b0.bands), first.render, b0.rendered, facts=b0.facts
                )
            ),
        )
        out.append(
            {
                "sample": s,
                "source": next(r["source"] for r in rows if r["sample"] == s),
                "picture": rel,
                "qa": [
                    {
                        "task": r["task"],
                        "question": r["prompt"],
                        "reference": r["refs"],
                        "answer": r["answer"],
                        "ok": r["ok"],
                    }
                    | ({"class": r["class"]} if "class" in r else {})
                    | ({"variant": r["variant"]} if "variant" in r else {})
                    for r in rows
                    if r["sample"] == s
                ],
            }
        )
    return out
