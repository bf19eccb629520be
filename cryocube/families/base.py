"""The contract between the scheduler (`cryocube.engine`), which knows no family, and a family: the
hooks it calls in order (`plan`; `prepare` once per `prep_key`; `group`; `fit` per group; `score`
map tasks that `reduce` pairwise on the workers; `finish`), as docs/architecture.md draws them."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Callable, ClassVar

from ..precision import DeviceInfo, this_device
from ..recipe import BaseRecipe
from ..record import RunRecord, content_hash


@dataclass(frozen=True)
class RunSpec:
    model: str
    cube: str
    protocol: str = "frozen"
    fraction: float | None = None  # None: the protocol's default
    seed: int = 0
    overrides: tuple[tuple[str, Any], ...] = ()  # recipe fields of this run only (a study's trial)

    @property
    def label(self) -> str:
        """How progress lines, logs and errors name the run: model/cube/protocol@fraction/seedN."""
        f = "" if self.fraction is None else f"@{self.fraction:g}"
        o = "".join(f",{k}={v}" for k, v in self.overrides)
        cube = self.cube.rstrip("/").rsplit("/", 1)[-1]
        return f"{self.model}/{cube}/{self.protocol}{f}/seed{self.seed}{o}"


@dataclass
class PlanContext:
    """What planning needs beyond the run and the cube: where checkpoints are, what workers are."""

    out: str = ""  # results root (run dirs, caches)
    weights_dir: str | None = None
    allow_random_weights: bool = False
    device: DeviceInfo | None = None  # None: not known yet (no cluster), this machine's
    threads: int | None = None  # the workers' configured torch threads (None: this process's)

    def run_threads(self, requested: int | None) -> int:
        """Its recipe's, else the workers' configured threads (never the load: reruns repeat)."""
        from ..cluster.runtime import configured_threads

        return int(requested or self.threads or configured_threads())

    def arithmetic_threads(self, threads: int) -> int | None:
        """The threads where they change a run's bits (CPU reductions), None where not (CUDA)."""
        return threads if (self.device or this_device()).type == "cpu" else None


@dataclass
class PlannedRun:
    spec: RunSpec
    record: RunRecord  # what every record of this run carries (run id, identity, config, ...)
    work: Any  # the family's typed description of the run's tasks
    cube: Any = None  # the CubeInfo the run reads
    prep_key: str | None = None  # runs with the same key share one `prepare`
    estimate: dict[str, Any] = field(default_factory=dict)  # what `--dry-run` prints (steps, items)
    # its record's, read as the planned run's own
    run_id = property(attrgetter("record.run_id"))
    family = property(attrgetter("record.family"))
    identity = property(attrgetter("record.identity"))  # everything the run id hashes
    dataset = property(attrgetter("record.dataset"))
    model_name = property(attrgetter("record.model_name"))
    fraction = property(attrgetter("record.fraction"))

    @property
    def label(self) -> str:
        """Its spec's label: a planned run is named as the user asked for it, not by its hash id."""
        return self.spec.label


@dataclass
class Resolved:
    """What a family's `resolve` fixes of one run, its own part (`Family.planned` adds the rest)."""

    identity: dict[str, Any]  # the family's identity fields
    model_name: str
    weights: dict | None
    precision: dict | None
    fields: dict[str, Any]  # the family's own record fields
    # the run's tasks, or a function of its run id that builds them (tasks writing into its folder)
    work: Any
    cube: Any = None  # the CubeInfo it reads (or that cube's record: vectors made elsewhere)
    fraction: float = 1.0
    dataset: str | None = None  # where no CubeInfo names it
    model: str | None = None  # the record's model, where the run's label names it otherwise
    prep_key: str | None = None
    estimate: dict[str, Any] = field(default_factory=dict)


Task = tuple[Callable, Any]  # (a function the workers run, its one argument)


