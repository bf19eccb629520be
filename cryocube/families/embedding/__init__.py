"""The embedding family: one vector per sample, scored by cheap probes (NeuCo-Bench / Embed2Scale,
PANGAEA); its two kinds of run (work.py) go through the scheduler, `finish` computes Q."""

from __future__ import annotations

from ...embeddings.embed import embeddings_url, plan_embedding
from ...errors import UserError
from .. import register
from ..base import FittedInScore, PlanContext, PlannedRun, Resolved, RunSpec
from .probe import (
    K_DEFAULT,
    check_tasks,
    differences,
    merge,
    probe_recipe,
    tasks_digest,
    tasks_from_cube,
)
from .work import CubeProbe, finish_fields


@register
class Embedding(FittedInScore):
    name = "embedding"
    warm_modules = ("timm", "cryocube.embeddings.embed", f"{__name__}.probes")
    primary_metric = "Q"
    shown_metrics = ("A",)
    not_tunable = (
        "a probe has no validation split: NeuCo-Bench scores each of its k splits on that split's"
        " test rows (the best epoch, the best SVM setting), so a study would select its fields on"
        " the test score; set them with `--set` on `evaluate` or `probe` instead"
    )
    identity_version = 3  # 3: standardisation in NeuCo-Bench's float32; 2: R² 0.0 on constant folds
    threads_in_identity = False  # the embedding's key holds them

    def with_overrides(self, spec: RunSpec, recipe):
        """The recipe as given: a run's overrides are probe fields (k, epochs), `resolve` reads."""
        return recipe

    def resolve(self, spec: RunSpec, cube, recipe, ctx: PlanContext) -> Resolved:
        """Refuses what the protocol cannot score (--fraction, tiny tasks) before any embedding."""
        if spec.fraction not in (None, 1, 1.0):
            raise UserError(
                f"{spec.label}: the {spec.protocol} protocol probes every label (k random 90/10"
                f" splits); --fraction {spec.fraction:g} does not apply to it (drop --fraction or"
                " run it separately)"
            )
        ov = dict(spec.overrides)
        dim = ov.pop("dim", None)
        pr = probe_recipe(str(ov.pop("probe", "linear")), int(ov.pop("k", K_DEFAULT)), ov, dim=dim)
        tasks = tasks_from_cube(cube.url)
        # evaluate keeps NeuCo-Bench's splits (a board's runs share them): the fix is `probe`'s
        url = cube.url.replace("{", "{{").replace("}", "}}")
        check_tasks(
            tasks,
            pr,
            f"`cryocube embed {spec.model} --cube {url} --out EMB.zarr` then `cryocube probe"
            f" EMB.zarr --tasks-from {url} --out PROBE --set test_size={{}}`: evaluate keeps"
            f" test_size {pr.test_size:g}",
        )
        emb, prov = plan_embedding(spec.model, cube, recipe, ctx, dim=dim, seed=spec.seed)
        store = embeddings_url(ctx.out, emb.key)
        labels = tasks_digest(tasks)
        return Resolved(
            identity={"embedding": emb.key, "tasks": labels, "probe": pr.as_dict()},
            model_name=prov.get("model_name", f"{spec.model} baseline"),
            weights=prov["weights"],
            precision=prov.get("precision", {"requested": "fp32", "effective": "fp32"}),
            fields={
                "embedding": emb.describe() | {"url": store},
                "probe": pr.record(),
                "band_mode": prov.get("band_mode"),
                "neuco_bench_differences": differences(pr, tasks),
                **({"deviations": prov["deviations"]} if "deviations" in prov else {}),
                "tasks": [t.name for t in tasks],
                "label_set": labels,
                "torch_threads": emb.threads,  # None: a baseline computes without torch
            },
            work=CubeProbe(emb, pr, tasks, store),
            cube=cube,
            prep_key=emb.key,
            estimate={"steps": pr.k * len(tasks), "encoder_items": cube.n_samples},
        )

    def prepare(self, runner, runs: list[PlannedRun]) -> dict[str, dict]:
        """Embeds each store once, however many runs (probe recipes) share its prep_key."""
        out: dict = {}
        for p in runs:
            if p.prep_key is None or p.prep_key not in out:
                out[p.prep_key] = p.work.prepare(runner, p)
        out.pop(None, None)
        return out

    def group(self, runs: list[PlannedRun], workers: int) -> list[list[PlannedRun]]:
        """Every run in one group: probes share no fit, their work is the score tasks."""
        return [runs] if runs else []

    def score(self, run: PlannedRun, fitted: dict):
        """One task per (task, split) probe, or per task for the svm; no task at all is refused."""
        tasks = run.work.folds()
        if not tasks:
            raise UserError(f"{run.label}: no probe tasks")
        return tasks

    reduce = staticmethod(merge)  # fold scores concatenated per task; `finish` orders them

    def report_key(self, record) -> tuple:
        """The probe and the label set: runs on other labels are never ranked together."""
        return (
            str((record.get("probe") or {}).get("probe", "")),
            str(record.get("label_set") or ""),
        )

    def report_sections(self, page, results) -> None:
        """NeuCo-Bench leaderboards, probe Q against mIoU (report.py), not default board cells."""
        from .report import sections

        sections(page, results)

    def finish(self, run: PlannedRun, fitted: dict, total, prepared: dict) -> dict:
        """Q and A from the merged fold scores; NeuCo-Bench's result files into the run's folder."""
        return finish_fields(run, total, prepared)
