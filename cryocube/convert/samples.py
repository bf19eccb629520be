"""Sample cubes (`kind: samples`): one whole image per sample and image-level targets.

A `SampleReader` puts everything known before pixels are read in a `cube.SamplePlan`; this module
reads and checks the images block by block on the workers and writes them through `cube.write`, so
a killed conversion resumes block by block as tile cubes do.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from typing import Any

import numpy as np

from .. import store as _store
from ..cluster.runtime import tune_malloc
from ..cube import digest_vars, partial_stats
from ..cube.write import (
    ConvertResult,
    SamplePlan,
    WriteOptions,
    put_block,
    sample_template,
)
from ..errors import task_boundary
from .base import ConvertError, Reader
from .writer import check_image, cube_attrs, write_blocks


class SampleReader(Reader):
    """Layouts of whole samples with image-level targets; one sample cube."""

    @abstractmethod
    def plan(
        self, raw: str, on_error: str = "raise", keep_corrupted: bool = False, **options
    ) -> tuple[list, SamplePlan]:
        """(items, SamplePlan), on the client: bad input is refused here, before the cluster."""

    @abstractmethod
    def read_sample(self, item: Any, **read_kwargs) -> np.ndarray:
        """One sample's whole image, (C, H, W) or (T, C, H, W), on a worker."""

    def read_kwargs(self, plan: SamplePlan, **options) -> dict:
        """What `read_sample` needs besides the item (the cube's image shape, a value offset)."""
        return {}

    def precheck(
        self, raw: str, on_error: str = "raise", keep_corrupted: bool = False, **options
    ) -> Any:
        """Runs the whole `plan` on the client, so bad input is refused before a cluster starts."""
        return self.plan(raw, on_error, keep_corrupted, **options)

    def convert(
        self, raw: str, out: str, client, opts: WriteOptions, prechecked: Any = None, **options
    ) -> ConvertResult:
        """The CLI's prechecked plan (else a new one), then the images block by block on workers."""
        items, plan = prechecked or self.plan(raw, opts.on_error, **options)
        t0, block = time.perf_counter(), opts.block
        read_kwargs = self.read_kwargs(plan, **options)
        # bad raw samples left out (--on-error skip)
        skipped = len(plan.attrs.get("skipped_samples") or ())
        return write_blocks(
            out,
            lambda: sample_template(
                self.spec.bands, plan, block, cube_attrs(self.spec, self.layout.name, raw)
            ),
            plan.key(block),
            opts,
            client,
            write_sample_block,
            lambda b: {
                "reader": self,
                "items": items[b * block : (b + 1) * block],
                "ids": plan.ids[b * block : (b + 1) * block],
                "s0": b * block,
                "block": b,
                "out": out,
                "shape": plan.shape,
                "time": list(plan.time),
                "read_kwargs": read_kwargs,
            },
            plan.n,
            t0,
            skipped,
        )


@task_boundary
def write_sample_block(task: dict[str, Any]) -> dict[str, Any]:
    """Read, check and write one block of samples with digests; the progress flag last."""
    tune_malloc()
    reader: SampleReader = task["reader"]
    s0, shape = task["s0"], tuple(task["shape"])
    imgs = []
    for sid, it in zip(task["ids"], task["items"]):
        img = np.asarray(reader.read_sample(it, **task["read_kwargs"]))
        if img.shape != shape:
            raise ConvertError(f"sample {sid}: image {img.shape}, the cube's samples are {shape}")
        if img.ndim == 4:
            names = task["time"] or [str(t) for t in range(img.shape[0])]
            img = np.stack(
                [
                    check_image(img[t], reader.spec, f"sample {sid} ({names[t]})")[0]
                    for t in range(img.shape[0])
                ]
            )
        else:
            img = check_image(img, reader.spec, f"sample {sid}")[0]
        imgs.append(img.astype(np.float32, copy=False))
    images = np.stack(imgs)
    g = _store.open_group(task["out"], "r+")
    targets = np.asarray(g["target"][s0 : s0 + len(imgs)])
    extras = [np.asarray(g[v][s0 : s0 + len(imgs)]) for v in digest_vars(g)]
    c, h, w = images.shape[-3:]
    # every pixel of every time step counts (sample cubes have no split)
    flat = images.reshape(-1, c, h, w)
    stats = partial_stats(
        flat, np.zeros((flat.shape[0], h, w), np.int8), np.ones(flat.shape[0], bool)
    )
    put_block(g, task["block"], s0, {"image": images}, (images, targets, *extras), stats)
    return {"samples": len(imgs), "read_bytes": int(images.nbytes)}
