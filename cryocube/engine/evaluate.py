"""`evaluate`: the scheduler, which knows no family. The runs not done yet go through the stages of
`Schedule`, every task through `Runner`; a failed run is recorded as an error, the others go on."""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import dask
from distributed import as_completed

from .. import store as _store
from ..cluster.client import cluster_info, cluster_threads, get_client, gpu_resources
from ..cluster.timeouts import explain_timeout
from ..errors import RunFailed, UserError
from ..families import PlanContext, PlannedRun, RunSpec, get
from ..families.recipes import default_recipe
from ..precision import DeviceInfo, this_device, weakest
from ..progress import RunBoard, gather, show_dashboard
from ..record import RunRecord, load_record, read_results, sync_results, write_record
from .plan import plan_runs
from .records import write_parquet

PROGRESS_TOPIC = "cryocube-progress"
KEY = "cryocube"  # prefix of every task key (their failures are logged here, not by workers)
# ahead of queued fits: a fitted run is scored (and recorded) as soon as a worker is free
SCORE_PRIORITY = 10
RESTART_WAIT_S = 120  # for a nanny to restart a worker on a loaded machine


@dataclass
class EvaluateResult:
    records: list[dict] = field(default_factory=list)  # the JSON written, one per run
    skipped: list[str] = field(default_factory=list)  # run ids already done
    planned: list[PlannedRun] = field(default_factory=list)
    prepared: dict[str, dict] = field(default_factory=dict)  # prep key -> facts (encoder items)

    @property
    def encoder_items(self) -> dict[str, int]:
        """Encoder items per feature cache this call extracted (0: found complete)."""
        return {k: v.get("encoder_items", 0) for k, v in self.prepared.items()}


class Runner:
    """The one way to the cluster (scheduler and families): GPU annotations, keys, progress."""

    def __init__(self, client, resources: dict | None, progress: bool):
        self.client, self.resources, self.progress = client, resources, progress

    def submit(self, fn: Callable, *args: Any, key: str, priority: int = 0):
        """One task; the timestamped key keeps a retried run off a finished task's result."""
        key = f"{key}-{time.time_ns()}"
        return self.client.submit(
            fn, *args, pure=False, resources=self.resources, priority=priority, key=key
        )

    def result(self, fut):
        """One future's result (a worker's error re-raised here): families never wait on futures."""
        return fut.result()

    def scatter(self, data):
        """`data` on every worker once (a matrix many tasks read), as a future for their tasks."""
        return self.client.scatter(data, broadcast=True)

    def map(self, fn: Callable, args: list, label: str, weights: list[float], key: str) -> list:
        """One task per item, results in order; the bar `label` advances by each item's weight."""
        keys = [f"{key}-{time.time_ns()}-{i}" for i in range(len(args))]
        futs = self.client.map(fn, args, pure=False, resources=self.resources, key=keys)
        return gather(futs, label, sum(weights), self.progress, lambda i, r: weights[i])

    def reduce(self, futures: list, fn: Callable, priority: int = 0):
        """Reduce futures pairwise on the workers (log-depth), returning one future."""
        level = list(futures)
        while len(level) > 1:
            nxt = [
                self.submit(fn, level[i], level[i + 1], key=f"{KEY}-reduce-{i}", priority=priority)
                for i in range(0, len(level) - 1, 2)
            ]
            if len(level) % 2:
                nxt.append(level[-1])
            level = nxt
        return level[0]


