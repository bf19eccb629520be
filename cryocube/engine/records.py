"""The engine's side of run records: the Parquet copy of results.jsonl, rewritten once per
`evaluate` call.

The record itself (`RunRecord`) and its files (record.json, results.jsonl, their repair) live in the
bottom layer, cryocube/record.py, so that families and the report read and write them without
reaching up into the engine; they are named here too for the engine's modules and for notebooks
written against them.
"""

from __future__ import annotations

import json

from .. import store as _store
from ..record import (  # noqa: F401  (re-exported, see above)
    RESULTS_FILE,
    TABLE_COLUMNS,
    TORN_SUFFIX,
    clean,
    load_record,
    missing_records,
    read_results,
    repair_results,
    results_url,
    run_dir,
    sync_results,
    versions,
    write_record,
)

PARQUET_COLUMNS = (*TABLE_COLUMNS, "samples_per_s", "peak_memory_mb", "device", "created")


def write_parquet(out: str) -> None:
    """results.parquet beside results.jsonl: one row per record, metrics flattened, the record as
    JSON."""
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
    url = f"{out.rstrip('/')}/results.parquet"
    fs, path = _store.fs_path(url)
    with fs.open(path, "wb") as f:
        pd.DataFrame(rows).to_parquet(f, index=False)
