"""Run records: one JSON file per run (the cache, and the truth) and results.jsonl, their index.

A record file is written whole or not at all (temporary file + rename, or one object-store PUT), and
"cached" means a record that parses exists. results.jsonl only ever grows by whole lines; a line torn
by a crash is moved aside to results.jsonl.torn (with a warning) before the next record is appended,
so earlier records are never corrupted. The table can always be rebuilt from the records: `evaluate`
re-adds what it lacks (`sync_results`) before it counts a run as cached, and the report reads the
records the table lacks (`missing_records`). The Parquet copy is rewritten once per `evaluate` call.
"""
from __future__ import annotations

import datetime as _dt
import functools
import json
import math
import warnings
from importlib import metadata

import numpy as np

from .. import __version__
from .. import store as _store

RESULTS_FILE = "results.jsonl"
TORN_SUFFIX = ".torn"


def run_dir(out: str, run_id: str) -> str:
    return f"{out.rstrip('/')}/runs/{run_id}"


def results_url(out: str) -> str:
    return f"{out.rstrip('/')}/{RESULTS_FILE}"


@functools.cache
def versions() -> dict[str, str]:
    out = {"cryocube": __version__}
    for pkg in ("torch", "timm", "dask", "distributed", "zarr", "xarray", "numpy"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def clean(v):
    """JSON-safe: NaN/inf -> None, numpy scalars -> Python, tuples -> lists."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set)):
        return [clean(x) for x in v]
    if isinstance(v, np.generic):
        return clean(v.item())
    if isinstance(v, np.ndarray):
        return clean(v.tolist())
    return v


def load_record(out: str, run_id: str) -> dict | None:
    """The run's record if one exists and parses (a damaged one counts as absent, with a warning)."""
    url = f"{run_dir(out, run_id)}/record.json"
    if not _store.file_exists(url):
        return None
    try:
        rec = json.loads(_store.read_text(url))
    except (ValueError, UnicodeDecodeError) as e:
        warnings.warn(f"{url}: not a readable record ({e}); the run counts as not done and will run again", stacklevel=2)
        return None
    return rec if isinstance(rec, dict) else None


def repair_results(out: str) -> int:
    """Move a torn last line of results.jsonl (a crash while appending) to results.jsonl.torn; returns lines moved."""
    url = results_url(out)
    if not _store.file_exists(url):
        return 0
    text = _store.read_text(url)
    if not text:
        return 0
    lines = text.split("\n")
    tail = lines[-1]  # "" when the file ends with a newline, as every complete append does
    bad = [tail] if tail.strip() else []
    keep = lines[:-1]
    while keep and keep[-1].strip():
        try:
            json.loads(keep[-1])
            break
        except ValueError:
            bad.insert(0, keep.pop())
    if not bad:
        return 0
    _store.append_text(url + TORN_SUFFIX, "\n".join(bad) + "\n")
    _store.write_atomic(url, "".join(line + "\n" for line in keep if line.strip()))
    warnings.warn(f"{url}: {len(bad)} torn line(s) at the end (an interrupted write) moved to {url + TORN_SUFFIX}", stacklevel=2)
    return len(bad)


def missing_records(out: str, table: list[dict]) -> list[dict]:
    """Run records (runs/*/record.json) whose latest version the table lacks: a crash between a record file and
    its line, or a line lost to a torn tail. Oldest first."""
    last = {}
    for r in table:
        last[r.get("run_id")] = r.get("created")
    found = []
    for rid in _store.list_dir(f"{out.rstrip('/')}/runs"):
        with warnings.catch_warnings():  # a damaged record file is warned about where a run is looked up
            warnings.simplefilter("ignore")
            rec = load_record(out, rid)
        if rec is not None and rec.get("run_id") == rid and last.get(rid, object()) != rec.get("created"):
            found.append(rec)
    return sorted(found, key=lambda r: str(r.get("created") or ""))


def sync_results(out: str) -> int:
    """Make results.jsonl a complete view of the run records: repair a torn tail, re-add the records it lacks.
    Returns the lines added."""
    repair_results(out)
    add = missing_records(out, read_results(out))
    if add:
        _store.append_text(results_url(out), "".join(json.dumps(r) + "\n" for r in add))
        warnings.warn(f"{results_url(out)}: {len(add)} run record(s) missing from the table re-added from "
                      f"{out.rstrip('/')}/runs/*/record.json", stacklevel=2)
    return len(add)


def write_record(out: str, record: dict) -> dict:
    """Write the run's record file, then append it to results.jsonl; returns the record as written."""
    record = clean(record)
    record.setdefault("created", _dt.datetime.now(_dt.timezone.utc).isoformat())
    record.setdefault("versions", versions())
    _store.write_atomic(f"{run_dir(out, record['run_id'])}/record.json", json.dumps(record, indent=1))
    repair_results(out)
    _store.append_text(results_url(out), json.dumps(record) + "\n")
    return record


def read_results(out: str) -> list[dict]:
    """Every parseable record of results.jsonl (a torn last line is skipped with a warning)."""
    url = results_url(out)
    if not _store.file_exists(url):
        return []
    recs = []
    text = _store.read_text(url)
    lines = text.splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            recs.append(json.loads(line))
        except ValueError:
            if i == len(lines) and not text.endswith("\n"):
                warnings.warn(f"{url}:{i}: torn last line skipped (an interrupted write)", stacklevel=2)
                continue
            raise
    return recs


PARQUET_COLUMNS = ("run_id", "family", "model", "model_name", "dataset", "protocol", "fraction", "seed", "status", "error",
                   "samples_per_s", "peak_memory_mb", "device", "created")


def write_parquet(out: str) -> None:
    """results.parquet beside results.jsonl: one row per record, metrics flattened, the record as JSON."""
    import pandas as pd

    recs = read_results(out)
    if not recs:
        return
    rows = []
    for r in recs:
        m = r.get("metrics") or {}
        w = r.get("weights") or {}
        p = r.get("precision") or {}
        rows.append({k: r.get(k) for k in PARQUET_COLUMNS}
                    | {f"metric_{k}": m.get(k) for k in ("mIoU", "mF1", "oAcc", "mAcc")}
                    | {"random_init": w.get("random_init"), "precision": p.get("effective") if isinstance(p, dict) else p,
                       "record": json.dumps(r)})
    url = f"{out.rstrip('/')}/results.parquet"
    fs, path = _store.fs_path(url)
    with fs.open(path, "wb") as f:
        pd.DataFrame(rows).to_parquet(f, index=False)