class Schedule:
    """The runs of one `evaluate` call through their stages; a failed run is recorded, others go."""

    def __init__(
        self, runner: Runner, out: str, res: EvaluateResult, extra: Callable | None = None
    ):
        self.runner, self.out, self.res, self.extra = runner, out, res, extra
        self.info = cluster_info(runner.client)
        self.pending: dict = {}  # future -> (the stage its result goes to, that stage's arguments)
        self.done = as_completed(loop=runner.client.loop)
        self.board: RunBoard | None = None
        self.started = time.perf_counter()

    def run(self, todo: list[PlannedRun]) -> None:
        """Prepare, submit every fit, then each stage as its task completes; results.parquet is
        rewritten at the end, interrupted or not."""
        by_family: dict[str, list[PlannedRun]] = {}
        for p in todo:
            by_family.setdefault(p.family, []).append(p)
        for name, members in by_family.items():  # shared work (feature caches, embeddings)
            self.res.prepared.update(get(name).prepare(self.runner, members))
        self.started = time.perf_counter()
        for name, members in by_family.items():
            workers = max(1, len(self.runner.client.scheduler_info(n_workers=-1)["workers"]))
            for group in get(name).group(members, workers):
                self.fit(name, group)
        self.board = RunBoard({p.run_id: p.label for p in todo}, self.runner.progress)
        client = self.runner.client
        show_dashboard(client, self.runner.progress)  # in a notebook, once: where to watch
        client.subscribe_topic(
            PROGRESS_TOPIC, lambda ev: self.board.event(ev[1] if isinstance(ev, tuple) else ev)
        )
        try:
            with self.board:
                for fut in self.done:
                    stage, args = self.pending.pop(fut)
                    stage(fut, *args)
        finally:
            client.unsubscribe_topic(PROGRESS_TOPIC)
            if self.res.records:
                write_parquet(self.out)

    def _then(self, fut, stage: Callable, *args) -> None:
        self.pending[fut] = (stage, args)
        self.done.add(fut)

    def fit(self, name: str, group: list[PlannedRun]) -> None:
        """Submits one group's fit task (runs that share a pass); its result goes to `score`."""
        fn, task = get(name).fit(group)
        fut = self.runner.submit(fn, task, key=f"{KEY}-fit-{group[0].run_id}")
        self._then(fut, self.score, name, group)

    def score(self, fut, name: str, group: list[PlannedRun]) -> None:
        """A fitted group: each run's score tasks; a failed group is recorded run by run."""
        try:
            fitted = fut.result()
        except Exception as e:
            for p in group:
                self.fail(p, e)
            return
        for p, f in zip(group, fitted):
            if "failed" in f:
                x = f["failed"]
                self.fail(p, RunFailed(x["kind"], x["message"], x["traceback"]))
                continue
            key = f"{KEY}-score-{p.run_id}"
            parts = [
                self.runner.submit(fn, t, key=f"{key}-{i}", priority=SCORE_PRIORITY)
                for i, (fn, t) in enumerate(get(name).score(p, f))
            ]
            self.board.scoring(p.run_id, len(parts))
            # summed pairwise on the workers; `finish` times test_s from here
            total = self.runner.reduce(parts, get(name).reduce, priority=SCORE_PRIORITY)
            self._then(total, self.finish, name, p, f, time.perf_counter())

    def finish(self, fut, name: str, run: PlannedRun, fitted: dict, scored: float) -> None:
        """The run's record from its reduced total."""
        try:
            fields = get(name).finish(run, fitted, fut.result(), self.res.prepared)
        except Exception as e:
            self.fail(run, e)
            return
        test_s = time.perf_counter() - scored
        # a run's own time: its fit task (shared by the decoders trained with it) and its scoring
        timings = fields.get("timings", {})
        timings = timings | {
            "test_s": test_s,
            "total_s": timings.get("train_s", 0.0) + test_s,
            "since_start_s": time.perf_counter() - self.started,
        }
        self._write(run, fields | {"status": "ok", "error": None, "timings": timings})
        metric = fields.get("primary_metric", "mIoU")
        m = fields["metrics"].get(metric)
        self.board.finish(run.run_id, f"done: {metric} {m:.2f}" if m is not None else "done")

    def fail(self, run: PlannedRun, e: BaseException) -> None:
        """Records the run as an error, its traceback appended to OUT/logs/errors.log."""
        log = _log_failure(self.out, run, e)
        kind = e.kind if isinstance(e, RunFailed) else type(e).__name__
        # never a bare "TimeoutError": what it waited for, what to change
        if isinstance(e, TimeoutError):
            e = RunFailed(kind, explain_timeout(e), "".join(traceback.format_exception(e)))
        self._write(run, {"status": "error", "error": f"{kind}: {e}", "error_log": log})
        first = str(e).splitlines()[0] if str(e) else ""
        self.board.finish(
            run.run_id, f"FAILED {kind}: {first[:300]} (traceback in {log})", failed=True
        )

    def _write(self, run: PlannedRun, more: dict) -> None:
        rec = run.record.merged(more | {"cluster": self.info})
        rec = rec.merged(self.extra(run, rec)) if self.extra else rec
        self.res.records.append(write_record(self.out, rec))


