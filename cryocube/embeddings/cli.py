"""`cryocube embed` and `cryocube probe`."""

from __future__ import annotations

import math

from .. import harness
from ..errors import UserError


def register(sub) -> None:
    """Adds `embed` and `probe` to the parser (cli.COMMAND_MODULES); both take --cluster."""
    p = sub.add_parser(
        "embed",
        help="one vector per cube sample from an encoder (or the random/mean baseline) -> Zarr/CSV",
    )
    p.add_argument(
        "model", help="model id (see `cryocube list models`), or a baseline: random, mean"
    )
    p.add_argument("--cube", required=True, help="cube path/URL (tile or sample cube)")
    harness.add_out(p, "embedding store (.zarr) or, with --format csv, the submission CSV")
    p.add_argument(
        "--dim",
        type=int,
        help="vector width: PCA fitted on the train split (all samples if none), zero-padded when"
        " fewer directions exist; 1024 for Embed2Scale submissions",
    )
    p.add_argument(
        "--format",
        choices=("zarr", "csv"),
        default="zarr",
        help="csv: also write a submission CSV (id,0..dim-1) beside/at --out",
    )
    harness.add_weights(p, "embed with a random-init encoder (recorded as such)")
    harness.add_set(
        p,
        "precision, input_size, normalization, encoder_weights, block_samples, extract_batch,"
        " threads, follow_reference",
    )
    p.add_argument("--seed", type=int, default=0, help="the random baseline's seed")
    p.add_argument("--overwrite", action="store_true")
    harness.add_storage(p, None)
    harness.add_quiet(p, None)
    harness.add_cluster(p)
    p.set_defaults(func=_embed)

    q = sub.add_parser(
        "probe", help="score embeddings with NeuCo-Bench probes (k splits x tasks as Dask tasks)"
    )
    q.add_argument(
        "embeddings", help="a submission CSV or an embedding store from `cryocube embed`"
    )
    src = q.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--labels", help="NeuCo-Bench labels folder (<task>__<cls|regr>.csv with id,label)"
    )
    src.add_argument(
        "--tasks-from",
        metavar="CUBE",
        help="derive image-level tasks from a cube (class presence/fraction)",
    )
    harness.add_out(
        q, "results folder: results_summary.json, <task>/<task>_result.json, results.jsonl"
    )
    q.add_argument(
        "--probe",
        default="linear",
        metavar="{linear,svm,knn,linear-svm}",
        help="linear: NeuCo-Bench's probe; svm: NeuCo-Bench's polynomial SVC/SVR picked by a"
        " Bayesian search (needs cryocube[neuco]); knn: PANGAEA's weighted kNN; linear-svm:"
        " LinearSVC/SVR at C=1",
    )
    q.add_argument(
        "--k", type=int, default=40, help="random 90/10 splits per task (NeuCo-Bench's configs: 40)"
    )
    q.add_argument(
        "--standardize",
        choices=("all", "labelled"),
        default="all",
        help="rows the one global mean/std come from: all rows of the file (NeuCo-Bench's docs,"
        " default) or the labelled rows only (NeuCo-Bench's code)",
    )
    q.add_argument(
        "--dim", type=int, help="expected width (submissions: 1024; checked and zero-padded)"
    )
    harness.add_set(
        q,
        "probe fields: epochs, lr, batch_size, weight_decay, knn_k, temperature, C, seed,"
        " split_seed, fold_order=id|file (file: NeuCo-Bench's folds); svm: n_iter,"
        " n_initial_points, C_min, C_max, gamma_min, gamma_max, coef0_min, coef0_max,"
        " degrees=2,3, epsilons=0.01,0.1",
    )
    harness.add_quiet(q, None)
    harness.add_cluster(q)
    q.set_defaults(func=_probe)


