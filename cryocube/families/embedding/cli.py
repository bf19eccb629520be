"""`cryocube embed` and `cryocube probe`."""
from __future__ import annotations

import math
import sys

from ...errors import UserError


def register(sub) -> None:
    from ...cluster import add_cluster_args
    from ...store import options_arg

    p = sub.add_parser("embed", help="one vector per cube sample from an encoder (or the random/mean baseline) -> Zarr/CSV")
    p.add_argument("model", help="model id (see `cryocube list models`), or a baseline: random, mean")
    p.add_argument("--cube", required=True, help="cube path/URL (tile or sample cube)")
    p.add_argument("--out", required=True, help="embedding store (.zarr) or, with --format csv, the submission CSV")
    p.add_argument("--dim", type=int, default=None, help="vector width: PCA fitted on the train split (all samples if "
                   "none), zero-padded when fewer directions exist; 1024 for Embed2Scale submissions")
    p.add_argument("--format", choices=("zarr", "csv"), default="zarr",
                   help="csv: also write a submission CSV (id,0..dim-1) beside/at --out")
    p.add_argument("--weights", default=None, metavar="DIR", help="folder of checkpoints")
    p.add_argument("--allow-random-weights", action="store_true", help="embed with a random-init encoder (recorded as such)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="precision, input_size, normalization, encoder_weights, block_samples, extract_batch, threads")
    p.add_argument("--seed", type=int, default=0, help="the random baseline's seed")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--storage-options", type=options_arg, default=None)
    p.add_argument("--quiet", action="store_true")
    add_cluster_args(p)
    p.set_defaults(func=_embed)

    q = sub.add_parser("probe", help="score embeddings with NeuCo-Bench probes (k splits x tasks as Dask tasks)")
    q.add_argument("embeddings", help="a submission CSV or an embedding store from `cryocube embed`")
    src = q.add_mutually_exclusive_group(required=True)
    src.add_argument("--labels", help="NeuCo-Bench labels folder (<task>__<cls|regr>.csv with id,label)")
    src.add_argument("--tasks-from", metavar="CUBE", help="derive image-level tasks from a cube (class presence/fraction)")
    q.add_argument("--out", required=True, help="results folder: results_summary.json, <task>/<task>_result.json, results.jsonl")
    q.add_argument("--probe", choices=("linear", "knn", "svm"), default="linear")
    q.add_argument("--k", type=int, default=10, help="random 90/10 splits per task (the challenge: 10)")
    q.add_argument("--dim", type=int, default=None, help="expected width (submissions: 1024; checked and zero-padded)")
    q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="probe fields: epochs, lr, batch_size, weight_decay, knn_k, temperature, C, seed, split_seed")
    q.add_argument("--quiet", action="store_true")
    add_cluster_args(q)
    q.set_defaults(func=_probe)


def _embed(args) -> int:
    from ... import store
    from ...cluster import open_cluster
    from ...cube import cube_info
    from .. import get
    from ..base import check_fields_used
    from ..segmentation.recipe import load_recipe, set_fields
    from .embed import embed, load_embeddings, plan_embedding
    from .submission import write_submission

    store.register_options(args.out, args.storage_options)
    store.register_options(args.cube, args.storage_options)
    r = load_recipe(None, args.set)
    check_fields_used(set_fields(None, args.set), [get("embedding")], "embed --set")
    cube = cube_info(args.cube)
    spec, prov = plan_embedding(args.model, cube, dim=args.dim, weights_dir=args.weights,
                                allow_random_weights=args.allow_random_weights, precision=r.precision,
                                input_size=r.input_size or None, normalization=r.normalization, seed=args.seed,
                                block_samples=r.block_samples, batch=r.extract_batch, threads=r.threads,
                                weights=r.encoder_weights.get(args.model))
    if prov["weights"].get("random_init") and prov["weights"].get("pretrained"):
        print(f"cryocube: WARNING: {args.model} embeds with RANDOM weights (--allow-random-weights); the store says so",
              file=sys.stderr)
    url = args.out[:-4] + ".zarr" if args.format == "csv" and args.out.endswith(".csv") else args.out
    with open_cluster(args.cluster, n_workers=args.workers, threads_per_worker=args.threads_per_worker,
                      memory_limit=args.memory_limit, quiet=args.quiet) as client:
        res = embed(spec, cube, url, client=client, progress=not args.quiet, provenance=prov, overwrite=args.overwrite)
    print(f"{url}: {res.n_samples} samples x {res.dim} dims ({args.model}"
          f"{', PCA ' + format(res.attrs['pca']['explained_variance'], '.1%') + ' of the variance' if res.attrs.get('pca') else ''}; "
          f"{res.blocks_run} blocks computed in {res.seconds:.1f} s)")
    if args.format == "csv":
        csv = args.out if args.out.endswith(".csv") else args.out.rstrip("/") + ".csv"
        ids, X, _, _ = load_embeddings(url)
        write_submission(csv, ids, X)
        print(f"{csv}: submission CSV (id + {X.shape[1]} value columns)")
    return 0


def _probe(args) -> int:
    from ...cluster import open_cluster
    from .probe import probe_embeddings, probe_inputs, probe_recipe
    from ..segmentation.recipe import parse_overrides

    recipe = probe_recipe(args.probe, args.k, parse_overrides(args.set), dim=args.dim)
    inputs = probe_inputs(args.embeddings, recipe, args.labels, args.tasks_from)  # user errors before the cluster
    with open_cluster(args.cluster, n_workers=args.workers, threads_per_worker=args.threads_per_worker,
                      memory_limit=args.memory_limit, quiet=args.quiet) as client:
        res = probe_embeddings(args.embeddings, args.out, recipe, labels=args.labels, tasks_from=args.tasks_from,
                               client=client, progress=not args.quiet, inputs=inputs)
    s = res.summary
    for t in sorted(s["task_q_scores"]):
        q, a = s["task_q_scores"][t], s["task_acc_scores"][t]
        print(f"{t:<36} Q {q:8.3f}  A {a:7.4f}" + ("  (NaN rule: too many NaN probes)" if t in s["tasks_failing_nan_rule"] else ""))
    print(f"overall Q {s['overall_q_score']:.3f}  (A {s['overall_acc_score']:.4f}); {res.out}/results_summary.json")
    if math.isnan(s["overall_q_score"]):
        raise UserError("overall Q is NaN (a task broke the NaN rule or had no score); see the per-task lines above")
    return 0
