"""`cryocube weights fetch|list`, and `bands_table` behind `cryocube inspect --bands MODEL
DATASET`."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..catalog import Band, dataset_ids, load_dataset
from ..harness import text_table
from .bands import match_bands
from .spec import list_models, model_spec


def bands_table(
    model_id: str, dataset_id_or_bands: str | Sequence[Band], rule: str = "named"
) -> str:
    """A model's band-matching table on a dataset (id or YAML), a cube (path or URL) or Bands."""
    if isinstance(dataset_id_or_bands, (str, Path)):
        name = str(dataset_id_or_bands)
        if name.lower() in dataset_ids() or name.endswith((".yaml", ".yml")):
            ds = load_dataset(name)
            bands, title = ds.bands, f"dataset {ds.id}"
        else:  # a converted cube: its own band coordinates
            from ..cube import cube_info  # zarr and xarray: not for every `cryocube` start

            bands, title = cube_info(name).bands, f"cube {name}"
    else:
        bands, title = tuple(dataset_id_or_bands), "given bands"
    spec = model_spec(model_id)
    m = match_bands(spec, bands, rule)
    return f"{spec.display_name} ({spec.id}) <- {title}\n{m.table()}"


def _list(args) -> int:
    """`cryocube weights list`: checkpoint file, sha256 prefix, licence and source per model."""
    rows = [("model", "name", "file", "sha256", "licence", "source")]
    for mid in list_models():
        s = model_spec(mid)
        w = s.weights
        if not s.pretrained or w is None:
            rows.append((mid, s.display_name, "-", "-", s.licence or "-", "trained from scratch"))
            continue
        src = w.url or "no public URL (see notes)"
        lic = "unverified" if s.licence.startswith("not verified") else (s.licence or "-")
        rows.append(
            (mid, s.display_name, w.filename or "-", (w.sha256 or "unknown")[:12], lic, src)
        )
    print(text_table(rows))
    return 0


def _fetch(args) -> int:
    from .weights import fetch_weights  # torch: not for every `cryocube` start

    for mid in args.models:
        path = fetch_weights(mid, args.dest, force=args.force)
        print(f"{mid}: {path}")
    return 0


def register(subparsers) -> None:
    """Adds `cryocube weights fetch|list`; cryocube/cli.py calls each command module's register."""
    p = subparsers.add_parser("weights", help="fetch and list pretrained encoder weights")
    sub = p.add_subparsers(dest="weights_command", metavar="ACTION", required=True)
    f = sub.add_parser(
        "fetch", help="download a model's published checkpoint (sha256-verified when known)"
    )
    f.add_argument(
        "models", nargs="+", metavar="MODEL", help=f"model id(s): {', '.join(list_models())}"
    )
    f.add_argument(
        "--dest",
        default=None,
        help="directory (default: $CRYOCUBE_WEIGHTS or ~/.cache/cryocube/weights)",
    )
    f.add_argument("--force", action="store_true", help="download again even if the file exists")
    f.set_defaults(func=_fetch)
    ls = sub.add_parser("list", help="models, checkpoint files, checksums, licences and sources")
    ls.set_defaults(func=_list)