class Family(ABC):
    """Base of the evaluation families (the module docstring gives the order of the hooks)."""

    name: ClassVar[str]
    primary_metric: ClassVar[str]
    higher_is_better: ClassVar[bool] = True
    # why `tune` cannot study this family's protocols ("": it can, its runs record a val curve)
    not_tunable: ClassVar[str] = ""
    shown_metrics: ClassVar[tuple[str, ...]] = ()  # after the primary one on a result line
    recipe: ClassVar[type[BaseRecipe]] = BaseRecipe
    identity_version: ClassVar[int] = 1  # the identity's "v": raised when run ids move
    # False: the run's threads are in what its identity names already (an embedding store's key)
    threads_in_identity: ClassVar[bool] = True
    # modules its first tasks import (torch, timm, its own): local workers import them while the
    # client plans, so those seconds overlap planning instead of following it
    warm_modules: ClassVar[tuple[str, ...]] = ()

    def plan(self, spec: RunSpec, cube, recipe: BaseRecipe, ctx: PlanContext) -> PlannedRun:
        """The template every run is planned by: overrides, threads, `resolve`, `planned`."""
        recipe = self.with_overrides(spec, recipe)
        recipe = recipe.replace(threads=ctx.run_threads(recipe.threads))
        r = self.resolve(spec, cube, recipe, ctx)
        r.fields.setdefault("torch_threads", recipe.threads)
        threads = ctx.arithmetic_threads(recipe.threads) if self.threads_in_identity else None
        return self.planned(spec, r, seed=spec.seed, threads=threads)

    def with_overrides(self, spec: RunSpec, recipe: BaseRecipe) -> BaseRecipe:
        """The run's recipe: its overrides (a study's trial) checked and applied."""
        if not spec.overrides:
            return recipe
        return recipe.updated(dict(spec.overrides), f"{spec.label}: overrides")

    @abstractmethod
    def resolve(self, spec: RunSpec, cube, recipe: BaseRecipe, ctx: PlanContext) -> Resolved:
        """Checks the run and fixes this family's part; user errors are raised here, before work."""

    def planned(
        self, spec: RunSpec, r: Resolved, *, seed: int | None, threads: int | None = None
    ) -> PlannedRun:
        """The identity (with seed, threads, `identity_version`), its hash as run id, the record."""
        identity = {
            "family": self.name,
            **r.identity,
            **({} if seed is None else {"seed": seed}),
            **({"threads": threads} if threads else {}),
            "v": self.identity_version,
        }
        run_id = content_hash(identity)
        return PlannedRun(
            spec=spec,
            record=self.base_record(spec, r, run_id, identity),
            work=r.work(run_id) if callable(r.work) else r.work,
            cube=None if isinstance(r.cube, dict) else r.cube,
            prep_key=r.prep_key,
            estimate=r.estimate,
        )

    def base_record(self, spec: RunSpec, r: Resolved, run_id: str, identity: dict) -> RunRecord:
        """The one way a run record starts (the scheduler completes it with status and metrics)."""
        info = None if isinstance(r.cube, dict) else r.cube  # a CubeInfo, its record, or None
        cube = r.cube or None
        if info is not None:
            cube = {k: getattr(info, k) for k in ("url", "checksum", "schema_version")}
        return RunRecord(
            run_id=run_id,
            family=self.name,
            model=spec.model if r.model is None else r.model,
            model_name=r.model_name,
            dataset=str(r.dataset or info.dataset),
            protocol=spec.protocol,
            fraction=r.fraction,
            seed=spec.seed,
            primary_metric=self.primary_metric,
            identity=identity,
            cube=cube,
            weights=r.weights,
            precision=r.precision,
            overrides=dict(spec.overrides) or None,
            fields=dict(r.fields),
        )

    def prepare(self, runner, runs: list[PlannedRun]) -> dict[str, dict]:
        """Shared work of runs with one prep_key (returns facts per key for the records)."""
        return {}

    def group(self, runs: list[PlannedRun], workers: int) -> list[list[PlannedRun]]:
        """Runs fitted together in one task (default: each alone)."""
        return [[r] for r in runs]

    @abstractmethod
    def fit(self, group: list[PlannedRun]) -> Task:
        """One task fitting the group: a fitted dict per run ({"failed": ...} for a failed one)."""

    @abstractmethod
    def score(self, run: PlannedRun, fitted: dict) -> list[Task]:
        """The map tasks scoring one fitted run; `reduce` joins their partial results on workers."""

    @staticmethod
    @abstractmethod
    def reduce(a, b):
        """Combines two partial results on a worker; associative (pairs are joined in a tree)."""

    @abstractmethod
    def finish(self, run: PlannedRun, fitted: dict, total, prepared: dict) -> dict:
        """The run's metrics and record fields from the reduced total; raising fails the run."""

    def report_key(self, record: RunRecord) -> tuple:
        """What keeps two of this family's records apart in a report beyond the shared key: none."""
        return ()

    def report_sections(self, page, results) -> None:
        """This family's report sections: by default one board per cube from `metrics.cells`."""
        from ..report.board import about, cells_table, cubes

        runs = [r for r in results.of(self.name) if r.metrics.get("cells")]
        for c in cubes(runs):
            sec = page.section(f"{self.name} on {c.name} ({c.dataset})")
            said = ", ".join(x for x in (c.dataset, about(c)) if x)
            title = f"{self.name} on {c.name} ({said}): board cells"
            table = cells_table([r for r in runs if c.holds(r)], f"board_{c.slug}", title)
            page.table(sec, self.name, table)


def fit_nothing(group: list) -> list[dict]:
    """The fit task of a family that trains nothing shared: an empty fitted state per run."""
    return [{} for _ in group]


class FittedInScore(Family):
    """A family whose runs share no fit (probes, heads, VLM answers): its work is in score tasks."""

    def fit(self, group: list[PlannedRun]):
        """The no-op fit over the group."""
        return fit_nothing, group


def derive_seed(*parts: Any) -> int:
    """A run's own seed from what defines it (so runs never share random streams by accident)."""
    return int(hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:8], 16)


@dataclass
class EngineRuns:
    """What a family's command hands the engine: its runs, their folder, how to show them."""

    runs: list[PlannedRun]
    out: str
    show: Callable[[list[dict]], int]
