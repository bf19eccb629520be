"""The run record: what one run of any family was, typed and versioned (older versions migrate on
read, so old results folders keep loading), and its files: `runs/<run_id>/record.json`, the truth,
written whole or not at all, and results.jsonl, their index, grown by whole lines only."""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import hashlib
import json
import math
import warnings
from dataclasses import asdict, dataclass, field, replace
from dataclasses import fields as _fields
from importlib import metadata
from typing import Any, Iterator

import numpy as np

from . import __version__
from . import store as _store
from .errors import RecordError  # noqa: F401  (re-exported: cryocube.record names it)

# 2: typed common fields (this module); 1: the untyped dicts of releases before it
RECORD_VERSION = 2
RESULTS_FILE = "results.jsonl"
TORN_SUFFIX = ".torn"
# a record of any version lacks none of these
REQUIRED = ("model", "dataset", "protocol", "seed", "status")
# the columns every table of records (results.parquet, `open_results`) starts with
TABLE_COLUMNS = tuple(
    "run_id family model model_name dataset protocol fraction seed status error".split()
)


@dataclass
class RunRecord:
    """One run's record; `fields` holds what only its family writes (config, embedding, tasks)."""

    run_id: str
    family: str
    model: str
    dataset: str
    protocol: str
    seed: int
    fraction: float = 1.0
    model_name: str | None = None
    status: str = "planned"  # planned | ok | error
    error: str | None = None
    primary_metric: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    identity: dict[str, Any] = field(default_factory=dict)  # everything the run id hashes
    cube: dict[str, Any] | None = None  # url, checksum, schema_version of the cube it read
    weights: dict[str, Any] | None = None
    precision: dict[str, Any] | None = None
    overrides: dict[str, Any] | None = None
    created: str | None = None
    versions: dict[str, str] | None = None
    record_version: int = RECORD_VERSION
    fields: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON of record.json and results.jsonl (common fields, then the family's)."""
        d = asdict(self)
        own = d.pop("fields")
        return d | {k: v for k, v in own.items() if k not in d}

    def get(self, name: str, default: Any = None) -> Any:
        """A field by its name in the JSON form, common or the family's own, as `dict.get`."""
        return getattr(self, name) if name in COMMON else self.fields.get(name, default)

    def __getitem__(self, name: str) -> Any:
        """A field by its JSON name (notebooks, tests); KeyError names a field the record lacks."""
        if name in COMMON:
            return getattr(self, name)
        try:
            return self.fields[name]
        except KeyError:
            raise KeyError(f"run record {self.run_id} has no field {name!r}") from None

    def merged(self, more: dict[str, Any]) -> RunRecord:
        """A copy with `more` (a family's finish fields, the scheduler's status) set."""
        own = {k: v for k, v in more.items() if k not in COMMON}
        return replace(
            self, **{k: v for k, v in more.items() if k in COMMON}, fields=self.fields | own
        )

    @classmethod
    def from_dict(cls, d: Any, where: str = "record") -> RunRecord:
        """Validate and migrate a record read from disk; `where` ("file:line") starts each error."""
        if not isinstance(d, dict):
            raise RecordError(f"{where}: a record must be a JSON object, got {type(d).__name__}")
        version = d.get("record_version", 1)
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise RecordError(
                f"{where}: record_version must be a positive integer, got {version!r}"
            )
        if version > RECORD_VERSION:
            raise RecordError(
                f"{where}: record_version {version} was written by a newer cryocube (this one reads"
                f" up to {RECORD_VERSION}); upgrade cryocube to read it"
            )
        missing = [k for k in REQUIRED if k not in d]
        if missing:
            raise RecordError(f"{where}: record lacks {', '.join(missing)}")
        for v in range(version, RECORD_VERSION):
            d = MIGRATIONS[v](d)
        common = {k: d[k] for k in COMMON if k in d}
        try:
            common["seed"] = int(common["seed"])
            common["fraction"] = float(common["fraction"])
        except (TypeError, ValueError) as e:
            raise RecordError(f"{where}: seed/fraction must be numbers ({e})") from None
        for k in ("run_id", "family", "model", "dataset", "protocol", "status"):
            common[k] = str(common[k])
        for k in ("metrics", "identity"):
            if not isinstance(common.get(k), dict):
                common[k] = {}  # (a value of another kind reads as empty, as it always did)
        # (precision was a bare string in early records)
        for k in ("cube", "weights", "overrides", "versions"):
            if common.get(k) is not None and not isinstance(common[k], dict):
                raise RecordError(
                    f"{where}: field {k} must be an object, got {type(common[k]).__name__}"
                )
        return cls(**common, fields={k: v for k, v in d.items() if k not in COMMON})


def content_hash(obj: Any, n: int = 20) -> str:
    """The run id (and every other digest of JSON-like data): a sha256 of its sorted JSON."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:n]


# the fields every record has, typed above; the rest of a record's JSON is its family's own
COMMON = frozenset(f.name for f in _fields(RunRecord)) - {"fields"}


def _v1_to_v2(d: dict) -> dict:
    """Untyped records: fill what they left implicit (family, primary metric, fraction, run id)."""
    family = str(d.get("family") or "segmentation")
    primary = d.get("primary_metric") or ("Q" if family == "embedding" else "mIoU")
    fraction = d.get("fraction")
    out = d | {
        "family": family,
        "primary_metric": primary,
        "fraction": 1.0 if fraction is None else fraction,
        "run_id": str(d.get("run_id") or ""),
        "record_version": 2,
    }
    if primary == "Q" and not d.get("label_set"):
        # probe runs are ranked only on the same labels: an early record names them by their
        # digest in its identity, else by its labels source and task names
        ident = d.get("identity")
        tasks = ident.get("tasks") if isinstance(ident, dict) else None
        said = {"labels": d.get("labels"), "tasks": d.get("tasks")}
        out["label_set"] = str(tasks) if tasks else content_hash(said, 12)
    return out


MIGRATIONS = {1: _v1_to_v2}  # version -> the function that lifts a record of it to the next


def run_dir(out: str, run_id: str) -> str:
    """A run's folder under `out`: record.json (the cache) and what its family keeps beside it."""
    return f"{out.rstrip('/')}/runs/{run_id}"


def results_url(out: str) -> str:
    """The results.jsonl index under `out`, which only ever grows by whole lines."""
    return f"{out.rstrip('/')}/{RESULTS_FILE}"


@functools.cache
def versions() -> dict[str, str]:
    """The package versions stamped on every record written, read once per process."""
    out = {"cryocube": __version__}
    for pkg in ("torch", "timm", "dask", "distributed", "zarr", "xarray", "numpy"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[pkg] = metadata.version(pkg)
    return out


def clean(v):
    """JSON-safe: NaN/inf -> None, numpy scalars -> Python, tuples -> lists."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set)):
        return [clean(x) for x in v]
    if isinstance(v, (np.generic, np.ndarray)):  # a scalar's tolist is its item
        return clean(v.tolist())
    return v


def load_record(out: str, run_id: str) -> RunRecord | None:
    """The run's record if it exists and validates (a damaged one: absent, with a warning)."""
    url = f"{run_dir(out, run_id)}/record.json"
    if not _store.file_exists(url):
        return None
    try:
        rec = json.loads(_store.read_text(url))
    except (ValueError, UnicodeDecodeError) as e:
        warnings.warn(
            f"{url}: not a readable record ({e}); the run counts as not done and will run again",
            stacklevel=2,
        )
        return None
    if not isinstance(rec, dict):
        return None
    try:
        return RunRecord.from_dict(rec, url)
    except RecordError as e:
        warnings.warn(f"{e}; the run counts as not done and will run again", stacklevel=2)
        return None


def repair_results(out: str) -> int:
    """Move a torn end of results.jsonl (a crash while appending) to its .torn file; lines moved."""
    url = results_url(out)
    text = _store.read_text(url) if _store.file_exists(url) else ""
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
    warnings.warn(
        f"{url}: {len(bad)} torn line(s) at the end (an interrupted write) moved to"
        f" {url + TORN_SUFFIX}",
        stacklevel=2,
    )
    return len(bad)


def missing_records(out: str, table: list[dict]) -> list[RunRecord]:
    """Run records (runs/*/record.json) whose latest version the table lacks, oldest first: a crash
    between a record file and its line, or a line lost to a torn tail."""
    last = {r.get("run_id"): r.get("created") for r in table}
    found = []
    for rid in _store.list_dir(f"{out.rstrip('/')}/runs"):
        # a damaged record file is warned about where a run is looked up
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rec = load_record(out, rid)
        if rec is not None and rec.run_id == rid and last.get(rid, object()) != rec.created:
            found.append(rec)
    return sorted(found, key=lambda r: str(r.created or ""))


def sync_results(out: str) -> int:
    """Make results.jsonl a complete view of the run records, torn tail repaired; lines added."""
    repair_results(out)
    add = missing_records(out, read_results(out))
    if add:
        _store.append_text(results_url(out), "".join(json.dumps(r.to_dict()) + "\n" for r in add))
        warnings.warn(
            f"{results_url(out)}: {len(add)} run record(s) missing from the table re-added from "
            f"{out.rstrip('/')}/runs/*/record.json",
            stacklevel=2,
        )
    return len(add)


def write_record(out: str, record: dict | RunRecord) -> dict:
    """Write the run's record file, then append it to results.jsonl; returns the JSON written."""
    record = clean(record.to_dict() if isinstance(record, RunRecord) else record)
    if record.get("created") is None:
        record["created"] = _dt.datetime.now(_dt.timezone.utc).isoformat()
    if record.get("versions") is None:
        record["versions"] = versions()
    _store.write_atomic(
        f"{run_dir(out, record['run_id'])}/record.json", json.dumps(record, indent=1)
    )
    repair_results(out)
    _store.append_text(results_url(out), json.dumps(record) + "\n")
    return record


def read_results(out: str) -> list[dict]:
    """Every record of results.jsonl, as written (a torn last line is skipped with a warning)."""
    url = results_url(out)
    return [d for _, d in table_lines(url)] if _store.file_exists(url) else []


def table_lines(url: str) -> Iterator[tuple[int, Any]]:
    """(line number, JSON) of a results.jsonl: a torn last line is skipped with a warning (the
    engine moves it aside next time), any other bad line is a RecordError."""
    text = _store.read_text(url)
    lines = text.splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield i, json.loads(line)
        except ValueError as e:
            if i < len(lines) or text.endswith("\n"):
                raise RecordError(f"{url}:{i}: not valid JSON ({getattr(e, 'msg', e)})") from None
            warnings.warn(f"{url}:{i}: torn last line skipped (an interrupted write)", stacklevel=3)
