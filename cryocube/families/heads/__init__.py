"""The heads family: encoders answer the question tasks whose answer is a class, a number, a
fraction or a box, on the VLMs' test questions with their metrics and intervals (docs/vlm.md)."""

from __future__ import annotations

from ...embeddings.embed import BASELINES, embeddings_url, plan_embedding, prepare_store
from ...errors import UserError
from ...questions.ask import questions
from ...questions.cells import answerable, cells, chance_cells
from ...questions.tasks import select
from .. import register
from ..base import FittedInScore, PlanContext, PlannedRun, Resolved, RunSpec
from ..recipes import QuestionRecipe
from ..split import cube_split
from .linear import ALPHA_GRID, C_GRID, HeadsJob, answer_heads

N_BOOT = 1000


@register
class Heads(FittedInScore):
    name = "heads"
    warm_modules = ("timm", "cryocube.embeddings.embed", f"{__name__}.linear")
    primary_metric = "answered"  # share of test questions answered (tasks: board cells)
    recipe = QuestionRecipe
    identity_version = 2  # 2: one question per sample and task (phrasings left to VLMs)
    threads_in_identity = False  # the embedding's key holds them

    def resolve(self, spec: RunSpec, cube, recipe: QuestionRecipe, ctx: PlanContext) -> Resolved:
        """Refuses baselines and cubes with no answerable task; runs share pooled features."""
        if spec.model in BASELINES:
            raise UserError(
                f"{spec.label}: the heads protocol answers with an encoder's features; the chance"
                " baseline is on every board already"
            )
        every, tasks, qs, left_out, split, ids, split_record = _asked(spec, cube, recipe)
        emb, prov = plan_embedding(spec.model, cube, recipe, ctx, seed=spec.seed)
        url = embeddings_url(ctx.out, emb.key)
        by_name = {t.name: t for t in tasks}
        job = HeadsJob(url, tuple(qs), tuple(tasks), tuple(split.tolist()), tuple(ids))
        return Resolved(
            identity={
                "embedding": emb.key,
                "tasks": {t.name: t.digest() for t in tasks},
                "split": split_record["digest"],
                "grid": {"C": C_GRID, "alpha": ALPHA_GRID},
            },
            model_name=prov.get("model_name", spec.model),
            weights=prov["weights"],
            precision=prov.get("precision"),
            fields={
                "embedding": emb.describe() | {"url": url},
                "band_mode": prov.get("band_mode"),
                "deviations": prov["deviations"],
                "tasks": {
                    t.name: {
                        "answer": t.answer,
                        "metrics": [m for m, _, _ in t.metrics],
                        "source": t.source,
                        "prompt_sha256": t.digest(),
                    }
                    for t in tasks
                },
                "tasks_left_out": left_out,
                "board_split": split_record,
                "tasks_text": [t.name for t in every if not answerable(t)],  # no head writes text
                "head": {
                    "kind": "linear on pooled frozen features",
                    "C_grid": list(C_GRID),
                    "alpha_grid": list(ALPHA_GRID),
                    "chosen_on": "val split, by the task's own metric",
                },
            },
            work={
                "embed": emb,
                "url": url,
                "job": job,
                "tasks": by_name,
                "split": split,
                "ids": ids,
                "chance": chance_cells(qs, by_name, split, ids, N_BOOT, spec.seed),
            },
            cube=cube,
            prep_key=emb.key,
            estimate={"steps": 1, "encoder_items": cube.n_samples},
        )

    def prepare(self, runner, runs: list[PlannedRun]) -> dict[str, dict]:
        """The embedding family's pooled features, embedded once per (model, cube) by its step."""
        out: dict[str, dict] = {}
        for p in runs:
            if p.prep_key not in out:
                out[p.prep_key] = prepare_store(
                    p.work["embed"], p.cube, p.work["url"], runner, p.record.weights
                )
        return out

    def group(self, runs: list[PlannedRun], workers: int) -> list[list[PlannedRun]]:
        """Every run in one group: heads are fitted in each run's score task; fit shares nothing."""
        return [runs] if runs else []

    def score(self, run: PlannedRun, fitted: dict):
        """One task per run (answer_heads): fit on train, regularised on val, test answered."""
        return [(answer_heads, run.work["job"])]

    @staticmethod
    def reduce(a, b):
        """Merges score results: answer rows concatenated, the chosen heads by task merged."""
        return {"rows": a["rows"] + b["rows"], "heads": {**a["heads"], **b["heads"]}}

    def report_sections(self, page, results) -> None:
        """None of its own: its cells are rows of the vqa family's boards, beside VLMs, chance."""

    def finish(self, run: PlannedRun, fitted: dict, total, prepared: dict) -> dict:
        """Board cells of the answers, scored as VLM answers are, beside the chance baseline."""
        w = run.work
        rows = total["rows"]
        board = cells(rows, w["tasks"], w["split"], w["ids"], N_BOOT, run.spec.seed, how=_how)
        answered = 100.0 * sum(r["ok"] for r in rows) / len(rows) if rows else float("nan")
        prep = prepared.get(run.prep_key, {})
        return {
            "metrics": {"answered": answered, "cells": board, "baselines": {"chance": w["chance"]}},
            "primary_metric": self.primary_metric,
            "heads": total["heads"],
            "summary_line": "; ".join(
                f"{c['task']} {c['metric']} {c['value']:.2f} (n {c['n']})"
                for c in board
                if c["class"] is None
            ),
            "embedding": run.record.fields["embedding"] | {"sha256": prep.get("embedding_sha256")},
            "timings": {"embed_s": prep.get("embed_s", 0.0), "train_s": 0.0},
        }


def _how(t, metric: str) -> str:
    return (
        "box head (linear on pooled features)" if t.answer == "box" else f"linear head ({t.answer})"
    )


def _asked(spec: RunSpec, cube, recipe: QuestionRecipe):
    """(tasks selected, answered, questions, left out, split, ids, split record), checked."""
    every = select(recipe.task_names or None, cube.kind, cube.dataset)
    tasks = [t for t in every if answerable(t)]
    if not tasks:
        raise UserError(
            f"{spec.label}: none of the tasks {', '.join(t.name for t in every)} has an answer"
            " an encoder head gives (class, number, fraction, box); text tasks read 'cannot"
            " answer (encoder)'"
        )
    qs, left_out = questions(cube.url, tasks, every_split=True)
    # one question per sample and task: phrasings are a VLM's matter
    qs = [q for q in qs if q.variant == 0]
    tasks = [t for t in tasks if t.name in {q.task for q in qs}]
    split, ids, split_record = cube_split(cube.url, cube.checksum)
    if not any(split[q.sample] == "test" for q in qs):
        raise UserError(
            f"{cube.url}: no test-split sample has a reference for"
            f" {', '.join(t.name for t in tasks)}"
        )
    return every, tasks, qs, left_out, split, ids, split_record
