"""`tune`: hyper-parameter studies (Optuna) whose trials are ordinary, cached engine runs, a batch
of trials one `evaluate` call; selection reads validation curves only (docs/tuning.md)."""

from __future__ import annotations

import contextlib
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
from ..record import clean, load_record, read_results, write_record
from .evaluate import cluster_context, evaluate, log_hint
from .plan import plan_runs

ETA = 3  # rung = epochs // ETA; also Hyperband's reduction factor
JOURNAL = "study.journal"
SAMPLERS = ("tpe", "grid", "random")
PRUNERS = ("median", "hyperband", "none")


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # float | int | choice
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    choices: tuple = ()

    def suggest(self, trial) -> Any:
        """This trial's value from Optuna, by kind."""
        if self.kind == "choice":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.name, float(self.low), float(self.high), log=self.log)

    def contains(self, v: Any) -> bool:
        """Whether this parameter can suggest `v`: the default recipe is a trial only then."""
        if self.kind == "choice":
            return v in self.choices
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        return self.low <= v <= self.high and (self.kind != "int" or float(v).is_integer())

    def describe(self) -> str:
        """The parameter as --space text (it enters the study name's digest)."""
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
        with contextlib.suppress(ValueError):
            return _number(v)
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

    def bad(why: str) -> RecipeError:
        return RecipeError(f"--space {name}={spec}: {why}")

    parts = [s.strip() for s in spec.split(":")]
    if len(parts) not in (2, 3) or parts[2:] not in ([], ["log"]):
        raise bad("a range is low:high or low:high:log")
    if not isinstance(like, (int, float)) or isinstance(like, bool):
        raise bad(f"{name} is not numeric; list its values (a,b,c) instead")
    try:
        lo, hi = _number(parts[0]), _number(parts[1])
    except ValueError:
        raise bad("the range ends must be numbers") from None
    if not lo < hi:
        raise bad("the range needs low < high")
    if len(parts) == 3 and lo <= 0:
        raise bad("a log range needs low > 0")
    integer = all(isinstance(x, int) for x in (lo, hi, like))
    return Param(name, "int" if integer else "float", lo, hi, log=len(parts) == 3)


def _parse_one(name: str, spec: Any, recipe) -> Param:
    """One parameter, checked: a field that changes results, every end and choice a value of it."""
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
    for v in p.choices or (p.low, p.high):
        try:
            load_recipe(overrides={name: v}, base=recipe)
        except RecipeError as e:
            raise RecipeError(f"--space {p.describe()}: {e}") from None
    return p


def parse_space(items: list[str] | None, yaml_space: dict | None, recipe) -> tuple[Param, ...]:
    """`--space name=low:high[:log]` or `name=a,b,c`, and a YAML `space:` of the same strings,
    lists or {low, high, log}, checked against the recipe."""
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


@dataclass
class StudyResult:
    study: str
    best: dict | None = None  # the best trial's record (sweep.best)
    baseline: dict | None = None  # the default recipe's record
    baseline_trial: int | None = None  # the trial that ran it (None: a separate run)
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
    """The study journal in local `out`, served through DaskStorage when a client is given."""
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
        name = f"cryocube-{hashlib.sha256(path.encode()).hexdigest()[:12]}"
        return DaskStorage(storage=storage, name=name, client=client)


def make_sampler(name: str, space: tuple[Param, ...], seed: int):
    """The --sampler by name, seeded; grid takes listed values only."""
    optuna = _optuna()
    seeded = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler}
    if name in seeded:
        return seeded[name](seed=seed)
    if name == "grid":
        if ranged := [p.name for p in space if p.kind != "choice"]:
            raise TuneError(
                f"--sampler grid needs listed values (name=a,b,c); {', '.join(ranged)} are ranges"
            )

        class Grid(optuna.samplers.GridSampler):
            def after_trial(self, study, trial, state, values) -> None:
                """No `study.stop()` at the end (only works in `optimize`); the loop counts."""

        return Grid({p.name: list(p.choices) for p in space}, seed=seed)
    raise TuneError(f"--sampler must be one of {', '.join(SAMPLERS)}, got {name!r}")


