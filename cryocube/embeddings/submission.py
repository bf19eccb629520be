"""The Embed2Scale submission CSV (`id,0,1,...,D-1`), read with the challenge's checks (strict)
or as NeuCo-Bench reads it (lenient): a file it would reject says why, naming id and column."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from cryocube.errors import NeuCoError, SubmissionError
from cryocube.labelfiles import strip_id
from cryocube.store import atomic_file

_DIGITS = re.compile(r"^[0-9]+$")


def _fmt_ids(ids: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(repr(i) for i in ids[:limit])
    return shown + (", ..." if len(ids) > limit else "")


def _quote(field: str) -> str:
    if any(ch in field for ch in ',"\r\n'):
        return '"' + field.replace('"', '""') + '"'
    return field


def write_submission(path: str | os.PathLike, ids: Iterable[str], X: np.ndarray) -> Path:
    """Write `id,0,...,D-1` with one row per id (ids stripped of .zarr.zip), atomically."""
    path = Path(path)
    ids = [strip_id(i) for i in ids]
    X = np.asarray(X, dtype=np.float32)
    if X.ndim != 2 or X.shape[0] != len(ids):
        raise SubmissionError(
            f"{path}: {len(ids)} ids do not match an embedding matrix of shape {X.shape}."
        )
    seen: set[str] = set()
    for i in ids:
        if i in seen:
            raise SubmissionError(f"{path}: id {i!r} appears more than once.")
        seen.add(i)
    bad = ~np.isfinite(X)
    if bad.any():
        r, c = map(int, np.argwhere(bad)[0])
        raise SubmissionError(
            f"{path}: the embedding of id {ids[r]!r} has a non-finite value in column {c}."
        )
    row_fmt = ",".join(["%.9g"] * X.shape[1])  # 9 significant digits round-trip float32 exactly
    with atomic_file(str(path)) as f:
        f.write((",".join(["id"] + [str(j) for j in range(X.shape[1])]) + "\n").encode())
        for i, row in zip(ids, X.astype(np.float64)):
            f.write(f"{_quote(i)},{row_fmt % tuple(row)}\n".encode())
    return path


def _value_columns(cols: list[str], lenient: bool) -> list[str]:
    """Embedding columns: all-digit names sorted numerically (lenient: else every non-id column)."""
    digits = [c for c in cols if _DIGITS.match(c)]
    if lenient:
        return sorted(digits, key=int) if digits else cols
    return sorted(cols, key=int) if len(digits) == len(cols) else cols


def _read_frame(path: Path):
    """The CSV as text ids and columns, refused in one sentence when it is none or has no id."""
    import pandas as pd

    unreadable = (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError, ValueError)
    try:
        header = [str(c) for c in pd.read_csv(path, nrows=0).columns]
        if "id" in header:
            df = pd.read_csv(path, dtype={"id": str})
    except FileNotFoundError:
        raise SubmissionError(f"submission file {path} does not exist.") from None
    except unreadable as e:
        raise SubmissionError(f"{path} is not a readable CSV file ({e}).") from None
    if "id" not in header:
        raise SubmissionError(
            f"{path} has no 'id' column (its first columns are {_fmt_ids(header, 3)})."
        )
    df.columns = [str(c) for c in df.columns]
    return df


def _numbers(frame) -> tuple[np.ndarray, np.ndarray]:
    """(values as float64, where a cell is not a number); empty cells are NaN, not uncastable."""
    import pandas as pd

    values = np.zeros(frame.shape)
    if frame.shape[1]:  # (apply over no column gives no frame)
        values = frame.apply(pd.to_numeric, errors="coerce").to_numpy(np.float64, copy=True)
    return values, np.isnan(values) & frame.notna().to_numpy(dtype=bool)


def _refuse_values(path, values, uncastable, raw_ids, ids, cols) -> None:
    """The challenge's checks 4 (every value casts to float) and 5 (no NaN), then no infinity (it
    would poison the standardisation) and no empty id: the first offending row, then column."""
    for mask, what in (
        (uncastable, "a value that is not a number"),
        (np.isnan(values) & ~uncastable, "a NaN (or empty) value"),
        (np.isinf(values), "an infinite value"),
    ):
        if mask.any():
            r, c = map(int, np.argwhere(mask)[0])
            raise SubmissionError(
                f"{path}: row of id {raw_ids[r]!r} has {what} in column {cols[c]!r} (line {r + 2})."
            )
    empty = [r for r, i in enumerate(ids) if not i.strip()]
    if empty:
        raise SubmissionError(f"{path}: the id cell of line {empty[0] + 2} is empty.")


def _value_count(path, cols: list[str], dim: int | None, strict: bool) -> None:
    """Check 3: strict, exactly `dim` value columns; lenient, at most `dim` (fewer are padded)."""
    if dim is None:
        return
    if strict and len(cols) != dim:
        extra = f" (the first beyond {dim} is {cols[dim]!r})" if len(cols) > dim else ""
        raise SubmissionError(
            f"{path} has {len(cols)} value columns after 'id', expected {dim}{extra}."
        )
    if len(cols) > dim:
        raise SubmissionError(
            f"{path} has {len(cols)} embedding columns, more than the expected {dim}."
        )


def read_submission(
    path: str | os.PathLike,
    expected_ids: Iterable[str] | None = None,
    dim: int | None = 1024,
    strict: bool = True,
    strict_values: bool | None = None,
) -> tuple[list[str], np.ndarray, dict[str, Any]]:
    """A submission CSV -> (ids, float32 matrix, notes), strict: the challenge's checks in order;
    `strict_values` (default: `strict`) refuses what NeuCo-Bench reads as 0 (text, NaN, inf)."""
    strict_values = strict if strict_values is None else strict_values
    path = Path(path)
    df = _read_frame(path)  # 1. the id column
    raw_ids = df["id"].fillna("").astype(str).tolist()
    ids = [strip_id(i) for i in raw_ids]
    notes: dict[str, Any] = {
        "zarr_zip_not_removed_from_id_column": any(r != i for r, i in zip(raw_ids, ids)),
    }
    # 2. every expected id present
    expected = None if expected_ids is None else [strip_id(i) for i in expected_ids]
    if expected is not None:
        have = set(ids)
        missing = [i for i in expected if i not in have]
        notes["n_missing_ids"] = len(missing)
        if missing and strict:
            raise SubmissionError(
                f"{path} lacks {len(missing)} expected ids, among them {_fmt_ids(missing)}."
            )
    cols = _value_columns([c for c in df.columns if c != "id"], lenient=not strict)
    _value_count(path, cols, dim, strict)
    values, uncastable = _numbers(df[cols])
    if strict_values:
        _refuse_values(path, values, uncastable, raw_ids, ids, cols)
    else:
        bad = uncastable | np.isnan(values)
        notes["n_values_set_to_zero"] = int(bad.sum())
        values[bad] = 0.0
    if not strict and dim is not None and len(cols) < dim:
        notes["n_padded_columns"] = dim - len(cols)
        values = np.pad(values, ((0, 0), (0, dim - len(cols))))
    seen: dict[str, int] = {}
    for r, i in enumerate(ids):
        if i in seen:
            raise SubmissionError(
                f"{path}: id {i!r} appears more than once (rows {seen[i] + 2} and {r + 2})."
            )
        seen[i] = r
    wanted = set(ids if expected is None else expected)
    keep = np.array([r for r, i in enumerate(ids) if i in wanted], dtype=int)
    notes["n_dropped_ids"] = len(ids) - len(keep)
    return [ids[r] for r in keep], values[keep].astype(np.float32), notes


def pad_to(X: np.ndarray, dim: int) -> np.ndarray:
    """Zero-pad the columns of X on the right to `dim`; a wider matrix is an error."""
    X = np.asarray(X)
    if X.ndim != 2:
        raise NeuCoError(f"embeddings must be a 2-D matrix (samples x dims), got shape {X.shape}.")
    if X.shape[1] > dim:
        raise NeuCoError(f"embeddings have {X.shape[1]} dimensions, more than the expected {dim}.")
    return X if X.shape[1] == dim else np.pad(X, ((0, 0), (0, dim - X.shape[1])))
