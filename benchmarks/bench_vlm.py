"""Generation throughput of the vqa family's adapter: batched greedy generation (left padding)
against batch 1, on the tiny random LLaVA (or a checkpoint folder: --model transformers:/path).
Prints samples/s and new tokens/s for each batch size, and checks that batching leaves the answers
unchanged. Then the same vqa run (`evaluate --protocol vqa` on synthetic interferograms) on a
LocalCluster of 1 and then 2 worker processes, 1 thread each: samples/s of the whole run and the
ratio, and whether the answers agree.

    python benchmarks/bench_vlm.py [--short] [--precision bf16] \
        [--model transformers:/ckpt/SmolVLM-256M-Instruct]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def run(adapter, pics, prompts, batch: int, max_new_tokens: int) -> tuple[list[str], float, int]:
    t0 = time.perf_counter()
    texts, tokens = [], 0
    for k in range(0, len(pics), batch):
        outs = adapter.generate(pics[k : k + batch], prompts[k : k + batch], max_new_tokens)
        texts += [o.text for o in outs]
        tokens += sum(o.new_tokens for o in outs)
    return texts, time.perf_counter() - t0, tokens


def _load(name: str, ref) -> None:
    """Build the adapter on a worker: its model stays resident there, as after a run's first
    block."""
    from cryocube.adapters import get
    from cryocube.cluster.runtime import device_for_worker

    get(name)(ref, device_for_worker())


def workers(model: str, pairs: int, max_new_tokens: int, precision: str) -> None:
    """The same vqa run on 1 then 2 worker processes (torch threads pinned to 1, so both are one run
    id): wall-clock samples/s of `evaluate` with the model already resident on every worker (its
    load, once per worker, and other first-use costs are left out by a warm-up run), and the
    ratio."""
    import tempfile

    from cryocube.adapters import get, split_ref
    from cryocube.cluster import open_cluster
    from cryocube.convert.writer import convert
    from cryocube.engine.evaluate import evaluate
    from cryocube.families import RunSpec
    from cryocube.families.recipes import load_recipe
    from cryocube.insar_synthetic import make_interferograms

    recipe = load_recipe(
        None,
        [
            "threads=1",
            "block_samples=4",
            "gen_batch=4",
            f"max_new_tokens={max_new_tokens}",
            f"precision={precision}",
        ],
    )
    with tempfile.TemporaryDirectory() as d:
        make_interferograms(f"{d}/raw", n=pairs, size=32, seed=0)
        cube, seen = f"{d}/insar.zarr", {}
        for k in (1, 2):
            with open_cluster(
                "local", n_workers=k, threads_per_worker=1, dashboard=False, quiet=True
            ) as client:
                if k == 1:
                    convert("insar", f"{d}/raw", cube, client=client, progress=False)
                name, loc = split_ref(model)
                client.run(_load, name, get(name).check(loc, True, precision, 0)[0])
                # a first pass into another folder warms what else each worker loads once (zarr,
                # rendering)
                evaluate(
                    [RunSpec(model, cube, "vqa")],
                    f"{d}/warm{k}",
                    recipe,
                    client=client,
                    progress=False,
                    allow_random_weights=True,
                )
                t0 = time.perf_counter()
                (rec,) = evaluate(
                    [RunSpec(model, cube, "vqa")],
                    f"{d}/out{k}",
                    recipe,
                    client=client,
                    progress=False,
                    allow_random_weights=True,
                ).records
                s = time.perf_counter() - t0
            if rec["status"] != "ok":
                raise SystemExit(f"bench_vlm: the vqa run failed on {k} worker(s): {rec['error']}")
            with open(rec["answers_file"]) as f:
                seen[k] = (f.read(), s, rec["run_id"])
            n = rec["generation_stats"]["questions"]
            speed = "" if k == 1 else f"  ({seen[1][1] / s:.2f}x 1 worker)"
            same = (
                ""
                if k == 1
                else (
                    "  answers = 1 worker"
                    if seen[1][0] == seen[2][0]
                    else "  ANSWERS DIFFER from 1 worker"
                )
            )
            print(
                f"  {k} worker{'s' if k > 1 else ' '}: {n / s:7.2f} samples/s  ({n} questions in"
                f" {s:.2f} s, {rec['generation_stats']['blocks']} blocks,"
                f" {rec['timings']['generate_s']:.2f} s of it inside generate() summed over"
                f" workers){speed}{same}"
            )
        assert seen[1][2] == seen[2][2], "the two runs should be one run id (threads pinned)"


def main(argv=None) -> None:
    import torch

    from cryocube.adapters import get, split_ref
    from cryocube.cluster.runtime import device_for_worker
    from cryocube.questions.render import render
    from cryocube.questions.tasks import all_tasks, fill

    p = argparse.ArgumentParser()
    p.add_argument("--short", action="store_true")
    p.add_argument("--model", default="transformers")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--batches", default="1,4,16")
    a = p.parse_args(argv)
    n = 8 if a.short else a.samples
    torch.set_num_threads(max(1, torch.get_num_threads()))
    name, loc = split_ref(a.model)
    ref, prov = get(name).check(loc, True, a.precision, 0)
    dev = device_for_worker()
    adapter = get(name)(ref, dev)
    task = all_tasks()["coherence_classification"]
    rng = np.random.default_rng(0)
    pics, prompts = [], []
    for i in range(n):
        phase = rng.uniform(-np.pi, np.pi, (32, 32)).astype(np.float32)
        coh = rng.uniform(0, 1, (32, 32)).astype(np.float32)
        pics.append(render(np.stack([phase, coh]), ["wrapped_phase", "coherence"], task.render))
        prompts.append(
            fill(
                task,
                {
                    "primary_date": "2020-01-01",
                    "secondary_date": f"2020-01-{13 + i % 12:02d}",
                    "radar_wavelength_m": 0.05547,
                },
            )
        )
    print(
        f"bench_vlm: {prov.model_name} ({prov.model_class}), {dev}, {a.precision}, {n} samples, "
        f"max_new_tokens {a.max_new_tokens}, torch threads {torch.get_num_threads()}"
    )
    run(adapter, pics[:2], prompts[:2], 2, 2)  # warm-up
    base = None
    for b in [int(x) for x in a.batches.split(",")]:
        texts, s, tok = run(adapter, pics, prompts, b, a.max_new_tokens)
        same = (
            ""
            if base is None
            else ("  answers = batch 1" if texts == base[0] else "  ANSWERS DIFFER from batch 1")
        )
        speed = "" if base is None else f"  ({base[1] / s:.2f}x batch 1)"
        print(f"  batch {b:>3}: {n / s:7.2f} samples/s  {tok / s:8.1f} new tokens/s{speed}{same}")
        if base is None:
            base = (texts, s)
    pairs = 8 if a.short else a.samples // 2
    print(
        f"bench_vlm: the same vqa run ({pairs} synthetic interferograms x their tasks, blocks of 4"
        " pairs) on a LocalCluster of 1 and 2 worker processes, 1 thread each"
    )
    workers(a.model, pairs, a.max_new_tokens, a.precision)


if __name__ == "__main__":
    main()