def make_pruner(name: str, trials: int):
    """The --pruner by name; hyperband's reduction factor is ETA, the rungs' ratio."""
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
    """A protocol whose family records no validation curve (what a study selects on) is refused."""
    for name in protocols:
        fam = get(protocol_spec(name).family)
        if fam.not_tunable:
            raise TuneError(f"tune --protocol {name}: {fam.not_tunable}")


def objective(rec: dict, metric: str, higher: bool) -> float | None:
    """The best validation value of the primary metric (the state the engine keeps and tests)."""
    vals = [p.get(metric) for p in rec.get("val_curve") or []]
    vals = [float(v) for v in vals if isinstance(v, (int, float)) and math.isfinite(v)]
    return (max(vals) if higher else min(vals)) if vals else None


def study_name(
    base: PlannedRun, space: tuple[Param, ...], sampler: str, pruner: str, seed: int
) -> str:
    """Same command, same study (a rerun resumes it); other space, sampler or recipe: other one."""
    space_text = [p.describe() for p in space]
    key = {"run": base.run_id, "space": space_text, "sampler": sampler, "pruner": pruner}
    digest = hashlib.sha256(json.dumps(key | {"seed": seed}, sort_keys=True).encode())
    return f"{base.spec.model}-{base.dataset}-{base.spec.protocol}-{digest.hexdigest()[:8]}"


@dataclass
class StudyOptions:
    """What every study of one `tune` call shares (its keyword arguments, the context aside)."""

    space: tuple[Param, ...]
    out: str
    recipe: Any
    trials: int
    sampler: str = "tpe"
    pruner: str = "median"
    batch: int | None = None
    client: Any = None
    progress: bool = True
    seed: int = 0
    ctx: PlanContext | None = None
    cubes: dict = field(default_factory=dict)

    def __post_init__(self):
        for flag, v in (("--trials", self.trials), ("--batch", self.batch)):
            if v is not None and v < 1:
                raise TuneError(f"{flag} must be >= 1, got {v}")
        self.batch = self.batch or min(self.trials, max(4, self.recipe.decoders_per_task))