def cluster_device(client) -> DeviceInfo:
    """The device that decides `precision: auto` for this cluster (the weakest of its workers)."""
    return weakest(list(client.run(this_device).values()))


def cluster_context(client, out: str, **kw: Any) -> PlanContext:
    """Planning on this cluster: its weakest worker's device and its configured torch threads."""
    return PlanContext(
        out=out, device=cluster_device(client), threads=cluster_threads(client), **kw
    )


def _warm(families: tuple[str, ...]) -> DeviceInfo:
    for f in families:
        for m in get(f).warm_modules:
            importlib.import_module(m)
    # the modules' objects live as long as the worker: the collector's full passes during a fit
    # skip them (a 16 s ViT-S fine-tune: 0.18 s a full pass before, 0.06 s after)
    gc.freeze()
    return this_device()


def warm_workers(client, families: list[str]) -> list:
    """A task per worker importing what the families' tasks need, then naming its device
    (`wait_warm`): the workers' imports overlap planning. The worker resolves the families, so
    this process submits before importing them (torch, timm: seconds that would delay both)."""
    tag, fams = uuid.uuid4().hex[:8], tuple(families)
    return [
        client.submit(
            _warm, fams, key=f"cryocube-warm-{tag}-{i}", workers=[w], allow_other_workers=False
        )
        for i, w in enumerate(client.scheduler_info(n_workers=-1)["workers"])
    ]


def wait_warm(client, warm: list) -> DeviceInfo:
    """The cluster's device (as `cluster_device`), once every worker has imported its modules."""
    return weakest(client.gather(warm))


def errors_log(out: str) -> str:
    """Where every failed run's traceback is appended: one file per results folder."""
    return f"{out.rstrip('/')}/logs/errors.log"


def log_hint(out: str) -> str:
    """' (tracebacks in OUT/logs/errors.log)' where that file exists."""
    url = errors_log(out)
    return f" (tracebacks in {url})" if _store.file_exists(url) else ""


def _log_failure(out: str, run: PlannedRun, e: BaseException) -> str:
    url = errors_log(out)
    tb = e.tb if isinstance(e, RunFailed) else "".join(traceback.format_exception(e))
    _store.append_text(
        url, f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {run.label} (run {run.run_id})\n{tb}\n"
    )
    return url


def is_done(out: str, run: PlannedRun) -> bool:
    """Whether `out` holds an ok record of the run (it is not run again)."""
    rec = load_record(out, run.run_id)
    return rec is not None and rec.status == "ok"


def evaluate(
    runs: list[RunSpec] | list[PlannedRun],
    out: str,
    config=None,
    client=None,
    progress: bool = True,
    storage_options: dict | None = None,
    weights_dir: str | None = None,
    allow_random_weights: bool = False,
    extra: Callable[[PlannedRun, RunRecord], dict] | None = None,
) -> EvaluateResult:
    """Run (or resume) the runs (specs planned with the workers' device); `extra(run, record)`
    adds fields to a record before it is written (a study's `sweep`)."""
    client = get_client(client)
    _store.register_options(out, storage_options)
    _store.share_with(client)
    planned = [r for r in runs if isinstance(r, PlannedRun)]
    if len(planned) != len(runs):
        ctx = cluster_context(
            client, out, weights_dir=weights_dir, allow_random_weights=allow_random_weights
        )
        planned = plan_runs(
            [r for r in runs if isinstance(r, RunSpec)], config or default_recipe(), ctx
        )
    res = EvaluateResult(planned=planned)
    if sync_results(out):  # the table re-indexes every record before a run counts as cached
        write_parquet(out)
    done = {p.run_id for p in planned if is_done(out, p)}
    res.skipped = [p.run_id for p in planned if p.run_id in done]
    todo = [p for p in planned if p.run_id not in done]
    if todo:
        check_memory(todo, client)
        Schedule(Runner(client, gpu_resources(client), progress), out, res, extra).run(todo)
    return res


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_memory(todo: list[PlannedRun], client) -> None:
    """Refuse, before any task, a run needing more memory than a worker may hold before its nanny
    restarts it: it would restart workers until Dask gives up (`KilledWorker`)."""
    limits = _worker_limits(client)
    if not limits or not all(limits):  # a worker without a limit: nothing restarts it
        return
    frac = dask.config.get("distributed.worker.memory.terminate", 0.95) or 1.0
    room = min(limits) * frac
    for p in todo:
        need = p.estimate.get("memory_bytes") or 0
        if need > room:
            raise UserError(
                f"{p.label} needs at least {_gib(need)} of memory in one worker (weights,"
                f" gradients, optimiser state and activations), more than the {_gib(room)} a worker"
                f" may hold before Dask restarts it ({frac:.0%} of its {_gib(min(limits))} limit):"
                " give workers more with --memory-limit or fewer --workers, or lower batch_size"
            )


