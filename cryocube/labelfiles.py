"""NeuCo-Bench label folders, one `<task>__<cls|regr>.csv` (id,label) per task, read strictly: every
way a label file could silently change a score is refused in one sentence naming file, line and id.
An empty label cell means "unlabelled" (as NeuCo-Bench: the row is skipped and counted)."""

from __future__ import annotations

import csv
import io
import math
import posixpath
from dataclasses import dataclass
from pathlib import Path

from . import store as _store
from .errors import LabelError

_TYPES = {"cls": "cls", "classification": "cls", "regr": "regr", "regression": "regr"}


def split_task_name(name: str) -> tuple[str, str]:
    """`<task>__<type>[.csv]` (a file name or path) -> (task, "cls" | "regr")."""
    stem = Path(str(name)).name
    stem = stem[: -len(".csv")] if stem.lower().endswith(".csv") else stem
    task, sep, suffix = stem.rpartition("__")
    kind = _TYPES.get(suffix.lower()) if sep else None
    if kind is None or not task:
        raise LabelError(
            f"task {name!r} must end in __cls, __classification, __regr or __regression "
            "(e.g. landcover_forest__regr.csv)."
        )
    return task, kind


def strip_id(name: str) -> str:
    """Sample id from a cube file name: drop `.zarr.zip`, then `.zarr`."""
    return str(name).removesuffix(".zarr.zip").removesuffix(".zarr")


@dataclass(frozen=True)
class LabelFile:
    """One task's labels as read: id (suffix stripped) -> label, and how many rows had no label."""

    task: str  # without the __cls/__regr suffix
    kind: str  # "cls" | "regr"
    path: str
    labels: dict[str, float]
    n_unlabelled: int


def read_label_file(path: str, text: str) -> LabelFile:
    """Parse one label file's text (BOM already removed) strictly."""
    task, kind = split_task_name(path)
    rows = csv.reader(io.StringIO(text))
    header = next(rows, None)
    names = [h.strip() for h in header or []]
    if "id" not in names or "label" not in names:
        raise LabelError(
            f"{path}: a label file needs the columns id and label, found {names or 'no header'}"
        )
    for col in ("id", "label"):
        if names.count(col) > 1:
            raise LabelError(
                f"{path}: the column {col!r} appears {names.count(col)} times in the header"
            )
    i_id, i_label = names.index("id"), names.index("label")
    labels: dict[str, float] = {}
    first_line: dict[str, int] = {}
    unlabelled = 0
    for row in rows:
        line = rows.line_num
        if not row or all(not c.strip() for c in row):
            continue  # a blank line
        if len(row) != len(names):
            raise LabelError(
                f"{path} line {line}: {len(row)} fields where the header has {len(names)}"
            )
        id_ = strip_id(row[i_id].strip())
        if not id_:
            raise LabelError(f"{path} line {line}: the id cell is empty")
        if id_ in first_line:
            raise LabelError(
                f"{path}: id {id_!r} appears twice (lines {first_line[id_]} and {line}); "
                "one label per sample"
            )
        first_line[id_] = line
        cell = row[i_label].strip()
        if not cell:
            unlabelled += 1
            continue
        try:
            labels[id_] = float(cell)
        except ValueError:
            labels[id_] = math.nan
        if not math.isfinite(labels[id_]):
            raise LabelError(
                f"{path} line {line}: the label of id {id_!r} is {cell!r}, not a finite number "
                "(leave the cell empty to mark the sample unlabelled)"
            )
    if not labels:
        raise LabelError(f"{path}: no labelled rows ({unlabelled} rows with an empty label)")
    return LabelFile(task, kind, path, labels, unlabelled)


def read_label_folder(folder: str, storage_options: dict | None = None) -> dict[str, LabelFile]:
    """Every `*.csv` of a labels folder -> task -> LabelFile, strictly checked."""
    fs, base = _store.fs_path(folder, storage_options)
    base = base.rstrip("/")
    if not fs.isdir(base):
        raise LabelError(f"{folder}: no such labels folder")
    files = sorted(
        p for p in fs.ls(base, detail=False) if p.lower().endswith(".csv") and fs.isfile(p)
    )
    if not files:
        raise LabelError(f"{folder}: no <task>__<cls|regr>.csv label files")
    out: dict[str, LabelFile] = {}
    owner: dict[str, str] = {}
    for p in files:
        name = posixpath.basename(p)
        try:
            task, _ = split_task_name(name)
        except LabelError as e:
            raise LabelError(f"{p}: {e}") from None
        # x__cls and X__regr would share a results folder on a case-insensitive disk
        key = task.lower()
        if key in owner:
            raise LabelError(
                f"{folder}: {owner[key]} and {name} both define task {task!r}; "
                "one file per task name (rename one)"
            )
        owner[key] = name
        try:
            text = fs.cat_file(p).decode("utf-8-sig")  # Excel's "CSV UTF-8" starts with a BOM
        except UnicodeDecodeError as e:
            raise LabelError(
                f"{p}: not UTF-8 text (byte {e.start}); save it as CSV UTF-8"
            ) from None
        out[task] = read_label_file(p, text)
    return out
