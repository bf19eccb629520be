"""`cryocube probe`: NeuCo-Bench scoring of an embedding matrix, one Dask task per (task, split);
the protocol and where it differs from NeuCo-Bench's evaluator: docs/embeddings.md."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import numpy as np

from ... import store as _store
from ...cluster.runtime import task_boundary, torch_task
from ...cube import as_text, cube_info, open_cube, sample_ids
from ...embeddings.embed import load_embeddings, read_sidecar
from ...embeddings.submission import pad_to, read_submission, strip_id
from ...errors import ProbeError
from ...labelfiles import read_label_folder
from ...mapping import check_field, rule
from ...progress import progress_bar
from ..class_labels import class_labels
from ..class_labels import slug as _slug
from .neuco import NeuCoError, shuffle_splits, standardize, summarize
from .probes import PROBES, TASK_PROBES, check_labels, fold_score, keywords

# per worker: the standardised matrix of an embedding store, read once
_X: dict[str, np.ndarray] = {}
LIST_FIELDS = ("degrees", "epsilons")  # svm fields that take a comma-separated list
TEXT_FIELDS = ("standardize", "fold_order", "base_estimator")  # the rest are numbers
DEFAULTS = {
    "linear": {"epochs": 10, "lr": 1e-3, "batch_size": 64},  # NeuCo-Bench's challenge probe
    "svm": keywords(TASK_PROBES["svm"]),  # its sample SVM config
}
FOLD_ORDER = {
    "id": "each task's rows ordered by id before the splits (the same folds whatever the label"
    " file's order)",
    "file": "each task's rows in its label file's order (or the cube's), as NeuCo-Bench draws its"
    " folds",
}
STANDARDIZE = {
    "all": "over every row of the embedding file (NeuCo-Bench's documentation)",
    "labelled": "over the rows labelled in some task (NeuCo-Bench's code)",
}
K_DEFAULT = 40  # NeuCo-Bench's shipped configs (k_folds: 40); the challenge FAQ's rule speaks of 10
_COUNT = {"lo": 1}  # an integer >= 1
_POS = {"lo": 0.0, "lo_open": True}  # a number > 0
_ALL_PROBES = (*PROBES, *TASK_PROBES)


@dataclass(frozen=True)
class ProbeParams:
    """The probes' own fields (their functions' keywords); a field not here takes any value."""

    NOUN: ClassVar[str] = "probe field"
    ERROR: ClassVar[type] = ProbeError

    epochs: int = rule(1, **_COUNT)
    batch_size: int = rule(1, **_COUNT)
    knn_k: int = rule(1, **_COUNT)  # the knn probe's k (--k is the number of splits)
    max_iter: int = rule(1, **_COUNT)
    n_iter: int = rule(1, **_COUNT)
    n_initial_points: int = rule(1, **_COUNT)
    lr: float = rule(1.0, **_POS)
    temperature: float = rule(1.0, **_POS)
    C: float = rule(1.0, **_POS)
    C_min: float = rule(1.0, **_POS)
    C_max: float = rule(1.0, **_POS)
    gamma_min: float = rule(1.0, **_POS)
    gamma_max: float = rule(1.0, **_POS)
    coef0_min: float = 0.0
    coef0_max: float = 0.0
    degrees: tuple[int, ...] = rule((1,), what="integers >= 1 separated by commas (2,3)", **_COUNT)
    epsilons: tuple[float, ...] = rule(
        (1.0,), what="numbers > 0 separated by commas (0.01,0.1)", **_POS
    )
    base_estimator: str = rule("GP", choices=("RF", "ET", "GP", "GBRT"))
    weight_decay: float = rule(0.0, lo=0.0)


@dataclass(frozen=True)
class ProbeRecipe:
    """The scoring protocol (defaults: NeuCo-Bench's challenge configuration), checked on init."""

    NOUN: ClassVar[str] = "probe field"
    ERROR: ClassVar[type] = ProbeError

    probe: str = rule(
        "linear",
        choices=_ALL_PROBES,
        msg=f"--probe must be one of {', '.join(_ALL_PROBES)}, got {{v!r}}",
    )
    k: int = rule(K_DEFAULT, msg="--k must be >= 1 (probes per task), got {v}", **_COUNT)
    test_size: float = rule(0.1, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    split_seed: int = 42
    seed: int = 42
    # pad to this width (a submission's 1024); None: as given
    dim: int | None = rule(None, **_COUNT)
    max_nan_fraction: float = rule(0.3, lo=0.0, hi=1.0)
    # the rows the global mean and std come from (STANDARDIZE)
    standardize: str = rule(
        "all",
        choices=tuple(STANDARDIZE),
        msg=f"--standardize must be one of {', '.join(STANDARDIZE)}, got {{v!r}}",
    )
    params: tuple[tuple[str, Any], ...] = ()  # the probe's own fields, over its DEFAULTS
    fold_order: str = rule("id", choices=tuple(FOLD_ORDER))  # the splits' row order (FOLD_ORDER)

    def __post_init__(self):
        """Refuses, in one sentence, a recipe the probe cannot run (svm without scikit-optimize)."""
        for f in dataclasses.fields(self):
            check_field(type(self), f, getattr(self, f.name), floats=False)
        if self.probe in TASK_PROBES and importlib.util.find_spec("skopt") is None:
            raise ProbeError(
                f"--probe {self.probe} (NeuCo-Bench's Bayesian-searched SVM) needs"
                " scikit-optimize: pip install 'cryocube[neuco]'"
            )
        shown = {"k": "knn_k"} if self.probe == "knn" else {}  # --k is the number of splits
        takes = [shown.get(n, n) for n in keywords({**PROBES, **TASK_PROBES}[self.probe])]
        rules = {f.name: f for f in dataclasses.fields(ProbeParams)}
        p = self.probe_params()
        for name, v in p.items():
            name = shown.get(name, name)
            if name not in takes:
                raise ProbeError(
                    f"the {self.probe} probe has no field {name!r} (it takes: {', '.join(takes)})"
                )
            if name in rules:
                check_field(ProbeParams, rules[name], v, floats=False)
        for lo, hi in (("C_min", "C_max"), ("gamma_min", "gamma_max"), ("coef0_min", "coef0_max")):
            if lo in p and hi in p and not p[lo] < p[hi]:
                raise ProbeError(f"probe field {lo} ({p[lo]:g}) must be below {hi} ({p[hi]:g})")

    def probe_params(self) -> dict[str, Any]:
        """The probe's own fields over NeuCo-Bench's defaults (DEFAULTS), as each fold gets them."""
        return {**DEFAULTS.get(self.probe, {}), **dict(self.params)}

    def as_dict(self) -> dict[str, Any]:
        """What the run id hashes; the default fold order left out, so older runs keep their ids."""
        own = dataclasses.asdict(self)
        del own["params"], own["fold_order"]
        fold = {} if self.fold_order == "id" else {"fold_order": self.fold_order}
        return own | self.probe_params() | fold

    def record(self) -> dict[str, Any]:
        """What a run record shows: the recipe with its fold order, even where it is the default."""
        return self.as_dict() | {"fold_order": self.fold_order}


def probe_recipe(
    probe: str = "linear",
    k: int = K_DEFAULT,
    overrides: dict | None = None,
    dim: int | None = None,
    standardize: str = "all",
) -> ProbeRecipe:
    """The recipe with `key=value` overrides: its fields or probe parameters (text numbers too)."""
    own = {"probe": probe, "k": k, "dim": dim, "standardize": standardize}
    params: dict[str, Any] = {}
    fields = {f.name for f in dataclasses.fields(ProbeRecipe)} - {"probe", "params"}
    for key, v in (overrides or {}).items():
        if key in TEXT_FIELDS:
            v = str(v)
        elif key in LIST_FIELDS:
            v = tuple(
                _number(key, x) for x in (v if isinstance(v, (list, tuple)) else str(v).split(","))
            )
        else:
            v = _number(key, v)
        if key in fields:
            own[key] = v
        else:
            params["k" if key == "knn_k" else key] = v
    return ProbeRecipe(**own, params=tuple(sorted(params.items())))


def _number(key: str, v: Any) -> Any:
    """YAML reads `1e-3` as a string: probe fields are numbers, said so in one sentence when not."""
    if not isinstance(v, str):
        return v
    for cast in (int, float):
        with contextlib.suppress(ValueError):
            return cast(v)
    raise ProbeError(f"probe field {key} must be a number, got {v!r}")


@dataclass(frozen=True)
class Task:
    name: str  # <name>__<cls|regr>
    kind: str
    labels: dict[str, float]  # id -> label (unlabelled ids left out)
    n_unlabelled: int = 0  # rows of a label file with an empty label: skipped, as NeuCo-Bench does


def tasks_from_labels(folder: str) -> list[Task]:
    """A NeuCo-Bench labels folder (`<task>__<cls|regr>.csv`: id,label), read strictly."""
    return [
        Task(f"{t}__{f.kind}", f.kind, f.labels, f.n_unlabelled)
        for t, f in read_label_folder(folder).items()
    ]


def _min_labelled(test_size: float, n_test: int) -> int:
    """The fewest labelled samples whose ShuffleSplit test part has `n_test` rows, a train row."""
    n = n_test + 1
    while math.ceil(test_size * n) < n_test or n - math.ceil(test_size * n) < 1:
        n += 1
    return n


def check_tasks(tasks: list[Task], recipe: ProbeRecipe, set_test_size="--set test_size={}") -> None:
    """Refuse, before any embedding, in one sentence naming the task, what NeuCo-Bench cannot score
    (docs/embeddings.md); the fix names the caller's way to another test size (`set_test_size`)."""
    for t in tasks:
        values = np.unique(np.fromiter(t.labels.values(), dtype=np.float64, count=len(t.labels)))
        n = len(t.labels)
        if values.size == 0:
            raise ProbeError(f"task {t.name} has no labelled sample")
        if values.size < 2:
            raise ProbeError(
                f"task {t.name} has the single value {values[0]:g} in all its {n} labelled samples:"
                " one class (or one value) cannot be probed; drop the task or label both classes"
            )
        if t.kind == "cls" and values.size > 2:
            raise ProbeError(
                f"classification task {t.name} has {values.size} distinct labels "
                f"({', '.join(f'{v:g}' for v in values[:5])}{', ...' if values.size > 5 else ''}); "
                "NeuCo-Bench scores binary F1, so a __cls task has two"
            )
        n_test = math.ceil(recipe.test_size * n)
        need = 2 if t.kind == "regr" else 1
        if n_test < need or n - n_test < 1:
            why = "leaves no train row per split"
            if n_test < need:
                why = f"leaves {n_test} test row per split, and R² needs at least 2"
            fix = f"label at least {_min_labelled(recipe.test_size, need)} samples"
            ts = math.ceil(100 * need / n) / 100
            if need <= math.ceil(ts * n) < n:
                fix += f", or {set_test_size.format(f'{ts:g}')}"
            raise ProbeError(
                f"task {t.name} has {n} labelled samples: test_size {recipe.test_size:g} {why}"
                f" ({fix})"
            )


def _one_vs_rest(task: str, labels: dict[str, float], classes: str) -> list[Task]:
    """A multi-class target as `<task>_<class>_vs_rest__cls` tasks: NeuCo-Bench scores binary F1."""
    names = classes.split("|") if classes else []
    out = []
    for c in sorted(set(labels.values())):
        name = names[int(c)] if c.is_integer() and 0 <= int(c) < len(names) else f"{c:g}"
        pos = {i: float(v == c) for i, v in labels.items()}
        if len(set(pos.values())) == 2:
            out.append(Task(f"{task}_{_slug(name)}_vs_rest__cls", "cls", pos))
    return out


def tasks_from_cube(url: str) -> list[Task]:
    """Image-level tasks of a cube: a sample cube's targets; a tile cube's class presence, share."""
    ds = open_cube(url)
    ids = [str(i) for i in sample_ids(ds, url)]
    if ds.attrs.get("kind") == "samples":
        target = np.asarray(ds["target"].values, dtype=np.float64)
        classes = [""] * target.shape[1]
        if "task_classes" in ds.coords:
            classes = as_text(ds["task_classes"].values)
        found = []
        kinds = zip(as_text(ds["task"].values), as_text(ds["task_type"].values))
        for j, (t, k) in enumerate(kinds):
            labels = {i: float(v) for i, v in zip(ids, target[:, j]) if np.isfinite(v)}
            multi = k == "cls" and len(set(labels.values())) > 2
            found += (
                _one_vs_rest(t, labels, classes[j]) if multi else [Task(f"{t}__{k}", k, labels)]
            )
        # a task the cube cannot serve (all NaN, e.g. no unwrapped phase) is no task
        return [t for t in found if t.labels]
    labelled, per_class = class_labels(ds)
    out = []
    for c in per_class:  # a class in every tile (or none) is no task
        for name, kind, vals, varies in (
            ("present", "cls", c.present, np.unique(c.present[labelled]).size == 2),
            ("fraction", "regr", c.fraction, labelled.any() and np.ptp(c.fraction[labelled]) > 0),
        ):
            if varies:
                labels = {i: v for i, v, ok in zip(ids, vals, labelled) if ok}
                out.append(Task(f"{c.slug}_{name}__{kind}", kind, labels))
    if not out:
        raise ProbeError(
            f"{url}: no class varies between tiles, so no image-level task can be derived"
        )
    return out


def align(
    ids: list[str], tasks: list[Task], fold_order: str = "id"
) -> list[tuple[Task, np.ndarray, np.ndarray]]:
    """(task, embedding rows, labels) per task, rows ordered by id (so the folds never depend on a
    file's order) or, `fold_order="file"`, as NeuCo-Bench: in the label file's (cube's) order."""
    pos = {strip_id(i): r for r, i in enumerate(ids)}
    out = []
    for t in tasks:
        missing = [i for i in t.labels if strip_id(i) not in pos]
        if missing:
            raise ProbeError(
                f"task {t.name}: {len(missing)} labelled ids have no embedding, e.g. {missing[0]!r}"
            )
        keys = sorted(t.labels, key=strip_id) if fold_order == "id" else list(t.labels)
        rows = np.array([pos[strip_id(i)] for i in keys], dtype=np.int64)
        out.append((t, rows, np.array([t.labels[i] for i in keys], dtype=np.float64)))
    return out


def tasks_digest(tasks: list[Task]) -> str:
    """The tasks' names and labels, order-free: in a probe run's id and its `label_set`."""
    h = hashlib.sha256()
    for t in sorted(tasks, key=lambda t: t.name):
        h.update(t.name.encode())
        for i, v in sorted(t.labels.items()):
            h.update(f"{i}={v!r};".encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class FoldTask:
    # embedding store the worker reads (None: the matrix comes as the task's second argument)
    url: str | None
    digest: str  # of the embedding matrix (worker cache key)
    task: str
    kind: str
    rows: np.ndarray
    y: np.ndarray
    fold: int
    train: np.ndarray  # positions in rows
    test: np.ndarray
    recipe: ProbeRecipe
    # rows the standardisation's mean and std come from (None: all)
    stats_rows: np.ndarray | None = None
    # a task-level probe (svm): every (train, test) split of the task, scored in one task
    splits: tuple = ()


def stats_rows(aligned, recipe: ProbeRecipe) -> np.ndarray | None:
    """The rows `standardize: labelled` takes its mean and std from: those labelled in some task."""
    rows = [r for _, r, _ in aligned] or [np.zeros(0, np.int64)]
    return None if recipe.standardize == "all" else np.unique(np.concatenate(rows))


def standardized(X: np.ndarray, dim: int | None, rows: np.ndarray | None = None) -> np.ndarray:
    """NeuCo-Bench's input: zero-padded to `dim`, NaN -> 0, one global scalar standardisation."""
    return standardize(pad_to(X, dim) if dim else X, rows)


def standardized_matrix(X: np.ndarray, ids: list[str], tasks: list[Task], recipe: ProbeRecipe):
    """(aligned tasks, the standardised matrix every fold reads, its digest: their cache key)."""
    aligned = align(ids, tasks, recipe.fold_order)
    Xs = standardized(X, recipe.dim, stats_rows(aligned, recipe))
    return aligned, Xs, hashlib.sha256(Xs.tobytes()).hexdigest()[:16]


def _matrix(t: FoldTask) -> np.ndarray:
    key = t.digest
    if t.stats_rows is not None:
        key += f"-{hashlib.sha256(t.stats_rows.tobytes()).hexdigest()[:16]}"
    X = _X.get(key)
    if X is None:
        _, E, _, _ = load_embeddings(t.url)
        _X.clear()
        X = _X[key] = standardized(E, t.recipe.dim, t.stats_rows)
    return X


@task_boundary
def probe_fold(t: FoldTask, X: np.ndarray | None = None) -> dict[str, list]:
    """One probe on one split of one task -> {task: [(fold, score)]} (the reduce merges these)."""
    r = t.recipe
    with torch_task(1):  # a linear probe is tiny: one thread each, many tasks side by side
        X = _matrix(t) if X is None else X
        if t.splits:  # the SVM's search spans the task's splits: one score per split
            ys = check_labels(t.y, t.kind, t.task)
            got = TASK_PROBES[r.probe](
                X[t.rows], ys, t.kind, list(t.splits), seed=r.seed, **r.probe_params()
            )
            return {t.task: list(enumerate(got))}
        split = (X[t.rows], t.y, t.kind, t.train, t.test, r.probe, r.seed + t.fold)
        s = fold_score(*split, task=t.task, **r.probe_params())
    return {t.task: [(t.fold, float(s))]}


def merge(a: dict, b: dict) -> dict:
    """The probe runs' reduce: fold scores concatenated per task (`task_scores` sorts them)."""
    return {k: [*a.get(k, ()), *b.get(k, ())] for k in a | b}


def fold_tasks(aligned, recipe: ProbeRecipe, url: str | None, digest: str) -> list[FoldTask]:
    """One FoldTask per (task, split), or per task for the svm; `url` None: the matrix beside."""
    srows = stats_rows(aligned, recipe)
    out = []
    for task, rows, y in aligned:
        try:
            splits = shuffle_splits(
                rows.size, recipe.k, test_size=recipe.test_size, seed=recipe.split_seed
            )
        except NeuCoError as e:
            raise ProbeError(f"task {task.name}: {e}") from None
        one = (url, digest, task.name, task.kind, rows, y)
        if recipe.probe in TASK_PROBES:  # one task scores every split
            e = np.zeros(0, np.int64)
            out.append(FoldTask(*one, 0, e, e, recipe, srows, tuple(splits)))
        else:
            out += [FoldTask(*one, f, tr, te, recipe, srows) for f, (tr, te) in enumerate(splits)]
    return out


def task_scores(total: dict[str, list]) -> dict[str, list[float]]:
    """Each task's scores in fold order, whatever order the reduce merged them in."""
    return {t: [s for _, s in sorted(v)] for t, v in sorted(total.items())}


def finish_scores(scores: dict[str, list[float]], recipe: ProbeRecipe) -> dict[str, Any]:
    """NeuCo-Bench's summary with the challenge's rule: too many failed probes make Q NaN."""
    summary = summarize(scores, recipe.max_nan_fraction)
    for t in summary["tasks_failing_nan_rule"]:
        summary["task_q_scores"][t] = math.nan
    if summary["tasks_failing_nan_rule"]:
        summary["overall_q_score"] = math.nan
    return summary


@dataclass
class ProbeResult:
    summary: dict
    record: dict
    out: str
    scores: dict[str, list[float]] = field(default_factory=dict)


def run_probes(
    X: np.ndarray,
    ids: list[str],
    tasks: list[Task],
    recipe: ProbeRecipe,
    progress: bool = True,
) -> dict[str, list[float]]:
    """k probes per task in this process; on a cluster the engine's scheduler scores probe runs."""
    return task_scores(score_here(*standardized_matrix(X, ids, tasks, recipe), recipe, progress))


def score_here(aligned, Xs: np.ndarray, digest: str, recipe: ProbeRecipe, progress: bool) -> dict:
    """Every fold task of a standardised matrix in this process -> the reduced total."""
    folds = fold_tasks(aligned, recipe, None, digest)
    total: dict = {}
    with progress_bar(f"probe ({recipe.probe})", len(folds), progress) as bar:
        for f in folds:
            total = merge(total, probe_fold(f, Xs))
            bar.advance(1)
    return total


def same_cube(embeddings: str, prov: dict, cube_url: str) -> None:
    """Embeddings scored on a cube's tasks come from that cube (its checksum): ids alone match."""
    made = (prov.get("cube") or {}).get("checksum")
    have = cube_info(cube_url).checksum
    if made and made != have:
        raise ProbeError(
            f"{embeddings} was embedded from the cube {prov['cube'].get('url')} (checksum"
            f" {made[:16]}), not from {cube_url} (checksum {have[:16]}); probe it with the tasks of"
            " the cube it was made from"
        )


def read_embedding_input(path: str, dim: int | None) -> tuple[list[str], np.ndarray, dict]:
    """A submission CSV (values all finite, NeuCo-Bench reads others as 0) or an embedding store ->
    (ids, X, provenance)."""
    if path.rstrip("/").endswith(".csv"):
        ids, X, notes = read_submission(path, None, dim, strict=dim is not None, strict_values=True)
        prov = {"source": path, **read_sidecar(path), "format": "csv"}
        return ids, X, prov | ({"notes": notes} if notes else {})
    if not _store.exists(path):
        raise ProbeError(f"{path}: no such embedding store or submission CSV")
    ids, X, _, attrs = load_embeddings(path)
    bad = ~np.isfinite(X)
    if bad.any():
        r, c = map(int, np.argwhere(bad)[0])
        raise ProbeError(
            f"{path}: the embedding of sample {ids[r]!r} has the value {X[r, c]} in dimension {c}"
        )
    return ids, X, {"format": "zarr", **attrs}


def differences(recipe: ProbeRecipe, tasks: Sequence[Task] = ()) -> list[str]:
    """What this run does differently from NeuCo-Bench's released evaluator (record, results)."""
    out = [
        f"standardisation {recipe.standardize}: mean and std {STANDARDIZE[recipe.standardize]}",
        "embedding and label values that are not finite numbers are refused (NeuCo-Bench:"
        " embeddings 0)",
        "a probe without a finite score counts as failed; more than"
        f" {recipe.max_nan_fraction:.0%} failed probes make a task's Q NaN (NeuCo-Bench"
        " averages what it has)",
    ]
    ovr = ", ".join(sorted(t.name for t in tasks if t.name.endswith("_vs_rest__cls")))
    where = {  # the differences a setting makes: text -> whether this run has it
        f"probe {recipe.probe} is not NeuCo-Bench's (its probes: linear; svm with a Bayesian"
        " search)": recipe.probe not in ("linear", "svm"),
        f"fold order id: {FOLD_ORDER['id']} (NeuCo-Bench: the label file's order;"
        " fold_order=file)": recipe.fold_order == "id",
        f"splits: test_size {recipe.test_size:g}, seed {recipe.split_seed} (NeuCo-Bench:"
        " 0.1, 42)": recipe.test_size != 0.1 or recipe.split_seed != 42,
        f"multi-class targets probed as one-vs-rest binary tasks ({ovr}):"
        " NeuCo-Bench has binary classification only": bool(ovr),
    }
    return out + [text for text, applies in where.items() if applies]


@dataclass
class ProbeInputs:
    """What `probe` scores, read and checked before any cluster starts."""

    ids: list[str]
    X: np.ndarray
    prov: dict
    tasks: list[Task]


def load_probe_inputs(
    embeddings: str, recipe: ProbeRecipe, labels: str | None = None, tasks_from: str | None = None
) -> ProbeInputs:
    """The vectors and tasks read strictly and checked: every user error before a cluster."""
    if (labels is None) == (tasks_from is None):
        raise ProbeError("probe needs exactly one of --labels DIR and --tasks-from CUBE")
    tasks = tasks_from_labels(labels) if labels else tasks_from_cube(tasks_from)
    check_tasks(tasks, recipe)
    ids, X, prov = read_embedding_input(embeddings, recipe.dim)
    if tasks_from:
        same_cube(embeddings, prov, tasks_from)
    align(ids, tasks, recipe.fold_order)  # every labelled id has a vector
    return ProbeInputs(ids, X, prov, tasks)
