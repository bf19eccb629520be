"""`tune`: hyper-parameter studies (Optuna) whose trials are ordinary engine runs.

A trial is a run with its params as recipe overrides (`RunSpec.overrides`), so it has its own
content hash, record and cache like any run. Trials are asked from the study a batch at a time and
the batch goes through one `evaluate` call: trials that differ only in decoder-side values share one
feature extraction and, where the family can, one pass over the features (K decoders per fit task).
The objective is the best validation value of the family's primary metric, the value whose state the
engine keeps and tests; test metrics are recorded but never read for selection.

Pruning reads the validation curve the engine records. The engine trains a run in one task, so a
pruned study runs in rounds (successive halving without resuming): each batch first trains at a
rung of 1/`ETA` of the epochs (a complete, shorter schedule), its curve goes to the pruner as
intermediate values (step = epoch), and only the trials the pruner keeps train at full length.

The study lives in a journal file in the results folder (through `DaskStorage` on the scheduler when
a client is used), so a killed client or scheduler loses nothing: a rerun loads the study, fails the
trials left RUNNING and enqueues their params again (their runs, if they finished, are cache hits),
and asks only for the trials still missing. One tune process per study at a time.

Every trial's record carries `sweep: {study, trial, params, state, value, ...}`; the best trial's
run is planned again from its params (exactly what `evaluate --set` plans), tested, and appended
with `sweep.best: true` together with the default-recipe baseline. The default is one of the
trials when it lies in the space (enqueued first; grid studies reach it as a grid point): its run is
the baseline's run (same recipe, same content hash), so a study of N trials trains N decoders, not
N + 1, and `sweep.baseline_trial` names that trial. A default outside the space is a separate run.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import yaml

from .. import store as _store
from ..catalog import protocol as protocol_spec
from ..cluster.client import get_client
from ..errors import FieldError, TuneError
from ..families import PlanContext, PlannedRun, RunSpec, get
from ..families.base import derive_seed
from ..families.recipes import load_recipe
from ..mapping import from_mapping
from ..recipe import RecipeError, parse_overrides, read_config
from .evaluate import cluster_context, evaluate, log_hint
from .plan import plan_runs
from .records import clean, load_record, read_results, write_record

ETA = 3  # rung = epochs // ETA; also Hyperband's reduction factor
JOURNAL = "study.journal"
SAMPLERS = ("tpe", "grid", "random")
PRUNERS = ("median", "hyperband", "none")


# -- the search space
# --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # float | int | choice
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    choices: tuple = ()

    def suggest(self, trial) -> Any:
        """This trial's value from Optuna by kind: categorical, int or float (log-scaled when the
        range says so)."""
        if self.kind == "choice":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.name, float(self.low), float(self.high), log=self.log)

    def contains(self, v: Any) -> bool:
        """Whether `v` (a recipe's value) is one this parameter can suggest: the default recipe is a
        trial only then."""
        if self.kind == "choice":
            return v in self.choices
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        return self.low <= v <= self.high and (self.kind != "int" or float(v).is_integer())

    def describe(self) -> str:
        """The parameter as --space text; it enters the study name's digest, so changing this text
        starts new studies."""
        if self.kind == "choice":
            return f"{self.name}={','.join(map(str, self.choices))}"
        return f"{self.name}={self.low:g}:{self.high:g}{':log' if self.log else ''}"


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def _value(v: Any, like: Any) -> Any:
    """A choice as the field takes it (YAML reads 1e-4 as a string)."""
    if isinstance(v, str) and isinstance(like, (int, float)) and not isinstance(like, bool):
        try:
            return _number(v)
        except ValueError:
            return v
    return v


@dataclass(frozen=True)
class SpaceEntry:
    """A `space:` entry written as a mapping: {low, high[, log]} or {choices}."""

    NOUN: ClassVar[str] = "key"
    ERROR: ClassVar[type] = RecipeError

    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    choices: tuple[Any, ...] | None = None

    def __post_init__(self):
        if self.choices is None and (self.low is None or self.high is None):
            raise FieldError("a mapping needs low/high (and log) or choices")

    def text(self) -> str | tuple:
        """The same entry as --space writes it."""
        if self.choices is not None:
            return self.choices
        return f"{self.low}:{self.high}{':log' if self.log else ''}"


def _range(name: str, spec: str, like: Any) -> Param:
    """`low:high[:log]`: int when both ends and the field are, else float."""
    parts = [s.strip() for s in spec.split(":")]
    if len(parts) not in (2, 3) or parts[2:] not in ([], ["log"]):
        raise RecipeError(f"--space {name}={spec}: a range is low:high or low:high:log")
    if not isinstance(like, (int, float)) or isinstance(like, bool):
        raise RecipeError(
            f"--space {name}={spec}: {name} is not numeric; list its values (a,b,c) instead"
        )
    try:
        lo, hi = _number(parts[0]), _number(parts[1])
    except ValueError:
        raise RecipeError(f"--space {name}={spec}: the range ends must be numbers") from None
    if not lo < hi:
        raise RecipeError(f"--space {name}={spec}: the range needs low < high")
    if len(parts) == 3 and lo <= 0:
        raise RecipeError(f"--space {name}={spec}: a log range needs low > 0")
    integer = all(isinstance(x, int) for x in (lo, hi, like))
    return Param(name, "int" if integer else "float", lo, hi, log=len(parts) == 3)


def _parse_one(name: str, spec: Any, recipe) -> Param:
    """One parameter of the space, checked against the recipe: a field that changes results, with
    every end and choice a value the field takes."""
    if name not in recipe.fields():
        raise RecipeError(
            f"--space {name}: not a recipe field (known: {', '.join(sorted(recipe.fields()))})"
        )
    if name in recipe.execution_fields():
        raise RecipeError(
            f"--space {name}: {name} does not change a run's result (an execution field); nothing"
            " to tune"
        )
    like = getattr(recipe, name)
    if isinstance(spec, dict):
        spec = from_mapping(SpaceEntry, spec, f"--space {name}", floats=False).text()
    if isinstance(spec, str) and ":" in spec:
        p = _range(name, spec, like)
    else:
        values = (
            spec
            if isinstance(spec, (list, tuple))
            else [yaml.safe_load(v) for v in str(spec).split(",") if v.strip()]
        )
        p = Param(name, "choice", choices=tuple(_value(v, like) for v in values))
        if not p.choices:
            raise RecipeError(f"--space {name}: no values given")
    for v in p.choices or (p.low, p.high):  # every end and choice must be a value the recipe takes
        try:
            load_recipe(overrides={name: v}, base=recipe)
        except RecipeError as e:
            raise RecipeError(f"--space {p.describe()}: {e}") from None
    return p


def parse_space(items: list[str] | None, yaml_space: dict | None, recipe) -> tuple[Param, ...]:
    """`name=low:high[:log]` (float, or int when both ends and the field are) or `name=a,b,c`; a
    YAML `space:` maps names to the same strings, to lists, or to {low, high, log}. Checked against
    the recipe.
    """
    specs: dict[str, Any] = {}
    if yaml_space is not None:
        if not isinstance(yaml_space, dict):
            raise RecipeError(
                "space: must map recipe fields to ranges (lr: 1e-5:1e-2:log) or lists of values"
            )
        specs.update(yaml_space)
    for item in items or []:
        if "=" not in item:
            raise RecipeError(f"--space {item!r}: expected name=low:high[:log] or name=a,b,c")
        k, v = item.split("=", 1)
        specs[k.strip()] = v.strip()
    if not specs:
        raise RecipeError(
            "tune needs a search space: --space lr=1e-5:1e-2:log (or a space: section in --config)"
        )
    return tuple(_parse_one(k, v, recipe) for k, v in specs.items())


def load_tune_config(path: str | None, sets: list[str]):
    """(recipe, the YAML `space:` section) from --config and --set."""

    data = dict(read_config(path)) if path else {}
    space = data.pop("space", None)
    fields = data.get("train", data)
    return load_recipe(None, {**fields, **parse_overrides(sets)}), space


# -- studies
# ------------------------------------------------------------------------------------------


@dataclass
class StudyResult:
    study: str
    best: dict | None = None  # the best trial's record (sweep.best)
    baseline: dict | None = None  # the default recipe's record
    baseline_trial: int | None = (
        None  # the trial that ran the default recipe (None: a separate run)
    )
    trials: list[dict] = field(default_factory=list)  # the latest record of each trial
    asked: int = 0  # trials asked by this call (a resumed study asks only the missing ones)


def _optuna():
    try:
        import optuna
    except ImportError:
        raise TuneError(
            "cryocube tune needs optuna and optuna-integration: pip install 'optuna>=4'"
            " 'optuna-integration>=4'"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def open_storage(out: str, client=None):
    """The study journal in `out` (local), served from the scheduler through DaskStorage when a
    client is given."""
    optuna = _optuna()
    from optuna.storages.journal import JournalFileBackend

    if _store.is_remote(out):
        raise TuneError(
            f"tune keeps its study journal in --out, which must be a local folder (got {out})"
        )
    Path(out).mkdir(parents=True, exist_ok=True)
    path = str(Path(out).resolve() / JOURNAL)
    storage = optuna.storages.JournalStorage(JournalFileBackend(path))
    if client is None:
        return storage
    from optuna_integration import DaskStorage

    # "DaskStorage is experimental": said once per study, to every user
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return DaskStorage(
            storage=storage,
            name=f"cryocube-{hashlib.sha256(path.encode()).hexdigest()[:12]}",
            client=client,
        )


def make_sampler(name: str, space: tuple[Param, ...], seed: int):
    """The --sampler by name, seeded; grid takes listed values only, and never calls `study.stop()`
    at the grid's end (the ask loop counts)."""
    optuna = _optuna()
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        ranged = [p.name for p in space if p.kind != "choice"]
        if ranged:
            raise TuneError(
                f"--sampler grid needs listed values (name=a,b,c); {', '.join(ranged)} are ranges"
            )

        class Grid(optuna.samplers.GridSampler):
            def after_trial(self, study, trial, state, values) -> None:
                """No `study.stop()` at the end of the grid (it only works inside `optimize`); the
                loop counts."""

        return Grid({p.name: list(p.choices) for p in space}, seed=seed)
    raise TuneError(f"--sampler must be one of {', '.join(SAMPLERS)}, got {name!r}")


def make_pruner(name: str, trials: int):
    """The --pruner by name; median never prunes on step 0 (the untrained decoder), and hyperband's
    reduction factor is ETA, the rungs' ratio."""
    optuna = _optuna()
    if name == "median":  # step 0 is the untrained decoder: never prune on it
        return optuna.pruners.MedianPruner(
            n_startup_trials=max(1, min(5, trials // 4)), n_warmup_steps=1
        )
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, reduction_factor=ETA)
    if name == "none":
        return optuna.pruners.NopPruner()
    raise TuneError(f"--pruner must be one of {', '.join(PRUNERS)}, got {name!r}")


def refuse_untunable(protocols) -> None:
    """A study selects on a validation curve: a protocol whose family records none is refused, with
    its reason, before any cube is read or cluster started (every trial would otherwise fail without
    one)."""
    for name in protocols:
        fam = get(protocol_spec(name).family)
        if fam.not_tunable:
            raise TuneError(f"tune --protocol {name}: {fam.not_tunable}")


def objective(rec: dict, metric: str, higher: bool) -> float | None:
    """The best validation value of the primary metric (the state the engine keeps and tests)."""
    vals = [
        float(p[metric])
        for p in rec.get("val_curve") or []
        if isinstance(p.get(metric), (int, float))
    ]
    vals = [v for v in vals if math.isfinite(v)]
    return (max(vals) if higher else min(vals)) if vals else None


def study_name(
    base: PlannedRun, space: tuple[Param, ...], sampler: str, pruner: str, seed: int
) -> str:
    """Same command, same study (a rerun resumes it); another space, sampler or recipe, another
    study."""
    key = json.dumps(
        {
            "run": base.run_id,
            "space": [p.describe() for p in space],
            "sampler": sampler,
            "pruner": pruner,
            "seed": seed,
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    return f"{base.spec.model}-{base.dataset}-{base.spec.protocol}-{digest}"


@dataclass
class StudyOptions:
    """What every study of one `tune` call shares."""

    space: tuple[Param, ...]
    out: str
    recipe: Any
    trials: int
    sampler: str
    pruner: str
    batch: int
    client: Any
    progress: bool
    weights_dir: str | None
    allow_random_weights: bool
    seed: int
    ctx: PlanContext
    cubes: dict = field(default_factory=dict)


class _Study:
    """One (model, cube, protocol) study: the ask/evaluate/tell loop over the engine."""

    def __init__(self, base: RunSpec, o: StudyOptions):
        self.optuna = _optuna()
        space, out, recipe, client = o.space, o.out, o.recipe, o.client
        sampler, pruner, seed, trials = o.sampler, o.pruner, o.seed, o.trials
        self.base, self.space, self.out, self.recipe = base, space, out, recipe
        self.trials, self.batch, self.client, self.progress = trials, o.batch, client, o.progress
        self.kw = {"weights_dir": o.weights_dir, "allow_random_weights": o.allow_random_weights}
        self.ctx, self.cubes = o.ctx, o.cubes
        self.family = get(protocol_spec(base.protocol).family)
        self.metric = self.family.primary_metric
        self.pruning = pruner != "none"
        self.base_plan = self._plan(base)
        self.name = study_name(self.base_plan, space, sampler, pruner, seed)
        storage = open_storage(out, client)
        direction = "maximize" if self.family.higher_is_better else "minimize"
        # a resumed study is loaded, not re-created: create_study(load_if_exists) raises
        # DuplicatedStudyError on
        # the storage's side first, which a DaskStorage's scheduler logs as a traceback
        if self.name in {st.study_name for st in storage.get_all_studies()}:
            self.study = self.optuna.load_study(study_name=self.name, storage=storage)
        else:
            self.study = self.optuna.create_study(
                study_name=self.name, storage=storage, direction=direction
            )
        # the sampler's random stream continues where the journal stands: seeded by (seed, trials so
        # far), a resumed
        # study does not replay the stream of its first session (which repeated finished trials'
        # params)
        n = len(self.study.get_trials(deepcopy=False))
        self.study.sampler = make_sampler(
            sampler, space, seed if n == 0 else derive_seed("tune", seed, n) % 2**31
        )
        self.study.pruner = make_pruner(pruner, trials)
        # the default recipe as a trial, asked first: its run is the baseline's (one decoder fewer)
        base_recipe = recipe.updated(dict(base.overrides)) if base.overrides else recipe
        self.default = {p.name: getattr(base_recipe, p.name) for p in space}
        self.default_in_space = all(p.contains(self.default[p.name]) for p in space)
        if n == 0 and self.default_in_space and sampler != "grid":
            # (a grid reaches the default as one of its points; an enqueued trial would take a
            # grid slot without its grid id, and one point would go unvisited)
            self.study.enqueue_trial(self.default, user_attrs={"default": True})
        self.meta = {
            "sampler": sampler,
            "pruner": pruner,
            "space": [p.describe() for p in space],
            "metric": f"val_{self.metric}",
            "direction": self.study.direction.name.lower(),
        }

    def _plan(self, spec: RunSpec) -> PlannedRun:
        return plan_runs([spec], self.recipe, self.ctx, self.cubes)[0]

    def _spec(self, params: dict, epochs: int | None = None) -> RunSpec:
        over = (
            dict(self.base.overrides) | params | ({"epochs": epochs} if epochs is not None else {})
        )
        return replace(self.base, overrides=tuple(over.items()))

    @staticmethod
    def _claim(t, params: dict, state: str) -> dict:
        return {"number": t.number, "params": params[t.number], "state": state}

    def _sweep(
        self, number: int, params: dict, state: str, rec: dict | None = None, **more
    ) -> dict:
        value = objective(rec, self.metric, self.family.higher_is_better) if rec else None
        state = "failed" if rec is not None and rec.get("status") != "ok" else state
        return clean(
            {
                "study": self.name,
                "trial": number,
                "params": params,
                "state": state,
                "value": value,
                "epochs": (rec or {}).get("config", {}).get("epochs"),
                **self.meta,
                **more,
            }
        )

    def _run(self, claims: list[tuple[RunSpec, dict | None]]) -> list[dict]:
        """Evaluate runs in one call; each claim (spec, `_sweep` arguments, or None for a plain run)
        ends with a results.jsonl line of its own sweep. Returns each claim's record."""
        plans = [self._plan(s) for s, _ in claims]
        first: dict[str, dict | None] = {}
        for p, (_, c) in zip(plans, claims):
            first.setdefault(p.run_id, c)

        def extra(p: PlannedRun, rec: dict) -> dict:
            c = first.get(p.run_id)
            return {"sweep": self._sweep(rec=rec, **c)} if c else {}

        unique = list({p.run_id: p for p in plans}.values())
        evaluate(
            unique,
            self.out,
            self.recipe,
            client=self.client,
            progress=self.progress,
            extra=extra,
            **self.kw,
        )
        out = []
        for p, (_, c) in zip(plans, claims):
            rec = load_record(self.out, p.run_id)
            if rec is None:
                raise TuneError(f"{p.label}: the engine wrote no record{log_hint(self.out)}")
            rec = rec.to_dict()  # (a study's lines are the JSON written)
            want = self._sweep(rec=rec, **c) if c else None
            if rec.get("sweep") != want:  # a cache hit, or a run two claims share: its own line
                rec = self._append(rec, want)
            out.append(rec)
        return out

    def _append(self, rec: dict, sweep: dict | None) -> dict:
        """A new results.jsonl line of a run's record with this sweep (or none), stamped now."""
        base = {k: v for k, v in rec.items() if k not in ("sweep", "created")}
        return write_record(self.out, base | ({"sweep": sweep} if sweep else {}))

    def _mark(self, number: int, state: str) -> None:
        """Append a line with a new state for a trial's latest record (a crashed trial: failed)."""
        recs = [
            r
            for r in read_results(self.out)
            if (r.get("sweep") or {}).get("study") == self.name
            and r["sweep"].get("trial") == number
            and not r["sweep"].get("best")
        ]
        if recs:
            self._append(recs[-1], recs[-1]["sweep"] | {"state": state})

    def recover(self) -> None:
        """Trials left RUNNING by a killed process: failed, and their params asked again. A trial
        killed between `ask` and its last `suggest` never started a run: it is failed, and the
        sampler asks anew.
        """
        TS = self.optuna.trial.TrialState
        names = {p.name for p in self.space}
        for t in self.study.get_trials(deepcopy=False, states=(TS.RUNNING,)):
            self.study.tell(t.number, state=TS.FAIL)
            self._mark(t.number, "failed")
            if set(t.params) == names:
                self.study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})

    def finished(self) -> int:
        TS = self.optuna.trial.TrialState
        return sum(
            t.state in (TS.COMPLETE, TS.PRUNED)
            or (t.state == TS.FAIL and "run_error" in t.user_attrs)
            for t in self.study.get_trials(deepcopy=False)
        )

    def _fail(self, t, rec: dict) -> None:
        t.set_user_attr("run_error", str(rec.get("error"))[:500])
        self.study.tell(t, state=self.optuna.trial.TrialState.FAIL)

    def run(self) -> StudyResult:
        TS = self.optuna.trial.TrialState
        res = StudyResult(self.name)
        self.recover()
        cap = (
            math.prod(len(p.choices) for p in self.space)
            if self.meta["sampler"] == "grid"
            else None
        )
        # the default recipe: one of the trials when it lies in the space, else evaluated with
        # the first batch (shares its pass)
        baseline = [] if self.default_in_space else [(self.base, None)]
        while (left := min(self.trials, cap or self.trials) - self.finished()) > 0:
            asked = [self.study.ask() for _ in range(min(self.batch, left))]
            res.asked += len(asked)
            params = {t.number: {p.name: p.suggest(t) for p in self.space} for t in asked}
            full = asked
            if self.pruning:
                claims = []
                for t in asked:
                    epochs = int(params[t.number].get("epochs", self.recipe.epochs))
                    claims.append(
                        (
                            self._spec(params[t.number], max(1, epochs // ETA)),
                            self._claim(t, params, "rung"),
                        )
                    )
                full = []
                for t, rec in zip(asked, self._run(claims + baseline)):
                    if rec.get("status") != "ok":
                        self._fail(t, rec)
                        continue
                    if self._prune(t, rec):
                        self.study.tell(t, state=TS.PRUNED)
                        self._append(rec, self._sweep(t.number, params[t.number], "pruned", rec))
                    else:
                        full.append(t)
                baseline = []
            if full or baseline:
                recs = self._run(
                    [
                        (self._spec(params[t.number]), self._claim(t, params, "complete"))
                        for t in full
                    ]
                    + baseline
                )
                for t, rec in zip(full, recs):
                    v = (
                        objective(rec, self.metric, self.family.higher_is_better)
                        if rec.get("status") == "ok"
                        else None
                    )
                    if v is None:
                        self._fail(t, rec)
                    else:
                        self.study.tell(t, v)
                baseline = []
        return self._finish(res)

    def _default_trial(self) -> int | None:
        """The first completed trial that ran the default recipe (its params are the defaults), or
        None: then the baseline is trained on its own in `_finish`."""
        TS = self.optuna.trial.TrialState
        for t in self.study.get_trials(deepcopy=False, states=(TS.COMPLETE,)):
            if t.params == self.default:
                return t.number
        return None

    def _prune(self, t, rec: dict) -> bool:
        """Feed the rung's validation curve to the pruner point by point, as a training loop
        would."""
        for pt in rec.get("val_curve") or []:
            v = pt.get(self.metric)
            if isinstance(v, (int, float)) and math.isfinite(v):
                t.report(float(v), int(pt["epoch"]))
                if t.should_prune():
                    return True
        return False

    def _finish(self, res: StudyResult) -> StudyResult:
        TS = self.optuna.trial.TrialState
        done = self.study.get_trials(deepcopy=False, states=(TS.COMPLETE,))
        if not done:
            states = ", ".join(
                f"{len(self.study.get_trials(deepcopy=False, states=(s,)))} {s.name.lower()}"
                for s in (TS.PRUNED, TS.FAIL)
            )
            raise TuneError(f"study {self.name}: no trial completed ({states}){log_hint(self.out)}")
        best = self.study.best_trial
        importance: dict[str, float] = {}
        if len(done) >= 2:
            try:
                ev = self.optuna.importance.FanovaImportanceEvaluator(seed=0)
                importance = {
                    k: float(v)
                    for k, v in self.optuna.importance.get_param_importances(
                        self.study, evaluator=ev
                    ).items()
                }
            # e.g. every completed trial has the same params
            except (RuntimeError, ValueError) as e:
                warnings.warn(f"study {self.name}: no parameter importances ({e})", stacklevel=2)
        params = dict(best.params)
        base_id = self.base_plan.run_id
        n = {
            s.name.lower(): len(self.study.get_trials(deepcopy=False, states=(s,)))
            for s in (TS.COMPLETE, TS.PRUNED, TS.FAIL)
        }
        res.baseline_trial = self._default_trial()
        more = {
            "best": True,
            "importance": importance,
            "baseline_run_id": base_id,
            "baseline_trial": res.baseline_trial,
            "n_trials": n,
        }
        # the best trial's run, planned again from its params alone (what `evaluate --set` plans):
        # same code, split, seed; the baseline is a cache hit when the default trial completed
        claim = {"number": best.number, "params": params, "state": "complete", **more}
        res.best, res.baseline = self._run([(self._spec(params), claim), (self.base, None)])
        if res.best.get("status") != "ok":
            raise TuneError(
                f"study {self.name}: the best trial's retrain failed: {res.best.get('error')}"
            )
        latest: dict[int, dict] = {}
        for r in read_results(self.out):
            s = r.get("sweep") or {}
            if s.get("study") == self.name and not s.get("best"):
                latest[int(s["trial"])] = r
        res.trials = [latest[k] for k in sorted(latest)]
        return res


def tune(
    bases: list[RunSpec],
    space: tuple[Param, ...],
    out: str,
    recipe,
    *,
    trials: int,
    sampler: str = "tpe",
    pruner: str = "median",
    batch: int | None = None,
    client=None,
    progress: bool = True,
    weights_dir: str | None = None,
    allow_random_weights: bool = False,
    seed: int = 0,
) -> list[StudyResult]:
    """One study per base run (model x cube x protocol [x fraction]); returns each study's
    outcome."""
    if trials < 1:
        raise TuneError(f"--trials must be >= 1, got {trials}")
    refuse_untunable({b.protocol for b in bases})
    if batch is not None and batch < 1:
        raise TuneError(f"--batch must be >= 1, got {batch}")
    client = get_client(client)
    ctx = cluster_context(
        client, out, weights_dir=weights_dir, allow_random_weights=allow_random_weights
    )
    o = StudyOptions(
        space,
        out,
        recipe,
        trials,
        sampler,
        pruner,
        batch or min(trials, max(4, recipe.decoders_per_task)),
        client,
        progress,
        weights_dir,
        allow_random_weights,
        seed,
        ctx,
    )
    return [_Study(b, o).run() for b in bases]
