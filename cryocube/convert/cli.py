"""`cryocube convert` and `cryocube download`."""

from __future__ import annotations

from .. import store
from ..catalog import dataset_ids
from ..cube import COMPRESSORS
from ..harness import add_cluster, add_out, add_quiet, add_storage, cluster_for


def register(sub) -> None:
    """Adds `convert` and `download` to the `cryocube` command (cli.COMMAND_MODULES calls it)."""
    p = sub.add_parser("convert", help="convert a dataset's published raw layout into a Zarr cube")
    p.add_argument(
        "dataset", help=f"catalog id ({', '.join(dataset_ids())}) or a dataset YAML file"
    )
    p.add_argument("--raw", required=True, help="root of the raw download (path or fsspec URL)")
    add_out(p, "cube path or URL (e.g. s3://bucket/gsdd.zarr)")
    p.add_argument("--layout", default="auto", help="cryobench | original | auto (detect)")
    p.add_argument("--tile", type=int, help="tile size (default: the catalog's)")
    p.add_argument("--block", type=int, default=16, help="samples per write task")
    p.add_argument(
        "--shard", type=int, help="samples per Zarr shard (few large objects on object stores)"
    )
    p.add_argument(
        "--compressor",
        choices=list(COMPRESSORS),
        default="lz4",
        help=(
            "image/label codec: lz4 (fast), zstd (smaller, for paid object storage), none (local"
            " scratch)"
        ),
    )
    p.add_argument(
        "--on-error",
        choices=("raise", "skip"),
        default="raise",
        help="skip: record bad samples in the cube's attrs and go on",
    )
    p.add_argument(
        "--keep-corrupted",
        action="store_true",
        help=(
            "keep samples the annotations flag as corrupted or processing_error (Hephaestus); they"
            " are left out by default, and either way listed in the cube's attrs"
        ),
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace a cube made from other inputs/options"
    )
    add_storage(p, "JSON fsspec options for --out")
    p.add_argument(
        "--raw-storage-options", type=store.options_arg, help="JSON fsspec options for --raw"
    )
    p.add_argument(
        "--shift-s2",
        action="store_true",
        help=(
            "ssl4eo-downstream: add SSL4EO-S12 v1.1's +1000 DN offset to the S2 bands (and carry"
            " the v1.1 statistics)"
        ),
    )
    add_quiet(p, None)
    add_cluster(p)
    p.set_defaults(func=_convert)

    d = sub.add_parser(
        "download", help="download and extract a dataset's published archive (checksum verified)"
    )
    d.add_argument("dataset", help=f"catalog id ({', '.join(dataset_ids())})")
    d.add_argument("--dest", required=True)
    d.add_argument(
        "--source", default="cryobench", help="cryobench (Hugging Face archives) | original"
    )
    d.add_argument("--no-extract", action="store_true")
    d.set_defaults(func=_download)


def _convert(args) -> int:
    from .writer import prepare

    shift = {"shift_s2": True} if args.shift_s2 else {}
    # a bad id, layout, option or raw file is refused here, before a cluster starts
    conversion = prepare(
        args.dataset,
        args.raw,
        args.out,
        args.layout,
        tile_size=args.tile,
        block_samples=args.block,
        shard_samples=args.shard,
        on_error=args.on_error,
        compressor=args.compressor,
        overwrite=args.overwrite,
        raw_storage_options=args.raw_storage_options,
        storage_options=args.storage_options,
        progress=not args.quiet,
        keep_corrupted=args.keep_corrupted,
        **shift,
    )
    with cluster_for(args) as client:
        r = conversion.run(client)
    _show_converted(args, r)
    return 0


def _show_converted(args, r) -> None:
    wrote = f"wrote {r.blocks_written}/{r.blocks_total} blocks"
    what, mb = wrote if r.blocks_written else "already complete", r.read_bytes / 1e6
    print(
        f"{args.out}: {r.n_samples} samples, {what} in {r.seconds:.1f} s"
        f" ({mb / max(r.seconds, 1e-9):.1f} MB/s raw), checksum {r.marker['checksum'][:16]}"
        + (f", skipped {r.skipped} bad samples" if r.skipped else "")
    )
    attrs = store.open_group(args.out, "r").attrs
    # the skipped samples and why (the cube's `skipped_samples` attribute keeps them all)
    skipped = (attrs.get("skipped_samples") or []) if r.skipped else []
    for d in skipped[:10]:
        print(f"  skipped {d['source']}: {d['reason']}")
    if len(skipped) > 10:
        print(
            f"  ... and {len(skipped) - 10} more (the cube's attrs['skipped_samples'] lists them"
            " all)"
        )
    kept = attrs.get("kept_flagged_samples") or []
    if kept:
        flags = ", ".join(sorted({f for d in kept for f in d["flags"]}))
        shown = ", ".join(d["source"] for d in kept[:10]) + (" ..." if len(kept) > 10 else "")
        print(
            f"  kept {len(kept)} samples the annotations flag ({flags}), as --keep-corrupted"
            f" asked: {shown}"
        )


def _download(args) -> int:
    from .download import download

    root = download(args.dataset, args.dest, source=args.source, extract=not args.no_extract)
    print(f"{args.dataset}: raw data at {root}")
    return 0
