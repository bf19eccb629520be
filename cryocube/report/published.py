"""Published leaderboards: the Cryo-Bench paper's table (README snapshot 41b6115, arXiv
2603.01576), imported tables, and their averages and ranks recomputed, differences reported."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from .leaderboard import Leaderboard, build_leaderboard
from .names import dataset_id_from_name
from .records import ResultsError

PUBLISHED_CSV = Path(__file__).resolve().parent / "data" / "cryobench-published.csv"
AVG_COLUMN, RANK_COLUMN = "avg_miou_published", "avg_rank_published"
SOURCE = (
    "Cryo-Bench (arXiv 2603.01576), README table: frozen encoder, 100 % labels, UPerNet, test mIoU"
)


@dataclass(frozen=True)
class Mismatch:
    """A printed average or rank that the per-dataset numbers do not give."""

    model: str
    field: str  # "avg_mIoU" or "avg_rank"
    published: float
    recomputed: float | None

    def __str__(self) -> str:
        rec = "not computable" if self.recomputed is None else f"{self.recomputed:.3f}"
        return f"{self.model}: published {self.field} {self.published:.2f}, recomputed {rec}"


def _float(v: str, where: str) -> float | None:
    v = (v or "").strip()
    if v in ("", "-", "–", "—", "nan", "NaN", "n/a"):
        return None
    try:
        return float(v)
    except ValueError:
        raise ResultsError(f"{where}: {v!r} is not a number") from None


def load_leaderboard_csv(
    path: str | Path | None = None, *, key: str = "published", title: str | None = None
) -> Leaderboard:
    """A published/imported table (`model`, a column per dataset, optional avg_miou_published /
    avg_rank_published) as a Leaderboard with recomputed ranks."""
    path = Path(path) if path else PUBLISHED_CSV
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise ResultsError(f"{path}: cannot read the published table ({e})") from None
    if not rows or "model" not in rows[0]:
        raise ResultsError(
            f"{path}: needs a header with a 'model' column and one column per dataset"
        )
    ds_cols = [c for c in rows[0] if c not in ("model", AVG_COLUMN, RANK_COLUMN)]
    datasets = [dataset_id_from_name(c) for c in ds_cols]
    samples, published = {}, {}
    for i, row in enumerate(rows, 2):
        m = row["model"].strip()
        for c, d in zip(ds_cols, datasets):
            v = _float(row[c], f"{path}:{i} column {c}")
            if v is not None:
                samples[(m, d)] = [(0, v)]
        printed = (row.get(AVG_COLUMN, ""), row.get(RANK_COLUMN, ""))
        published[m] = tuple(_float(v, f"{path}:{i}") for v in printed)
    lb = build_leaderboard(
        samples,
        key=key,
        title=title or f"Published: {path.name}",
        protocol="frozen",
        datasets=datasets,
        models=list(published),
    )
    for r in lb.rows:
        r.published_avg, r.published_rank = published[r.name]
    lb.notes.append(f"Source: {SOURCE}." if path == PUBLISHED_CSV else f"Source: {path}.")
    return lb


def check_consistency(lb: Leaderboard, *, tolerance: float | None = None) -> list[Mismatch]:
    """Printed averages/ranks against recomputed; tolerance: half a printed unit (0.005) + slack."""
    tol = (0.5 * 10**-lb.decimals if tolerance is None else tolerance) + 1e-9
    out = []
    for r in lb.rows:
        for name, pub, rec in (
            ("avg_mIoU", r.published_avg, r.avg),
            ("avg_rank", r.published_rank, r.avg_rank),
        ):
            if pub is not None and (rec is None or not math.isclose(pub, rec, abs_tol=tol)):
                out.append(Mismatch(r.name, name, pub, rec))
    return out


def published_leaderboard() -> Leaderboard:
    """The paper's table, rendered through the same code as our runs."""
    return load_leaderboard_csv(
        PUBLISHED_CSV, key="published", title="Cryo-Bench published (frozen encoder)"
    )