class _Study:
    """One (model, cube, protocol) study: the ask/evaluate/tell loop over the engine."""

    def __init__(self, base: RunSpec, o: StudyOptions):
        self.optuna, self.base, self.o = _optuna(), base, o
        self.states = self.optuna.trial.TrialState
        self.space, self.out, self.recipe = o.space, o.out, o.recipe
        self.family = get(protocol_spec(base.protocol).family)
        self.metric = self.family.primary_metric
        self.base_plan = self._plan(base)
        self.name = study_name(self.base_plan, o.space, o.sampler, o.pruner, o.seed)
        storage = open_storage(o.out, o.client)
        direction = "maximize" if self.family.higher_is_better else "minimize"
        # a resumed study is loaded, not re-created: create_study(load_if_exists) raises
        # DuplicatedStudyError on the storage's side first, which a DaskStorage's scheduler logs
        if self.name in {st.study_name for st in storage.get_all_studies()}:
            self.study = self.optuna.load_study(study_name=self.name, storage=storage)
        else:
            self.study = self.optuna.create_study(
                study_name=self.name, storage=storage, direction=direction
            )
        # seeded by (seed, trials so far): a resumed study does not replay its first session's
        # random stream (which repeated finished trials' params)
        n = len(self.study.get_trials(deepcopy=False))
        seed = o.seed if n == 0 else derive_seed("tune", o.seed, n) % 2**31
        self.study.sampler = make_sampler(o.sampler, o.space, seed)
        self.study.pruner = make_pruner(o.pruner, o.trials)
        # the default recipe as a trial, asked first: its run is the baseline's (one decoder fewer)
        base_recipe = o.recipe.updated(dict(base.overrides)) if base.overrides else o.recipe
        self.default = {p.name: getattr(base_recipe, p.name) for p in o.space}
        self.default_in_space = all(p.contains(self.default[p.name]) for p in o.space)
        if n == 0 and self.default_in_space and o.sampler != "grid":
            # (a grid reaches the default as one of its points; an enqueued trial would take a
            # grid slot without its grid id, and one point would go unvisited)
            self.study.enqueue_trial(self.default, user_attrs={"default": True})
        self.meta = {
            "sampler": o.sampler,
            "pruner": o.pruner,
            "space": [p.describe() for p in o.space],
            "metric": f"val_{self.metric}",
            "direction": self.study.direction.name.lower(),
        }

    def _plan(self, spec: RunSpec) -> PlannedRun:
        return plan_runs([spec], self.recipe, self.o.ctx, self.o.cubes)[0]

    def _spec(self, params: dict, epochs: int | None = None) -> RunSpec:
        over = dict(self.base.overrides) | params | ({} if epochs is None else {"epochs": epochs})
        return replace(self.base, overrides=tuple(over.items()))

    def _claim(self, t, params: dict, state: str, epochs: int | None = None) -> tuple:
        """(spec, `_sweep` arguments) of trial `t`'s run."""
        p = params[t.number]
        return self._spec(p, epochs), {"number": t.number, "params": p, "state": state}

    def _value(self, rec: dict) -> float | None:
        return objective(rec, self.metric, self.family.higher_is_better)

    def _sweep(
        self, number: int, params: dict, state: str, rec: dict | None = None, **more
    ) -> dict:
        state = "failed" if rec is not None and rec.get("status") != "ok" else state
        return clean(
            {
                "study": self.name,
                "trial": number,
                "params": params,
                "state": state,
                "value": self._value(rec) if rec else None,
                "epochs": (rec or {}).get("config", {}).get("epochs"),
                **self.meta,
                **more,
            }
        )

    def _run(self, claims: list[tuple[RunSpec, dict | None]]) -> list[dict]:
        """Each claim's record (spec, `_sweep` arguments or None), evaluated in one call, each
        ending with a results.jsonl line of its own sweep."""
        plans = [self._plan(s) for s, _ in claims]
        first: dict[str, dict | None] = {}
        for p, (_, c) in zip(plans, claims):
            first.setdefault(p.run_id, c)

        def extra(p: PlannedRun, rec: dict) -> dict:
            c = first.get(p.run_id)
            return {"sweep": self._sweep(rec=rec, **c)} if c else {}

        unique = list({p.run_id: p for p in plans}.values())
        o = self.o
        evaluate(unique, o.out, o.recipe, client=o.client, progress=o.progress, extra=extra)
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

    def _latest(self) -> dict[int, dict]:
        """Each trial's latest record line (the best trial's retrain aside)."""
        latest = {}
        for r in read_results(self.out):
            s = r.get("sweep") or {}
            if s.get("study") == self.name and not s.get("best"):
                latest[int(s["trial"])] = r
        return latest

    def recover(self) -> None:
        """Trials left RUNNING by a killed process: failed, and their params asked again (a trial
        killed before its last `suggest` never started a run: the sampler asks anew)."""
        names = {p.name for p in self.space}
        for t in self.study.get_trials(deepcopy=False, states=(self.states.RUNNING,)):
            self.study.tell(t.number, state=self.states.FAIL)
            if rec := self._latest().get(t.number):  # its latest line, now failed
                self._append(rec, rec["sweep"] | {"state": "failed"})
            if set(t.params) == names:
                self.study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})

    def finished(self) -> int:
        """Trials that count towards --trials: completed, pruned, or failed by their run."""
        states = self.states
        return sum(
            t.state in (states.COMPLETE, states.PRUNED)
            or (t.state == states.FAIL and "run_error" in t.user_attrs)
            for t in self.study.get_trials(deepcopy=False)
        )

    def _fail(self, t, rec: dict) -> None:
        t.set_user_attr("run_error", str(rec.get("error"))[:500])
        self.study.tell(t, state=self.states.FAIL)

    def run(self) -> StudyResult:
        """Asks, evaluates and tells batches until the study holds --trials finished trials."""
        res = StudyResult(self.name)
        self.recover()
        grid = self.meta["sampler"] == "grid"
        cap = math.prod(len(p.choices) for p in self.space) if grid else self.o.trials
        # the default recipe outside the space: evaluated with the first batch (shares its pass)
        baseline = [] if self.default_in_space else [(self.base, None)]
        while (left := min(self.o.trials, cap) - self.finished()) > 0:
            asked = [self.study.ask() for _ in range(min(self.o.batch, left))]
            res.asked += len(asked)
            params = {t.number: {p.name: p.suggest(t) for p in self.space} for t in asked}
            full = asked
            if self.o.pruner != "none":
                rung = [self._claim(t, params, "rung", self._rung(params[t.number])) for t in asked]
                full = []
                for t, rec in zip(asked, self._run(rung + baseline)):
                    if rec.get("status") != "ok":
                        self._fail(t, rec)
                    elif self._prune(t, rec):
                        self.study.tell(t, state=self.states.PRUNED)
                        self._append(rec, self._sweep(t.number, params[t.number], "pruned", rec))
                    else:
                        full.append(t)
                baseline = []
            if full or baseline:
                claims = [self._claim(t, params, "complete") for t in full]
                for t, rec in zip(full, self._run(claims + baseline)):
                    v = self._value(rec) if rec.get("status") == "ok" else None
                    if v is None:
                        self._fail(t, rec)
                    else:
                        self.study.tell(t, v)
                baseline = []
        return self._finish(res)

    def _rung(self, params: dict) -> int:
        """A pruned study's first round: 1/ETA of the trial's epochs."""
        return max(1, int(params.get("epochs", self.recipe.epochs)) // ETA)

    def _prune(self, t, rec: dict) -> bool:
        """Feed the rung's validation curve to the pruner point by point, as training would."""
        for pt in rec.get("val_curve") or []:
            v = pt.get(self.metric)
            if isinstance(v, (int, float)) and math.isfinite(v):
                t.report(float(v), int(pt["epoch"]))
                if t.should_prune():
                    return True
        return False

    def _importance(self) -> dict[str, float]:
        """fANOVA importances of the params (none when every completed trial has the same)."""
        try:
            ev = self.optuna.importance.FanovaImportanceEvaluator(seed=0)
            found = self.optuna.importance.get_param_importances(self.study, evaluator=ev)
            return {k: float(v) for k, v in found.items()}
        except (RuntimeError, ValueError) as e:
            warnings.warn(f"study {self.name}: no parameter importances ({e})", stacklevel=2)
            return {}

    def _finish(self, res: StudyResult) -> StudyResult:
        n = {
            s.name.lower(): len(self.study.get_trials(deepcopy=False, states=(s,)))
            for s in (self.states.COMPLETE, self.states.PRUNED, self.states.FAIL)
        }
        if not n["complete"]:
            states = f"{n['pruned']} pruned, {n['fail']} fail"
            raise TuneError(f"study {self.name}: no trial completed ({states}){log_hint(self.out)}")
        best = self.study.best_trial
        # the first completed trial that ran the default recipe (none: the baseline runs alone)
        done = self.study.get_trials(deepcopy=False, states=(self.states.COMPLETE,))
        res.baseline_trial = next((t.number for t in done if t.params == self.default), None)
        more = {
            "best": True,
            "importance": self._importance() if n["complete"] >= 2 else {},
            "baseline_run_id": self.base_plan.run_id,
            "baseline_trial": res.baseline_trial,
            "n_trials": n,
        }
        # the best trial's run, planned again from its params alone (what `evaluate --set` plans):
        # same code, split, seed; the baseline is a cache hit when the default trial completed
        params = dict(best.params)
        claim = {"number": best.number, "params": params, "state": "complete", **more}
        res.best, res.baseline = self._run([(self._spec(params), claim), (self.base, None)])
        if res.best.get("status") != "ok":
            raise TuneError(
                f"study {self.name}: the best trial's retrain failed: {res.best.get('error')}"
            )
        latest = self._latest()
        res.trials = [latest[k] for k in sorted(latest)]
        return res


def tune(
    bases: list[RunSpec],
    space: tuple[Param, ...],
    out: str,
    recipe,
    *,
    weights_dir: str | None = None,
    allow_random_weights: bool = False,
    **options,
) -> list[StudyResult]:
    """One study per base run (model x cube x protocol [x fraction]), each one's outcome; `options`
    are `StudyOptions`' fields (trials, sampler, pruner, batch, client, progress, seed)."""
    o = StudyOptions(space, out, recipe, **options)
    refuse_untunable({b.protocol for b in bases})
    o.client = get_client(o.client)
    o.ctx = cluster_context(
        o.client, out, weights_dir=weights_dir, allow_random_weights=allow_random_weights
    )
    return [_Study(b, o).run() for b in bases]
