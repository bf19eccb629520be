"""cryocube's NeuCo-Bench probes side by side with NeuCo-Bench's own evaluator (issue 28), figures
printed.

Both score the same submission CSV and the same labels folder, whose rows are shuffled (so id order
and file order give other folds): NeuCo-Bench's `benchmark/main.py`, extracted from its fetched
repository at NEUCO_COMMIT, runs in its own process on its sample configs
(`configs/sample_config_linear.yaml`, `configs/sample_config_svm.yaml`: k_folds 40, the SVM's
BayesSearchCV with n_iter 50); cryocube runs `cryocube probe --set fold_order=file --standardize
labelled` (NeuCo-Bench's folds and its code's standardisation) on a Dask LocalCluster. Per task: Q
of each, their relative difference, and the largest per-split difference (NeuCo-Bench's
`output_fold_results`).

The SVM's random numbers are aligned (the same scikit-optimize search, random_state 42, on the same
splits), so its Q agree within float arithmetic; NeuCo-Bench's linear probe draws its initial
weights and batches from torch's global generator in sequence, cryocube from a generator per split,
so the linear Q agree within seed noise. `--fold-order id` shows cryocube's default folds against
NeuCo-Bench's.

    # both probes, the sample configs (~30 min on 2 cores)
    python benchmarks/bench_neuco.py --seeds 4
    python benchmarks/bench_neuco.py --probes svm,linear --k 5 --n-iter 6 --rows 60 --dim 6 \
        --save tests/data/neuco_small
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

NEUCO_COMMIT = "a89ba06"  # embed2scale/NeuCo-Bench "Extend with SVM probes"
MIRROR = os.environ.get("NEUCO_REF_MIRROR", "/work/.mirror/embed2scale+NeuCo-Bench/repo")


def extract_reference(dest: Path, commit: str = NEUCO_COMMIT) -> Path:
    """NeuCo-Bench's `benchmark/` and `configs/` at `commit`, extracted once (its code is run, never
    imported)."""
    root = dest / f"NeuCo-Bench-{commit}"
    if not (root / "benchmark" / "main.py").exists():
        tar = subprocess.run(
            ["git", "-C", MIRROR, "archive", commit, "benchmark", "configs"],
            check=True,
            capture_output=True,
        ).stdout
        root.mkdir(parents=True, exist_ok=True)
        tarfile.open(fileobj=io.BytesIO(tar)).extractall(root)
    return root


def make_case(folder: Path, rows: int, dim: int, seed: int = 0) -> tuple[Path, Path]:
    """A submission CSV (id + value columns) and a labels folder of two cls and two regr tasks with
    planted signal, each file's rows shuffled and a few labels left empty (skipped by both)."""
    rng = np.random.default_rng(seed)
    ids = [f"s{i:05d}" for i in range(rows)]
    X = rng.normal(size=(rows, dim)).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    emb = folder / "embeddings.csv"
    with emb.open("w") as f:
        f.write("id," + ",".join(str(j) for j in range(dim)) + "\n")
        for i, r in zip(ids, X):
            f.write(i + "," + ",".join(f"{v:.6g}" for v in r) + "\n")
    noise = lambda s: rng.normal(scale=s, size=rows)  # noqa: E731
    tasks = {
        "biomass__regr": 3.0 * X[:, 0] + X[:, 1] ** 2 + noise(0.8),
        "soil_moisture__regr": np.tanh(X[:, 2]) + noise(0.6),
        "cloud__cls": (X[:, 3] + X[:, 0] * X[:, 1] + noise(0.5) > 0).astype(int),
        "forest__cls": (X[:, 1] - X[:, 2] + noise(1.0) > 0.3).astype(int),
    }
    labels = folder / "labels"
    labels.mkdir(exist_ok=True)
    for name, y in tasks.items():
        empty = set(rng.choice(rows, size=max(1, rows // 30), replace=False).tolist())
        with (labels / f"{name}.csv").open("w") as f:
            f.write("id,label\n")
            for i in rng.permutation(rows):
                value = (
                    "" if i in empty else (f"{y[i]:.6g}" if name.endswith("regr") else int(y[i]))
                )
                f.write(f"{ids[i]},{value}\n")
    return emb, labels


def neuco_config(ref: Path, probe: str, k: int | None, n_iter: int | None) -> dict:
    cfg = yaml.safe_load((ref / "configs" / f"sample_config_{probe}.yaml").read_text())
    cfg["output_fold_results"] = True  # the per-split scores, to compare split by split
    cfg["enable_plots"] = False
    if k:
        cfg["k_folds"] = k
    if n_iter and probe == "svm":
        cfg["probe_params"]["opt_params"]["n_iter"] = n_iter
    if probe == "svm":
        cfg["probe_params"]["opt_params"]["verbose"] = 0
    return cfg


def run_neuco(
    ref: Path, emb: Path, labels: Path, cfg: dict, work: Path
) -> tuple[dict, dict, float]:
    """NeuCo-Bench's evaluator in its own process -> ({task: Q}, {task: per-split scores},
    seconds)."""
    work.mkdir(parents=True, exist_ok=True)
    cfg_file = work / "config.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg))
    out = work / "out"
    # nothing of cryocube on its path
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    t0 = time.perf_counter()
    subprocess.run(
        [
            os.environ.get("NEUCO_PYTHON", sys.executable),
            "main.py",
            "--submission_file",
            str(emb),
            "--annotation_path",
            str(labels),
            "--config",
            str(cfg_file),
            "--output_dir",
            str(out),
            "--method_name",
            "bench",
        ],
        cwd=ref / "benchmark",
        env=env,
        check=True,
        capture_output=True,
    )
    seconds = time.perf_counter() - t0
    summary = json.loads(next(out.rglob("results_summary.json")).read_text())
    folds = {
        t: json.loads(next(out.rglob(f"{t}/{t}_result.json")).read_text())["q_t"]
        for t in summary["task_q_scores"]
    }
    return summary["task_q_scores"], folds, seconds


def run_cryocube(
    emb: Path,
    labels: Path,
    probe: str,
    k: int,
    n_iter: int | None,
    fold_order: str,
    work: Path,
    workers: int,
    seed: int = 42,
) -> tuple[dict, dict, float]:
    """`cryocube probe` on a LocalCluster -> ({task: Q}, {task: per-split scores}, seconds)."""
    out = work / f"cryocube-{probe}-{fold_order}-{seed}"
    cmd = [
        sys.executable,
        "-m",
        "cryocube.cli",
        "probe",
        str(emb),
        "--labels",
        str(labels),
        "--out",
        str(out),
        "--probe",
        probe,
        "--k",
        str(k),
        "--standardize",
        "labelled",
        "--set",
        f"fold_order={fold_order}",
        "--set",
        f"seed={seed}",
        "--workers",
        str(workers),
        "--quiet",
    ]
    if n_iter and probe == "svm":
        cmd += ["--set", f"n_iter={n_iter}"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    seconds = time.perf_counter() - t0
    summary = json.loads(next(out.rglob("results_summary.json")).read_text())
    folds = {
        t: json.loads(next(out.rglob(f"{t}/{t}_result.json")).read_text())["q_t"]
        for t in summary["task_q_scores"]
    }
    return (
        {
            t.removesuffix("__cls").removesuffix("__regr"): q
            for t, q in summary["task_q_scores"].items()
        },
        {t.removesuffix("__cls").removesuffix("__regr"): v for t, v in folds.items()},
        seconds,
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--probes", default="linear,svm")
    ap.add_argument("--rows", type=int, default=300)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument(
        "--k", type=int, default=None, help="splits per task (default: the sample config's 40)"
    )
    ap.add_argument(
        "--n-iter",
        type=int,
        default=None,
        help="SVM search iterations (default: the sample config's 50)",
    )
    ap.add_argument("--fold-order", default="file", choices=("file", "id"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work", default=None)
    ap.add_argument(
        "--seeds",
        type=int,
        default=0,
        help=(
            "linear probe: cryocube at this many other probe seeds too, "
            "for the seed noise NeuCo-Bench's Q is judged against (its generator is not cryocube's)"
        ),
    )
    ap.add_argument(
        "--save",
        default=None,
        help="store the case and both sides' figures here (a CI test's pins)",
    )
    a = ap.parse_args(argv)
    work = Path(a.work or tempfile.mkdtemp(prefix="bench-neuco-")).resolve()
    ref = extract_reference(work)
    emb, labels = make_case((Path(a.save) if a.save else work / "case").resolve(), a.rows, a.dim)
    saved: dict = {
        "neuco_bench": {"repository": "embed2scale/NeuCo-Bench", "commit": NEUCO_COMMIT},
        "case": {"rows": a.rows, "dim": a.dim, "fold_order": a.fold_order},
        "probes": {},
    }
    print(
        f"NeuCo-Bench {NEUCO_COMMIT} vs cryocube, {a.rows} rows x {a.dim} dims, shuffled label"
        f" files, cryocube fold_order={a.fold_order}"
    )
    print(
        f"{'probe':<7}{'task':<16}{'Q NeuCo-Bench':>15}{'Q cryocube':>14}{'rel diff':>11}"
        f"{'max split diff':>16}"
    )
    for probe in a.probes.split(","):
        cfg = neuco_config(ref, probe, a.k, a.n_iter)
        k = cfg["k_folds"]
        n_iter = cfg["probe_params"].get("opt_params", {}).get("n_iter") if probe == "svm" else None
        qn, fn, tn = run_neuco(ref, emb, labels, cfg, work / f"neuco-{probe}")
        qc, fc, tc = run_cryocube(emb, labels, probe, k, n_iter, a.fold_order, work, a.workers)
        others = [
            run_cryocube(emb, labels, probe, k, n_iter, a.fold_order, work, a.workers, 43 + i)[0]
            for i in range(a.seeds if probe == "linear" else 0)
        ]
        spread = {}
        for t in sorted(qn):
            rel = abs(qc[t] - qn[t]) / max(abs(qn[t]), 1e-12)
            split = max(abs(x - y) for x, y in zip(fn[t], fc[t])) if fc.get(t) else math.nan
            line = f"{probe:<7}{t:<16}{qn[t]:>15.6f}{qc[t]:>14.6f}{rel:>11.1e}{split:>16.1e}"
            if others:
                qs = np.array([qc[t]] + [o[t] for o in others])
                spread[t] = {
                    "cryocube_q_over_seeds": qs.tolist(),
                    "mean": float(qs.mean()),
                    "std": float(qs.std(ddof=1)),
                }
                line += (
                    f"   cryocube over {len(qs)} seeds {qs.mean():.3f} +- {qs.std(ddof=1):.3f}"
                    f" [{qs.min():.3f}, {qs.max():.3f}], NeuCo-Bench at"
                    f" {(qn[t] - qs.mean()) / qs.std(ddof=1):+.1f} sd"
                )
            print(line)
        print(
            f"{probe:<7}{'(seconds)':<16}{tn:>15.1f}{tc:>14.1f}   k={k}"
            + (f", n_iter={n_iter}" if n_iter else "")
        )
        saved["probes"][probe] = {
            "k": k,
            "n_iter": n_iter,
            "neuco_task_q": qn,
            "neuco_split_scores": fn,
            "cryocube_task_q": qc,
            "seconds": {"neuco": tn, "cryocube": tc},
            **({"seed_spread": spread} if spread else {}),
        }
    if a.save:
        (Path(a.save) / "figures.json").write_text(
            json.dumps(saved, indent=1, sort_keys=True) + "\n"
        )
        print(f"stored {a.save}/figures.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
