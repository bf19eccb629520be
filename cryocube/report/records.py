"""Reading run records (results.jsonl, any store): the latest record of a repeated run kept, failed
runs listed, never averaged; random-init and tuned runs are rows of their own, trials unranked."""

from __future__ import annotations

import math
import warnings
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable

from .. import store
from ..errors import RecordError, ResultsError
from ..record import RESULTS_FILE, RunRecord, content_hash, missing_records, table_lines
from .names import model_display_name

RANDOM_INIT = " (random init)"
DEVIATES = " (deviates: "  # + the record's deviations in effect + ")": see docs/deviations.md
# the best trial of a `cryocube tune` study: its own row, never averaged with default-recipe runs
TUNED = " (tuned)"


def _dict(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _own(name: str, check) -> property:
    """A field of the record as the tables read it (`check`: a number, a dict, ...)."""
    return property(lambda self: check(self.record.get(name)), doc=f"From the record's {name}.")


@dataclass(frozen=True)
class Run:
    """A validated `RunRecord` (its fields read through) as a report row: where it was read, its
    row name, its status (ok without its primary metric: failed), the key `dedupe` keeps one of."""

    record: RunRecord = field(repr=False)
    source: str  # "file:line", for error messages and the failures table
    model_name: str
    status: str
    error: str | None
    key: tuple  # what makes two records the same run: `dedupe` keeps the latest per key

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "record":
            raise AttributeError(name)
        return getattr(self.record, name)

    gflops = _own("gflops", _num)  # the catalog's published GFLOPs; a measured profile wins
    samples_per_s = _own("samples_per_s", _num)  # training throughput, for the cost table
    peak_memory_mb = _own("peak_memory_mb", _num)  # the cost table shows a model's largest
    sweep = _own("sweep", _dict)  # a `cryocube tune` record's study, trial, state, best
    # where the run computed ("cuda:0", "cpu"; "" if unrecorded): GPU and CPU hours apart
    device = _own("device", lambda v: str(v or ""))
    dataset = _own("dataset", str.lower)  # as the catalog spells it (older records wrote GLID)
    created = _own("created", lambda v: v or "")  # "" where unsaid; a run's latest record wins
    cube = _own("cube", lambda v: v or {})  # url, checksum; {} for vectors made elsewhere
    # test mIoU, None unless a finite number: the leaderboards rank only runs that have one
    miou = _own("metrics", lambda m: _num(m.get("mIoU")))
    # the run's own seconds (fit and scoring), summed into the cost table's device hours
    total_s = _own("timings", lambda v: _num(_dict(v).get("total_s")))

    @property
    def class_iou(self) -> dict[str, float]:
        """Test IoU per class name, non-numbers left out; {} for a family that scores no classes."""
        iou = _dict(self.metrics.get("IoU"))
        return {str(k): float(v) for k, v in iou.items() if _num(v) is not None}

    @property
    def params(self) -> tuple[int | None, int | None]:
        """(encoder, decoder) parameter counts, each None where the record lacks it."""
        p = _dict(self.record.get("params"))
        return tuple(
            None if (n := _num(p.get(k))) is None else int(n) for k in ("encoder", "decoder")
        )

    @property
    def random_init(self) -> bool:
        """Pretrained model, random weights: a row of its own, never averaged with real weights."""
        return _random_init(self.record)

    @property
    def precision(self) -> str:
        """Effective precision (bf16, fp32, ...); an older record's plain string; else fp32."""
        p = self.record.precision
        return str(p.get("effective")) if isinstance(p, dict) else str(p or "fp32")

    @property
    def is_trial(self) -> bool:
        """A study's trial (not its best retrain): read by its study's section, never ranked."""
        return bool(self.sweep) and not self.sweep.get("best")

    @property
    def recipe(self) -> dict[str, Any]:
        """The recipe fields the run was defined by (identity's, else an older record's config)."""
        return _dict(self.identity.get("recipe", self.record.get("config")))

    @property
    def recipe_digest(self) -> str:
        """What defines the run apart from fraction, seed and protocol: equal digests, one curve."""
        return recipe_digest(self.record)


@dataclass
class Results:
    """Runs from one or more results files after de-duplication."""

    runs: list[Run]  # status ok with a numeric mIoU
    failures: list[Run]  # status error (or "ok" without a usable mIoU)
    sources: list[str]
    replaced: list[Run] = field(default_factory=list)  # older records of a repeated run
    # ok runs of a cell's other recipes (curves only, never averaged)
    other_recipes: list[Run] = field(default_factory=list)
    # `cryocube tune` trials, every line (see report/sweeps.py)
    trials: list[Run] = field(default_factory=list)
    # ok runs scored on another metric than mIoU, by family: their sections are the families' own
    by_family: dict[str, list[Run]] = field(default_factory=dict)

    def of(self, family: str) -> list[Run]:
        """The ok runs of one family with its own report section (a list the caller may extend)."""
        return self.by_family.setdefault(family, [])


# the protocol leaderboards (Cryo-Bench's) rank runs scored on it, of any family
LEADERBOARD_METRIC = "mIoU"
# identity fields that vary along a curve, not between curves
NOT_RECIPE = ("fraction", "seed", "protocol")
FamilyKey = Callable[[RunRecord], tuple]


def result_files(paths: Iterable[str | Path]) -> list[str]:
    """Directories (local or remote) expanded to their results.jsonl files (the folder's first)."""
    files: list[str] = []
    for p in map(str, paths):
        if store.is_remote(p):
            f = p if p.endswith(".jsonl") else store.join(p, RESULTS_FILE)
            if not store.file_exists(f):
                raise ResultsError(
                    f"{p}: " + ("no such results file" if f == p else f"no {RESULTS_FILE} there")
                )
            files.append(f)
            continue
        q = Path(p)
        if q.is_dir():
            own = q / RESULTS_FILE
            found = [own] if own.is_file() else sorted(q.rglob(RESULTS_FILE))
            if not found:
                raise ResultsError(f"{q}: no {RESULTS_FILE} in this directory or below it")
            files.extend(str(f) for f in found)
        elif q.is_file():
            files.append(str(q))
        else:
            raise ResultsError(f"{q}: no such results file or directory")
    seen: set[str] = set()
    key = lambda f: f if store.is_remote(f) else str(Path(f).resolve())  # noqa: E731
    return [f for f in files if not (key(f) in seen or seen.add(key(f)))]


def recipe_digest(rec: RunRecord) -> str:
    """The digest of what defines a record apart from fraction, seed and protocol (its identity,
    else an older record's fields)."""
    body = {k: v for k, v in rec.identity.items() if k not in NOT_RECIPE} or {
        "model": rec.model,
        "config": rec.get("config"),
        "cube": (rec.cube or {}).get("checksum"),
        "random_init": _random_init(rec),
        "weights": (rec.weights or {}).get("sha256"),
    }
    return content_hash(body, 12)


def _random_init(rec: RunRecord) -> bool:
    w = rec.weights or {}
    return bool(w.get("random_init") and w.get("pretrained"))


def parse_record(d: Any, where: str, family_key: FamilyKey | None = None) -> Run:
    """A record of any version, validated and migrated (cryocube/record.py), as a report row."""
    try:
        return as_run(RunRecord.from_dict(d, where), where, family_key)
    except RecordError as e:
        raise ResultsError(str(e)) from None


def as_run(rec: RunRecord, where: str, family_key: FamilyKey | None = None) -> Run:
    """A validated record as the report's row: the checks are the record's, none repeated here."""
    status, error, primary = rec.status, rec.error, str(rec.primary_metric)
    if (
        status == "ok"
        and _num(rec.metrics.get(primary)) is None
        and not (primary == "Q" and "Q" in rec.metrics)
    ):
        # (an embedding run's Q may be NaN by the NeuCo-Bench NaN rule: it is dropped from the
        # ranking, visibly)
        status, error = "error", error or f"record has status ok but no numeric metrics.{primary}"
    deviates = [str(x) for x in _dict(rec.get("deviations")).get("in_effect") or []]
    name = (
        model_display_name(rec.model, rec.model_name)
        + (RANDOM_INIT if _random_init(rec) else "")
        + (f"{DEVIATES}{', '.join(deviates)})" if deviates else "")
        + (TUNED if _dict(rec.get("sweep")).get("best") else "")
    )
    recipe = recipe_digest(rec)
    key = (rec.model, name, rec.dataset.lower(), rec.protocol, rec.fraction, rec.seed, recipe)
    error = None if error is None else str(error)
    return Run(rec, where, name, status, error, (*key, *(family_key(rec) if family_key else ())))


def _created_key(run: Run, order: int) -> tuple:
    try:
        t = datetime.fromisoformat(run.created.replace("Z", "+00:00"))
        stamp = t.timestamp() if t.tzinfo else t.replace(tzinfo=None).timestamp()
    except ValueError:
        stamp = float("-inf")
    return (stamp, order)  # same time (or none): the later line wins


def _records_not_in(f: str, table: list, family_key: FamilyKey | None) -> list[Run]:
    """The runs of f's folder whose records the table lacks (the records are the truth), warned."""
    if f.rstrip("/").rsplit("/", 1)[-1] != RESULTS_FILE:
        return []
    out = f.rstrip("/")[: -len(RESULTS_FILE)].rstrip("/") or "."
    if add := missing_records(out, [d for d in table if isinstance(d, dict)]):
        warnings.warn(
            f"{f}: {len(add)} run(s) with a record in {out}/runs/ but no line in the table read"
            " from their records (the next `cryocube evaluate` into this folder re-adds them)",
            stacklevel=3,
        )
    return [as_run(r, f"{out}/runs/{r.run_id}/record.json", family_key) for r in add]


def dedupe(runs: list[Run]) -> tuple[list[Run], list[Run]]:
    """The latest record (by `created`, then read order) per `Run.key`, and those it replaced."""
    latest: dict[tuple, tuple[tuple, Run]] = {}
    replaced: list[Run] = []
    for order, r in enumerate(runs):
        new = (_created_key(r, order), r)
        prev = latest.setdefault(r.key, new)
        if prev is not new:
            older, latest[r.key] = sorted((prev, new), key=lambda v: v[0])
            replaced.append(older[1])
    return [v[1] for v in latest.values()], replaced


def busiest(groups: dict[Any, list[Run]], order: dict[int, int]) -> Any:
    """The key of the group with most runs, then the newest run (`order`: id(run) -> read order)."""
    return max(
        groups,
        key=lambda k: (len(groups[k]), max(_created_key(r, order[id(r)]) for r in groups[k])),
    )


def one_recipe_per_cell(runs: list[Run]) -> tuple[list[Run], list[Run]]:
    """(runs shown, runs left out): where a model, dataset, protocol and fraction ran several
    recipes, the one with most runs (then newest) fills the cell; others are never seeds of it."""
    cells: dict[tuple, dict[str, list[Run]]] = {}
    for r in runs:
        cell = cells.setdefault((r.model, r.model_name, r.dataset, r.protocol, r.fraction), {})
        cell.setdefault(r.recipe_digest, []).append(r)
    order = {id(r): i for i, r in enumerate(runs)}
    shown = {id(r) for recipes in cells.values() for r in recipes[busiest(recipes, order)]}
    return [r for r in runs if id(r) in shown], [r for r in runs if id(r) not in shown]


def load_results(
    paths: str | Path | Iterable[str | Path], family_key: FamilyKey | None = None
) -> Results:
    """results.jsonl files (or folders holding them) as de-duplicated runs and failures (a torn
    last line is skipped with a warning, any other bad line is a ResultsError); `family_key`: a
    family's part of a run's key (the pages pass `Family.report_key`)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    sources, every = result_files(paths), []
    for f in sources:
        table = []
        try:
            for i, d in table_lines(f):
                every.append(parse_record(d, f"{f}:{i}", family_key))
                table.append(d)
        except OSError as e:
            raise ResultsError(f"{f}: cannot read ({e})") from None
        except RecordError as e:
            raise ResultsError(str(e)) from None
        every += _records_not_in(f, table, family_key)
    kept, replaced = dedupe([r for r in every if not r.is_trial])
    ranked = [r for r in kept if r.status == "ok" and r.primary_metric == LEADERBOARD_METRIC]
    ok, other = one_recipe_per_cell(ranked)
    by_family: dict[str, list[Run]] = {}
    for r in kept:
        if r.status == "ok" and r.primary_metric != LEADERBOARD_METRIC:
            by_family.setdefault(r.family, []).append(r)
    return Results(
        runs=ok,
        failures=[r for r in kept if r.status != "ok"],
        sources=sources,
        replaced=replaced,
        other_recipes=other,
        trials=[r for r in every if r.is_trial],
        by_family=by_family,
    )


def distinct_labels(groups: dict[Any, Run], base=lambda r: r.model_name) -> dict[Any, str]:
    """Display names for groups keyed by identity (a run each): the display name, and where groups
    share it, the model id, the recipe fields that differ (`epochs=3`), else the recipe digest."""
    by_name: dict[str, list] = {}
    for k, r in groups.items():
        by_name.setdefault(base(r), []).append(k)
    out: dict[Any, str] = {}
    for name, keys in by_name.items():
        if len(keys) == 1:
            out[keys[0]] = name
            continue
        models = {groups[k].model for k in keys}
        for k in keys:
            r = groups[k]
            parts = [r.model] if len(models) > 1 else []
            mates = [groups[j].recipe for j in keys if groups[j].model == r.model]
            if len(mates) > 1:
                fields = sorted({f for rc in mates for f in rc})
                differ = [f for f in fields if len({content_hash(m.get(f), 12) for m in mates}) > 1]
                parts.append(
                    ", ".join(f"{f}={r.recipe.get(f)}" for f in differ[:3])
                    or f"recipe {r.recipe_digest[:6]}"
                )
            out[k] = f"{name} ({'; '.join(parts)})"
    seen = Counter(out.values())
    return {k: f"{v} [{groups[k].recipe_digest[:6]}]" if seen[v] > 1 else v for k, v in out.items()}
