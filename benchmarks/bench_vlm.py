"""Generation throughput of the vqa family's adapter: batched greedy generation (left padding) against
batch 1, on the tiny random LLaVA (or a checkpoint folder: --model transformers:/path). Prints samples/s
and new tokens/s for each batch size, and checks that batching leaves the answers unchanged.

    python benchmarks/bench_vlm.py [--short] [--model transformers:/ckpt/SmolVLM-256M-Instruct] [--precision bf16]
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def run(adapter, pics, prompts, batch: int, max_new_tokens: int) -> tuple[list[str], float, int]:
    t0 = time.perf_counter()
    texts, tokens = [], 0
    for k in range(0, len(pics), batch):
        outs = adapter.generate(pics[k: k + batch], prompts[k: k + batch], max_new_tokens)
        texts += [o.text for o in outs]
        tokens += sum(o.new_tokens for o in outs)
    return texts, time.perf_counter() - t0, tokens


def main(argv=None) -> None:
    import torch

    from cryocube.adapters import get, split_ref
    from cryocube.cluster.runtime import device_for_worker
    from cryocube.families.vqa.render import render
    from cryocube.families.vqa.tasks import all_tasks, fill

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
        prompts.append(fill(task, {"primary_date": "2020-01-01", "secondary_date": f"2020-01-{13 + i % 12:02d}",
                                   "radar_wavelength_m": 0.05547}))
    print(f"bench_vlm: {prov.model_name} ({prov.model_class}), {dev}, {a.precision}, {n} samples, "
          f"max_new_tokens {a.max_new_tokens}, torch threads {torch.get_num_threads()}")
    run(adapter, pics[:2], prompts[:2], 2, 2)  # warm-up
    base = None
    for b in [int(x) for x in a.batches.split(",")]:
        texts, s, tok = run(adapter, pics, prompts, b, a.max_new_tokens)
        same = "" if base is None else ("  answers = batch 1" if texts == base[0] else "  ANSWERS DIFFER from batch 1")
        speed = "" if base is None else f"  ({base[1] / s:.2f}x batch 1)"
        print(f"  batch {b:>3}: {n / s:7.2f} samples/s  {tok / s:8.1f} new tokens/s{speed}{same}")
        if base is None:
            base = (texts, s)


if __name__ == "__main__":
    main()
