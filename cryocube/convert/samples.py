"""Sample cubes (`kind: samples`): whole images with image-level targets, planned on the client
(`cube.SamplePlan`), read and written block by block on the workers (resumable as tile cubes)."""

from __future__ import annotations

import time
from abc import abstractmethod
from typing import Any

import numpy as np

from .. import store as _store
from ..cluster.runtime import task_boundary, tune_malloc
from ..cube import digest_vars, partial_stats
from ..cube.write import ConvertResult, SamplePlan, WriteOptions, put_block, sample_template
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

    def read_kwargs(self, plan: SamplePlan) -> dict:
        """What `read_sample` needs besides the item (the cube's image shape, a value offset)."""
        return {}

    def precheck(self, raw: str, on_error: str = "raise", **options) -> Any:
        """Runs the whole `plan` on the client, so bad input is refused before a cluster starts."""
        return self.plan(raw, on_error, **options)

    def convert(self, raw: str, out: str, client, opts: WriteOptions, prechecked) -> ConvertResult:
        """The prechecked plan's images, block by block on the workers."""
        items, plan = prechecked
        t0, block = time.perf_counter(), opts.block
        read_kwargs = self.read_kwargs(plan)
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
        # each time step of a multi-temporal sample is checked as one image, named by its step
        names = [f" ({t})" for t in task["time"] or range(len(img))] if img.ndim == 4 else [""]
        steps = img if img.ndim == 4 else img[None]
        checked = [check_image(x, reader.spec, f"sample {sid}{n}")[0] for x, n in zip(steps, names)]
        imgs.append(np.stack(checked).reshape(shape).astype(np.float32, copy=False))
    images, g = np.stack(imgs), _store.open_group(task["out"], "r+")
    parts = [np.asarray(g[v][s0 : s0 + len(imgs)]) for v in ("target", *digest_vars(g))]
    # every pixel of every time step counts (sample cubes have no split)
    flat = images.reshape(-1, *images.shape[-3:])
    n, h, w = flat.shape[0], *flat.shape[-2:]
    stats = partial_stats(flat, np.zeros((n, h, w), np.int8), np.ones(n, bool))
    put_block(g, task["block"], s0, {"image": images}, (images, *parts), stats)
    return {"samples": len(imgs), "read_bytes": int(images.nbytes)}
