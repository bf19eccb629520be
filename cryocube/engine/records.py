"""The Parquet copy of results.jsonl, rewritten once per `evaluate` call; the records themselves
live in cryocube/record.py."""

from __future__ import annotations

import json

from .. import store as _store
from ..record import TABLE_COLUMNS, read_results

PARQUET_COLUMNS = (*TABLE_COLUMNS, "samples_per_s", "peak_memory_mb", "device", "created")


def write_parquet(out: str) -> None:
    """results.parquet beside results.jsonl: a row per record, metrics flattened, its JSON."""
    import pandas as pd

    recs = read_results(out)
    if not recs:
        return
    rows = []
    for r in recs:
        m, p = r.get("metrics") or {}, r.get("precision") or {}
        rows.append(
            {k: r.get(k) for k in PARQUET_COLUMNS}
            | {f"metric_{k}": m.get(k) for k in ("mIoU", "mF1", "oAcc", "mAcc")}
            | {
                "random_init": (r.get("weights") or {}).get("random_init"),
                "precision": p.get("effective") if isinstance(p, dict) else p,
                "record": json.dumps(r),
            }
        )
    with _store.atomic_file(f"{out.rstrip('/')}/results.parquet") as f:  # never half a table
        pd.DataFrame(rows).to_parquet(f, index=False)
