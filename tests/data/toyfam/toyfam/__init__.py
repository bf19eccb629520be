"""A toy evaluation family from another package: planned, run and reported by cryocube through its
entry points only (`cryocube.families` for this module, `cryocube.catalogs` for its protocol). Its
score is the mean image value of the cube's test split, map-reduced over blocks of four samples; it
contributes a board cell (laid out by the report's default board) and a section of its own."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from cryocube.families import Family, Resolved, register

BLOCK = 4


@dataclass(frozen=True)
class Block:
    cube: str
    samples: tuple[int, ...]


def _fit_nothing(group: list) -> list[dict]:
    return [{} for _ in group]


def _score(block: Block) -> dict:
    """One block of test samples: the sum and count of its finite image values (runs on a
    worker)."""
    from cryocube.cube import open_cube

    x = np.asarray(
        open_cube(block.cube)["image"].isel(sample=list(block.samples)).values, dtype=np.float64
    )
    return {"sum": float(np.nansum(x)), "n": int(np.isfinite(x).sum()), "blocks": 1}


@register
class Toy(Family):
    name = "toyfam"
    primary_metric = "brightness"
    not_tunable = "the toy family trains nothing"

    def resolve(self, spec, cube, recipe, ctx) -> Resolved:
        test = tuple(int(i) for i in cube.samples("test"))
        blocks = [Block(cube.url, test[k : k + BLOCK]) for k in range(0, len(test), BLOCK)]
        return Resolved(
            identity={"model": spec.model, "cube": cube.checksum},
            model_name=f"toy {spec.model}",
            weights={"source": "none", "random_init": False, "pretrained": False},
            precision={"requested": "fp64", "effective": "fp64"},
            fields={"test_samples": len(test)},
            work=blocks,
            cube=cube,
            estimate={"steps": len(blocks), "encoder_items": 0},
        )

    def fit(self, group):
        return _fit_nothing, group

    def score(self, run, fitted):
        return [(_score, b) for b in run.work]

    @staticmethod
    def reduce(a, b):
        return {k: a[k] + b[k] for k in a}

    def finish(self, run, fitted, total, prepared) -> dict:
        mean = total["sum"] / total["n"]
        samples = hashlib.sha256(
            ",".join(str(i) for b in run.work for i in b.samples).encode()
        ).hexdigest()[:16]
        cell = {
            "task": "brightness",
            "metric": "mean",
            "class": None,
            "unit": "DN",
            "split": "test",
            "samples": samples,
            "n": total["n"],
            "value": mean,
            "ci_low": None,
            "ci_high": None,
        }
        return {
            "metrics": {
                "brightness": mean,
                "values": total["n"],
                "blocks": total["blocks"],
                "cells": [cell],
            },
            "primary_metric": self.primary_metric,
        }

    def report_sections(self, page, results) -> None:
        from cryocube.report.tables import Column, Table

        super().report_sections(page, results)  # the board of its cells
        runs = sorted(results.of(self.name), key=lambda r: (r.dataset, r.model_name))
        if not runs:
            return
        sec = page.section("Toy family: test-split brightness")
        t = Table(
            "toy_brightness",
            "Mean image value over the test split",
            [
                Column("model", "Model", numeric=False),
                Column("dataset", "Dataset", numeric=False),
                Column("brightness", "Brightness"),
                Column("values", "Values"),
            ],
        )
        for r in runs:
            t.add(
                [r.model_name, r.dataset, r.metrics["brightness"], r.metrics["values"]],
                [
                    r.model_name,
                    r.dataset,
                    f"{r.metrics['brightness']:.4f}",
                    str(r.metrics["values"]),
                ],
            )
        page.table(sec, "toyfam", t)