def _embed(args) -> int:
    from .. import store
    from ..cluster.client import cluster_threads
    from ..cube import cube_info
    from ..families.base import PlanContext
    from ..families.recipes import load_recipe
    from .embed import embed, load_embeddings, plan_embedding, write_sidecar
    from .submission import write_submission

    store.register_options(args.cube, args.storage_options)
    url, csv = output_paths(args.out, args.format)
    claim_outputs(args, url, csv)
    r = load_recipe(None, args.set, families=("embedding",)).of("embedding")
    cube = cube_info(args.cube)

    def plan(threads):
        ctx = PlanContext("", args.weights, args.allow_random_weights, threads=threads)
        return plan_embedding(args.model, cube, r, ctx, dim=args.dim, seed=args.seed)

    spec, prov = plan(harness.threads_for(args))  # errors first
    if prov["weights"].get("random_init") and prov["weights"].get("pretrained"):
        harness.warn(
            f"{args.model} embeds with RANDOM weights (--allow-random-weights); the store says so"
        )
    with harness.cluster_for(args) as client:
        spec, prov = plan(cluster_threads(client))  # the threads the workers were started with
        res = embed(spec, cube, url, client, not args.quiet, prov, overwrite=args.overwrite)
    pca = res.attrs.get("pca")
    pca = f", PCA {pca['explained_variance']:.1%} of the variance" if pca else ""
    print(
        f"{url}: {res.n_samples} samples x {res.dim} dims ({args.model}{pca};"
        f" {res.blocks_run} blocks computed in {res.seconds:.1f} s)"
    )
    if csv is not None:
        ids, X, _, attrs = load_embeddings(url)
        write_submission(csv, ids, X)
        write_sidecar(csv, attrs)
        print(f"{csv}: submission CSV (id + {X.shape[1]} value columns)")
    return 0


def output_paths(out: str, fmt: str) -> tuple[str, str | None]:
    """(store, submission CSV): `x.zarr` -> `x.csv` beside it; `x.csv` -> the store `x.zarr`."""
    out = out.rstrip("/")
    if fmt != "csv":
        return out, None
    if out.endswith(".csv"):
        return out[:-4] + ".zarr", out
    return out, (out[:-5] if out.endswith(".zarr") else out) + ".csv"


def claim_outputs(args, url: str, csv: str | None) -> None:
    """Both outputs of `embed` pass the output contract before a cluster starts."""
    inputs = [("--cube", args.cube)]
    found = harness.claim(args, "embeddings", inputs, url=url)
    if csv is None:
        return
    sub = harness.claim(args, "submission", inputs, url=csv)
    if sub.state == "ours" and found.state != "ours" and not args.overwrite:
        raise UserError(
            f"{csv} holds a submission CSV whose embedding store {url} is not there (other"
            " embeddings); pass --overwrite to replace it"
        )


def _probe(args):
    """Plans the one run (every input read and checked before any cluster) for the engine."""
    from ..families.base import EngineRuns
    from ..families.embedding.probe import probe_recipe
    from ..families.embedding.work import probe_run
    from ..recipe import parse_overrides

    recipe = probe_recipe(
        args.probe, args.k, parse_overrides(args.set), dim=args.dim, standardize=args.standardize
    )
    run = probe_run(args.embeddings, args.out, recipe, args.labels, args.tasks_from)
    return EngineRuns([run], args.out, lambda records: _show_probe(records[0], recipe, args.out))


def _show_probe(rec: dict, recipe, out: str) -> int:
    """Per task Q and A, then the overall Q; a failed run or an undefined Q is one sentence."""
    from ..families.embedding.neuco import allowed_failures
    from ..families.embedding.work import probe_result

    if rec.get("status") != "ok":
        raise UserError(
            f"probing {rec['embedding']['input']} failed: {rec.get('error')} "
            f"(traceback in {rec.get('error_log')})"
        )
    s = probe_result(rec, recipe, out).summary
    allowed = allowed_failures(recipe.k, recipe.max_nan_fraction)
    for t in sorted(s["task_q_scores"]):
        q, a, failed = s["task_q_scores"][t], s["task_acc_scores"][t], s["task_failed_probes"][t]
        note = f"  ({failed} of {recipe.k} probes failed)" if failed else ""
        if t in s["tasks_failing_nan_rule"]:
            note = f"{note[:-1]} (no finite score), more than the {allowed} allowed)"
        print(f"{t:<36} Q {q:8.3f}  A {a:7.4f}{note}")
    print(
        f"overall Q {s['overall_q_score']:.3f}  (A {s['overall_acc_score']:.4f});"
        f" {rec['summary_file']}"
    )
    if math.isnan(s["overall_q_score"]):
        failing = ", ".join(s["tasks_failing_nan_rule"]) or "a task"
        raise UserError(
            f"overall Q is undefined: {failing} had more than {allowed} of {recipe.k} probes fail "
            "(the challenge's rule); see the per-task lines above"
        )
    return 0
