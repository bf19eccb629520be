"""`cryocube tune` benchmark (issue 13), figures printed.

The cost of a study of N trials of decoder-side parameters (lr, weight_decay) on one cached feature
extraction, against one `evaluate` run and against N separate `evaluate` runs (each in its own
results folder, so each extracts its features, as N independent jobs would). The default recipe is
one of the trials (its run is the baseline's), and the best retrain is a cache hit.

    python benchmarks/bench_tune.py --short   # quickstart sample size (64 px, 48 tiles, batch 8)
    python benchmarks/bench_tune.py --short --batch 4   # fixed costs weigh more
    python benchmarks/bench_tune.py --trials 8 --tiles 96 --size 128

The study's bound is E + S + ceil(D/W) * F + D*T against E + S + F + T for one run (E extraction,
S the fit task's set-up, F one decoder's training, T its test, W workers, D the decoders the study
trains: N, or N + 1 when the default lies outside the space); the script prints it beside the
measured cost, and for F/E ratios typical of the reference recipe.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> None:
    from bench_engine import cluster, make_cube

    from cryocube.engine.evaluate import evaluate
    from cryocube.engine.tune import parse_space, tune
    from cryocube.families import RunSpec
    from cryocube.families.recipes import load_recipe

    ap = argparse.ArgumentParser()
    ap.add_argument("--short", action="store_true")
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--tiles", type=int, default=48)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch", type=int, default=8, help="the decoder's batch size")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--model", default="ssl4eo_moco")
    a = ap.parse_args(argv)
    n = a.trials
    root = Path(tempfile.mkdtemp(prefix="bench-tune-"))
    cl, client = cluster(a.workers)
    try:
        cube = make_cube(root, a.tiles, a.size, client=client)
        recipe = load_recipe(
            None,
            [
                f"epochs={a.epochs}",
                "decoder_channels=64",
                f"input_size={a.size}",
                "val_every=2",
                f"batch_size={a.batch}",
                "crops_per_sample=2",
                "normalization=cube",
            ],
        )
        space = parse_space(["lr=1e-4:1e-2:log", "weight_decay=0.01:0.1"], None, recipe)
        base = RunSpec(a.model, cube, "frozen")
        lrs = [10 ** (-4 + 2 * i / max(1, n - 1)) for i in range(n)]

        one, parts = [], []
        for i, lr in enumerate(lrs):  # N separate runs, each in its own folder (its own extraction)
            t = time.perf_counter()
            rec = evaluate(
                [RunSpec(a.model, cube, "frozen", overrides=(("lr", lr),))],
                str(root / f"sep{i}"),
                recipe,
                client=client,
                progress=False,
                allow_random_weights=True,
            ).records[0]
            one.append(time.perf_counter() - t)
            parts.append(rec["timings"])
        t = time.perf_counter()
        (res,) = tune(
            [base],
            space,
            str(root / "study"),
            recipe,
            trials=n,
            pruner="none",
            batch=n,
            client=client,
            progress=False,
            allow_random_weights=True,
        )
        study = time.perf_counter() - t
        run1 = sorted(one)[len(one) // 2]  # median single run
        E = sorted(p["features_wall_s"] for p in parts)[len(parts) // 2]
        # fit-task set-up (encoder, features in memory): shared
        S = sorted(p["setup_s"] for p in parts)[len(parts) // 2]
        F = sorted(p["train_s"] for p in parts)[len(parts) // 2] - S
        T = sorted(p["test_s"] for p in parts)[len(parts) // 2]
        print(
            f"sample: {a.tiles} train tiles of {a.size} px, {a.model} frozen (random weights),"
            f" {a.epochs} epochs, batch {a.batch}, {a.workers} workers"
        )
        print(
            f"one evaluate run (median of {n}): {run1:.1f} s  (extraction {E:.1f} s, fit set-up"
            f" {S:.1f} s, decoder training {F:.1f} s, test {T:.1f} s)"
        )
        print(f"{n} separate evaluate runs: {sum(one):.1f} s  ({sum(one) / run1:.2f}x one run)")
        dflt = getattr(res, "baseline_trial", None)
        d = n if dflt is not None else n + 1  # decoders the study trains
        groups = math.ceil(d / a.workers)
        est = (E + S + groups * F + d * T) / (E + S + F + T)
        print(
            f"study of {n} trials (default recipe: "
            + (f"trial {dflt}" if dflt is not None else "a separate run")
            + f"; best retrain a cache hit): {study:.1f} s = {study / run1:.2f}x one run, bound"
            f" {est:.2f}x from its parts (E + S + ceil({d}/{a.workers}) F + {d} T over"
            f" E + S + F + T); {sum(one) / study:.2f}x faster than {n} separate runs"
        )
        print(
            f"  best trial {res.best['sweep']['trial']} {res.best['sweep']['params']}: test mIoU "
            f"{res.best['metrics']['mIoU']:.2f} (default {res.baseline['metrics']['mIoU']:.2f})"
        )
        for ratio in (0.5, 1.0, 2.0):
            e, f = 1.0, ratio
            print(
                f"  reference recipe with decoder training = {ratio:g} x extraction: study ~ "
                f"{(e + groups * f) / (e + f):.2f}x one run, {n} separate runs {n:.0f}x"
            )
    finally:
        client.close()
        cl.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
