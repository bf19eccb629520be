"""Run records as pandas and xarray objects for notebooks (docs/usage.md), read through the
report's reader so that a notebook's numbers are the report's; failed runs are rows too, with their
error, never values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from . import families, store
from .errors import ResultsError
from .record import TABLE_COLUMNS
from .report.records import LEADERBOARD_METRIC, Run, _num, load_results

# the run's identity, then how it went, then what it cost (columns in this order, metrics between)
RUN_COLUMNS = (*TABLE_COLUMNS, "ranked", "primary_metric")
COST_COLUMNS = tuple(
    "total_s samples_per_s peak_memory_mb gflops device precision random_init created"
    " source".split()
)
NOT_METRICS = (*RUN_COLUMNS, *COST_COLUMNS, "record")
# dims of the segmentation Dataset; `fraction` joins them where one protocol ran at several
DIMS = ("model", "dataset", "protocol", "seed")
CELL_FIELDS = ("task", "metric", "class", "unit", "split", "samples", "n", "value")
CELL_CI = ("ci_low", "ci_high")


def _row(r: Run, ranked: bool) -> dict[str, Any]:
    scalar = {
        k: _num(v) for k, v in r.metrics.items() if not isinstance(v, (dict, list, str, bool))
    }
    return (
        {k: getattr(r, k) for k in RUN_COLUMNS if k != "ranked"}
        | {"ranked": ranked}
        | scalar
        | {k: getattr(r, k) for k in COST_COLUMNS}
        | {"record": r.record.to_dict()}
    )


def open_results(path_or_url: str | Path, storage_options: dict | None = None) -> pd.DataFrame:
    """The runs of a results folder (local or any fsspec URL), one row per run: its identity,
    status, `ranked` (the leaderboards average it), scalar metrics, cost and whole `record`."""
    url = str(path_or_url)
    if storage_options is not None and store.is_remote(url):
        store.register_options(url, storage_options)
    res = load_results(url, families.report_key)
    ranked = {id(r) for r in res.runs}
    runs = [
        *res.runs,
        *res.other_recipes,
        *(r for rs in res.by_family.values() for r in rs),
        *res.failures,
    ]
    if not runs:
        raise ResultsError(f"{url}: holds no run records (results.jsonl is empty)")
    rows = [_row(r, id(r) in ranked) for r in runs]
    df = pd.DataFrame(rows)
    metrics = [c for c in df.columns if c not in NOT_METRICS]
    df = df[[*RUN_COLUMNS, *metrics, *COST_COLUMNS, "record"]]
    return df.sort_values(
        ["family", "dataset", "protocol", "fraction", "model_name", "seed"], ignore_index=True
    )


@pd.api.extensions.register_dataframe_accessor("cryocube")
class ResultsAccessor:
    """`df.cryocube`: the xarray and board views of a frame `open_results` returned (or any subset
    of its rows)."""

    def __init__(self, df: pd.DataFrame):
        missing = [c for c in (*RUN_COLUMNS, "record") if c not in df.columns]
        if missing:
            raise ResultsError(
                f"this DataFrame lacks {', '.join(missing)}: df.cryocube reads frames that"
                " cryocube.open_results returned"
            )
        self._df = df

    def to_xarray(self, metrics: list[str] | None = None):
        """The ranked runs' metrics (default: all scalar ones) on (model, dataset, protocol, seed;
        `fraction` where a protocol ran at several), `model` holding the report's row names."""
        df = self._df[self._df["ranked"]]
        if df.empty:
            raise ResultsError(
                f"no run here is scored on {LEADERBOARD_METRIC} (the segmentation runs the"
                " leaderboards rank): nothing to put on (model, dataset, protocol, seed)"
            )
        if metrics is None:
            metrics = [c for c in df.columns if c not in NOT_METRICS and df[c].notna().any()]
        dims = list(DIMS)
        if df.duplicated(dims).any():
            dims.insert(3, "fraction")
        frame = df.rename(columns={"model": "model_id", "model_name": "model"})
        ds = frame.set_index(dims)[list(metrics)].to_xarray()
        ids = frame.drop_duplicates("model").set_index("model")["model_id"]
        ds = ds.assign_coords(model_id=("model", [ids[m] for m in ds["model"].values]))
        if "fraction" not in dims:
            cell = ["model", "dataset", "protocol"]
            frac = frame.drop_duplicates(cell).set_index(cell)["fraction"]
            ds = ds.assign_coords(fraction=frac.to_xarray())
        for m in metrics:
            ds[m].attrs["long_name"] = f"test {m}"
        ds.attrs["source"] = "cryocube.open_results"
        return ds

    def cells(self) -> pd.DataFrame:
        """The board cells of the rows' ok runs, one row per (run, task, metric, class), with the
        95 % interval, unit and the hash of the samples it was scored on."""
        rows = []
        for _, r in self._df[self._df["status"] == "ok"].iterrows():
            for c in (r["record"].get("metrics") or {}).get("cells") or []:
                rows.append(
                    {k: r[k] for k in RUN_COLUMNS[:8]}
                    | {k: c.get(k) for k in CELL_FIELDS}
                    | {k: _num(c.get(k)) for k in CELL_CI}
                )
        return pd.DataFrame(rows, columns=[*RUN_COLUMNS[:8], *CELL_FIELDS, *CELL_CI])