def _worker_limits(client) -> list:
    """Each worker's memory limit, once the workers a local cluster was started with are back: one
    its nanny is restarting is absent for seconds, and an empty list would skip the check."""
    want = len(getattr(getattr(client, "cluster", None), "worker_spec", None) or ())
    with contextlib.suppress(TimeoutError):
        if want:
            client.wait_for_workers(want, timeout=RESTART_WAIT_S)
    return [w.get("memory_limit") for w in client.scheduler_info(n_workers=-1)["workers"].values()]


def _without_threads(identity: dict) -> str:
    return json.dumps(
        {k: v for k, v in (identity or {}).items() if k != "threads"}, sort_keys=True, default=str
    )


def cached_with_other_threads(planned: list[PlannedRun], out: str) -> dict[str, int]:
    """run_id -> the torch threads of an ok record in `out` of the same run but for its threads."""
    ok = {
        _without_threads(r["identity"]): r["identity"]["threads"]
        for r in read_results(out)
        if r.get("status") == "ok"
        and isinstance(r.get("identity"), dict)
        and r["identity"].get("threads")
    }
    return {
        p.run_id: ok[k]
        for p in planned
        if "threads" in p.identity
        and (k := _without_threads(p.identity)) in ok
        and ok[k] != p.identity["threads"]
    }


def dry_run(
    planned: list[PlannedRun],
    out: str,
    prepared_exists: Callable[[str], bool] | None = None,
    workers_for: Callable[[int], int | None] | None = None,
) -> str:
    """What `evaluate` would do, run by run; runs cached under other torch threads are counted with
    the --workers that gives them (`workers_for`)."""
    lines, todo, items, other = [], 0, {}, {}
    for p in planned:
        cached = is_done(out, p)
        todo += not cached
        if not cached and not other:
            other = cached_with_other_threads(planned, out)
        w = p.record.weights or {}
        wtxt = (
            "random init"
            if w.get("random_init") and w.get("pretrained")
            else ("scratch" if not w.get("pretrained") else w.get("source"))
        )
        prec = p.record.precision or {}
        est = p.estimate
        if p.prep_key and not cached:
            # runs sharing a cache: the largest draw's (a few-shot run extracts only its own)
            items[p.prep_key] = max(items.get(p.prep_key, 0), est.get("encoder_items", 0))
        lines.append(
            f"{'cached ' if cached else 'to run '} {p.run_id}  {p.label:<48}"
            f" {est.get('steps', '?'):>6} steps  weights {wtxt}  precision"
            f" {prec.get('requested')}->{prec.get('effective')}"
        )
    cache_txt = ""
    if items:
        have = [k for k in items if prepared_exists and prepared_exists(k)]
        cache_txt = (
            f"; {len(items)} shared preparation(s) (feature caches, embeddings), {len(have)}"
            f" already built, {sum(v for k, v in items.items() if k not in have)} encoder items to"
            " compute"
        )
    head = f"{len(planned)} runs: {todo} to run, {len(planned) - todo} cached{cache_txt}"
    if other:
        ws = {t: workers_for and workers_for(t) for t in sorted(set(other.values()))}
        how = [f"--workers {w}" if w else f"--set threads={t}" for t, w in ws.items()]
        head += (
            f"\n{len(other)} runs are cached with other torch threads ({' or '.join(how)}); the"
            " threads are part of the run id, so this plan runs them again"
        )
    return "\n".join([head, *lines])
