"""Question-answering tasks as data: catalogs/tasks/*.yaml -> typed `TaskSpec`s, and their prompts.

A task names its answer parser, its metrics with the cube reference each is scored against, a prompt
template and how the picture is drawn; its file says which kind of cube it asks about (`cubes:`
samples, the interferogram cubes, or tiles, the Cryo-Bench segmentation cubes) and which columns the
leaderboard shows (`board:`). Everything is checked when the catalog is read (an unknown prompt
field, parser, metric or reference kind is one sentence naming the file and task), so a bad task
never costs a cluster start. Specs are plain frozen dataclasses: they travel with the tasks to
workers that never saw a lab's catalog folder.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import string
from dataclasses import asdict, dataclass, field
from typing import Any

from ..catalog import CatalogError, _read_yaml, catalog_dirs, need
from .metrics import SCORES
from .parsers import COUNT, PARSERS, Parsed, in_domain

PROMPT_FIELDS = (
    "labels",
    "choices",
    "primary_date",
    "secondary_date",
    "days",
    "wavelength_cm",
    "fringe_cm",
    "picture",
    "width",
    "height",
    "frame",
)
TILE_PROMPT_FIELDS = ("labels", "choices", "class_name", "dataset", "picture", "width", "height")
# cube kind (a task file's `cubes:`) -> the prompt fields its samples fill
CUBE_KINDS = {"samples": PROMPT_FIELDS, "tiles": TILE_PROMPT_FIELDS}
REFERENCE_KINDS = ("target", "box", "answer", "class")
# `class: present|fraction`: the probe's derived labels (families/class_labels.py)
CLASS_REFERENCES = ("present", "fraction")
RENDER_LAYOUTS = ("side_by_side", "phase")
STRETCHES = ("percentile", "statistics")


@dataclass(frozen=True)
class RenderSpec:
    layout: str = "side_by_side"
    phase_band: str = "wrapped_phase"
    phase_colormap: str = "twilight"
    phase_range: tuple[float, float] = (-3.141592653589793, 3.141592653589793)
    coherence_band: str = "coherence"
    coherence_colormap: str = "gray"
    coherence_range: tuple[float, float] = (0.0, 1.0)
    rendered_phase: tuple[str, ...] = ("insar_r", "insar_g", "insar_b")
    rendered_coherence: str = "coherence_grey"
    rendered_range: tuple[float, float] = (0.0, 255.0)
    scale: int = 1


@dataclass(frozen=True)
class TileRender:
    """A Cryo-Bench tile as a picture: the optical bands nearest to red, green and blue in colour,
    else the first band of `grey_roles` in grey; each band stretched over its percentiles in the
    picture or over the cube's train-split mean +- `stds` standard deviations (`statistics`)."""

    rgb_um: tuple[float, float, float] = (0.665, 0.560, 0.490)
    rgb_role: str = "optical"
    rgb_tolerance_um: float = 0.06
    grey_roles: tuple[str, ...] = ("sar",)
    stretch: str = "percentile"
    percentiles: tuple[float, float] = (2.0, 98.0)
    stds: float = 2.0
    scale: int = 1


@dataclass(frozen=True)
class Board:
    """A task file's leaderboard: its title, its columns (task, metric, header) and, per column, the
    probe task (`<probe>__cls|regr`, or `<class slug>_<probe>` when `per_class`) that answers it for
    a GFM, or None.
    """

    title: str
    columns: tuple[tuple[str, str, str], ...]
    probes: tuple[str | None, ...]
    per_class: bool = False


@dataclass(frozen=True)
class TaskSpec:
    name: str
    title: str
    answer: str  # parser name
    metrics: tuple[tuple[str, str, str], ...]  # (metric, reference kind, reference name)
    prompt: str
    max_new_tokens: int
    labels: tuple[str, ...] = ()
    aliases: tuple[tuple[str, tuple[str, ...]], ...] = ()
    unparsed_value: float = 0.0
    render: RenderSpec | TileRender = field(default_factory=RenderSpec)
    source: str = ""  # the catalog file
    cube_kind: str = "samples"  # the cubes its file asks about (CUBE_KINDS)
    skip_classes: tuple[str, ...] = ()  # tiles: classes not asked about (background)
    # further phrasings of `prompt` (`prompts:`); the board scores `prompt`
    variants: tuple[str, ...] = ()
    # number answers: lowest, highest (None: open)
    domain: tuple[float | None, float | None] | None = None
    # its file's `datasets:`: the only datasets whose cubes it asks (empty: any)
    datasets: tuple[str, ...] = ()
    # a number answer's unit on the board (empty: by answer kind, families/vqa/cells.py)
    unit: str = ""

    @property
    def primary_metric(self) -> str:
        """The first metric of the task's `metrics:` mapping (the file's order decides)."""
        return self.metrics[0][0]

    @property
    def phrasings(self) -> tuple[str, ...]:
        """Every phrasing of the question, the board's first."""
        return (self.prompt, *self.variants)

    def digest(self) -> str:
        """The prompt-template hash: everything that decides what the model is asked and how it is
        read."""
        d = asdict(self)
        d.pop("source")
        # a task asks one kind of cube (any other is refused), so it never moves an answer
        d.pop("cube_kind")
        d.pop("datasets")  # likewise: which cubes it is asked of, not what it asks
        d.pop("unit")  # how the board names the error's unit, not what is asked or read
        # the classes left out change the questions (kept out when none: old ids stand)
        if not self.skip_classes:
            d.pop("skip_classes")
        # likewise: a task without further phrasings or a domain keeps its id
        for k in ("variants", "domain"):
            if not d[k]:
                d.pop(k)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    def parser_options(self, variant: int = 0) -> dict[str, Any]:
        """What the parser needs besides the answer: labels (a multiple-choice phrasing: letters
        too), a domain."""
        if self.answer == "class":
            return {
                "labels": self.labels,
                "aliases": dict(self.aliases),
                "letters": "choices" in prompt_fields(self.phrasings[variant]),
            }
        return {"domain": self.number_domain} if self.answer == "number" else {}

    @property
    def number_domain(self) -> tuple[float | None, float | None]:
        """A number answer's domain: the file's `domain:`, else a count's [0, open)."""
        return self.domain if self.domain is not None else COUNT

    def checked(self, p: Parsed) -> Parsed:
        """A parsed answer held to the task's domain at scoring, whichever parser read it: a number
        outside it (a negative count) is unparsed."""
        if self.answer == "number" and p.ok and not in_domain(float(p.value), self.number_domain):
            return Parsed(None, False, p.text)
        return p


def _render(d: Any, where: str) -> RenderSpec:
    if d is None:
        return RenderSpec()
    if not isinstance(d, dict):
        raise CatalogError(f"{where}: render must be a mapping")
    unknown = set(d) - {"layout", "phase", "coherence", "rendered", "scale"}
    if unknown:
        raise CatalogError(f"{where}: unknown render fields {sorted(unknown)}")
    layout = str(d.get("layout", "side_by_side"))
    if layout not in RENDER_LAYOUTS:
        raise CatalogError(
            f"{where}: render layout {layout!r} is not one of {', '.join(RENDER_LAYOUTS)}"
        )
    ph, co, rd = d.get("phase") or {}, d.get("coherence") or {}, d.get("rendered") or {}
    base = RenderSpec()

    def rng(x, default):
        if x is None:
            return default
        if not (
            isinstance(x, list)
            and len(x) == 2
            and all(isinstance(v, (int, float)) for v in x)
            and x[0] < x[1]
        ):
            raise CatalogError(f"{where}: a render range must be [low, high] numbers, got {x!r}")
        return (float(x[0]), float(x[1]))

    for cmap in (ph.get("colormap"), co.get("colormap")):
        if cmap is not None:
            import matplotlib

            if cmap not in matplotlib.colormaps:
                raise CatalogError(f"{where}: unknown colour map {cmap!r} (matplotlib's names)")
    scale = d.get("scale", 1)
    if not isinstance(scale, int) or scale < 1:
        raise CatalogError(f"{where}: render scale must be a positive integer, got {scale!r}")
    return RenderSpec(
        layout=layout,
        phase_band=str(ph.get("band", base.phase_band)),
        phase_colormap=str(ph.get("colormap", base.phase_colormap)),
        phase_range=rng(ph.get("range"), base.phase_range),
        coherence_band=str(co.get("band", base.coherence_band)),
        coherence_colormap=str(co.get("colormap", base.coherence_colormap)),
        coherence_range=rng(co.get("range"), base.coherence_range),
        rendered_phase=tuple(rd.get("phase", base.rendered_phase)),
        rendered_coherence=str(rd.get("coherence", base.rendered_coherence)),
        rendered_range=rng(rd.get("range"), base.rendered_range),
        scale=scale,
    )


def _tile_render(d: Any, where: str) -> TileRender:
    if d is None:
        return TileRender()
    if not isinstance(d, dict):
        raise CatalogError(f"{where}: render must be a mapping")
    unknown = set(d) - {"rgb", "grey", "stretch", "scale"}
    if unknown:
        raise CatalogError(
            f"{where}: unknown render fields {sorted(unknown)} (a tile picture takes rgb, grey,"
            " stretch, scale)"
        )
    rgb, grey, st = d.get("rgb") or {}, d.get("grey") or {}, d.get("stretch") or {}
    base = TileRender()
    um = rgb.get("wavelength_um", list(base.rgb_um))
    if not (isinstance(um, list) and len(um) == 3 and all(isinstance(v, (int, float)) for v in um)):
        raise CatalogError(
            f"{where}: render rgb wavelength_um must be three numbers (red, green, blue), got"
            f" {um!r}"
        )
    kind = str(st.get("kind", base.stretch))
    if kind not in STRETCHES:
        raise CatalogError(
            f"{where}: render stretch kind {kind!r} is not one of {', '.join(STRETCHES)}"
        )
    pct = st.get("percentiles", list(base.percentiles))
    if not (
        isinstance(pct, list)
        and len(pct) == 2
        and all(isinstance(v, (int, float)) for v in pct)
        and 0 <= pct[0] < pct[1] <= 100
    ):
        raise CatalogError(
            f"{where}: render stretch percentiles must be [low, high] within 0..100, got {pct!r}"
        )
    scale = d.get("scale", 1)
    if not isinstance(scale, int) or scale < 1:
        raise CatalogError(f"{where}: render scale must be a positive integer, got {scale!r}")
    return TileRender(
        rgb_um=tuple(float(v) for v in um),
        rgb_role=str(rgb.get("role", base.rgb_role)),
        rgb_tolerance_um=float(rgb.get("tolerance_um", base.rgb_tolerance_um)),
        grey_roles=tuple(str(r) for r in grey.get("roles", base.grey_roles)),
        stretch=kind,
        percentiles=(float(pct[0]), float(pct[1])),
        stds=float(st.get("stds", base.stds)),
        scale=scale,
    )


def prompt_fields(template: str) -> list[str]:
    """The `{field}` names a prompt template uses; a malformed template raises ValueError, which
    parse_task turns into a CatalogError."""
    return [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]


def parse_task(
    name: str,
    d: Any,
    render: RenderSpec | TileRender,
    where: str,
    cube_kind: str = "samples",
    skip_classes: tuple[str, ...] = (),
    datasets: tuple[str, ...] = (),
) -> TaskSpec:
    """One `tasks:` entry as a TaskSpec, every field checked against its cube kind; each refusal is
    a CatalogError naming the file and task."""
    if not isinstance(d, dict):
        raise CatalogError(f"{where}: a task must be a mapping")
    unknown = set(d) - {
        "title",
        "answer",
        "labels",
        "aliases",
        "metrics",
        "prompt",
        "prompts",
        "max_new_tokens",
        "unparsed_value",
        "domain",
        "unit",
    }
    if unknown:
        raise CatalogError(f"{where}: unknown fields {sorted(unknown)}")
    answer = need(d, "answer", where, str)
    if answer not in PARSERS:
        raise CatalogError(f"{where}: answer {answer!r} has no parser; known: {', '.join(PARSERS)}")
    labels = tuple(str(x) for x in d.get("labels") or ())
    if answer == "class" and len(labels) < 2:
        raise CatalogError(f"{where}: a class answer needs `labels` (two or more)")
    aliases = d.get("aliases") or {}
    if not isinstance(aliases, dict) or set(aliases) - set(labels):
        raise CatalogError(
            f"{where}: aliases must map labels of the task to lists of words, got {aliases!r}"
        )
    metrics = need(d, "metrics", where, dict)
    ms = []
    for m, ref in metrics.items():
        if m not in SCORES:
            raise CatalogError(f"{where}: unknown metric {m!r}; known: {', '.join(SCORES)}")
        if not (isinstance(ref, dict) and len(ref) == 1 and next(iter(ref)) in REFERENCE_KINDS):
            raise CatalogError(
                f"{where}: metric {m}: the reference must be one of"
                f" {{{', '.join(f'{k}: NAME' for k in REFERENCE_KINDS)}}}, got {ref!r}"
            )
        ((kind, ref_name),) = ref.items()
        if (kind == "class") != (cube_kind == "tiles") or (
            kind == "class" and ref_name not in CLASS_REFERENCES
        ):
            raise CatalogError(
                f"{where}: metric {m}: a task about {cube_kind} cubes cannot be scored against"
                f" {{{kind}: {ref_name}}} (tiles take class: {' | '.join(CLASS_REFERENCES)};"
                " samples take target, box or answer)"
            )
        ms.append((str(m), kind, str(ref_name)))
    if not ms:
        raise CatalogError(f"{where}: a task needs at least one metric")
    if ("prompt" in d) == ("prompts" in d):
        raise CatalogError(
            f"{where}: give `prompt` (one phrasing) or `prompts` (a list of phrasings, the board's"
            " first), not both or neither"
        )
    raw_prompts = [d["prompt"]] if "prompt" in d else d["prompts"]
    if not (
        isinstance(raw_prompts, list)
        and raw_prompts
        and all(isinstance(p, str) and p.strip() for p in raw_prompts)
    ):
        raise CatalogError(
            f"{where}: prompts must be a list of one or more phrasings (text), got {raw_prompts!r}"
        )
    prompts = [" ".join(p.split()) for p in raw_prompts]
    if len(set(prompts)) != len(prompts):
        raise CatalogError(f"{where}: prompts lists the same phrasing twice")
    allowed = CUBE_KINDS[cube_kind]
    for k, prompt in enumerate(prompts):
        which = "prompt" if "prompt" in d else f"prompts[{k}]"
        try:
            fields = prompt_fields(prompt)
        except ValueError as e:
            raise CatalogError(f"{where}: {which} is not a valid template ({e})") from None
        bad = [f for f in fields if f not in allowed]
        if bad:
            raise CatalogError(
                f"{where}: {which} names unknown field {{{bad[0]}}}; a prompt may use "
                f"{', '.join('{' + f + '}' for f in allowed)}"
            )
        if "choices" in fields and answer != "class":
            raise CatalogError(
                f"{where}: {which} lists {{choices}} (lettered options), which only a class"
                " answer has"
            )
    domain = d.get("domain")
    if domain is not None:
        if answer != "number" or not (
            isinstance(domain, list)
            and len(domain) == 2
            and all(v is None or isinstance(v, (int, float)) for v in domain)
            and (None in domain or domain[0] <= domain[1])
        ):
            raise CatalogError(
                f"{where}: domain is [lowest, highest] (null: open) of a number answer, got"
                f" {domain!r}"
            )
        domain = tuple(None if v is None else float(v) for v in domain)
    mnt = d.get("max_new_tokens", 32)
    if not isinstance(mnt, int) or mnt < 1:
        raise CatalogError(f"{where}: max_new_tokens must be a positive integer, got {mnt!r}")
    return TaskSpec(
        name=name,
        title=str(d.get("title", name)),
        answer=answer,
        metrics=tuple(ms),
        prompt=prompts[0],
        max_new_tokens=mnt,
        labels=labels,
        aliases=tuple((k, tuple(map(str, v))) for k, v in aliases.items()),
        unparsed_value=float(d.get("unparsed_value", 0.0)),
        render=render,
        source=where.split(":")[0],
        cube_kind=cube_kind,
        skip_classes=skip_classes,
        variants=tuple(prompts[1:]),
        domain=domain,
        unit=str(d.get("unit") or ""),
        datasets=datasets,
    )


def _task_file(path) -> dict:
    raw = _read_yaml(path)
    if not isinstance(raw, dict) or not isinstance(raw.get("tasks"), dict):
        raise CatalogError(
            f"{path}: a task file is a mapping with `tasks:` (and optionally `cubes:`, `render:`,"
            " `board:`)"
        )
    unknown = set(raw) - {"tasks", "render", "cubes", "board", "skip_classes", "datasets"}
    if unknown:
        raise CatalogError(f"{path}: unknown top-level fields {sorted(unknown)}")
    kind = str(raw.get("cubes", "samples"))
    if kind not in CUBE_KINDS:
        raise CatalogError(
            f"{path}: cubes must be one of {', '.join(CUBE_KINDS)} (the cube kind its tasks ask"
            f" about), got {kind!r}"
        )
    if "skip_classes" in raw and kind != "tiles":
        raise CatalogError(f"{path}: skip_classes applies to tile cubes (cubes: tiles) only")
    ds = raw.get("datasets", [])
    if not (isinstance(ds, list) and all(isinstance(x, str) and x for x in ds)):
        raise CatalogError(
            f"{path}: datasets must be a list of dataset ids (the cubes its tasks ask), got {ds!r}"
        )
    return raw


def load_task_file(path) -> dict[str, TaskSpec]:
    """A task file's tasks with its render, skip_classes and datasets applied, and its board checked
    against them."""
    raw = _task_file(path)
    kind = str(raw.get("cubes", "samples"))
    render = (_tile_render if kind == "tiles" else _render)(raw.get("render"), f"{path}: render")
    skip = tuple(str(c) for c in raw.get("skip_classes") or ())
    datasets = tuple(raw.get("datasets") or ())
    tasks = {
        n: parse_task(n, d, render, f"{path}: task {n}", kind, skip, datasets)
        for n, d in raw["tasks"].items()
    }
    load_board(path, tasks, raw)  # its columns name its own tasks and metrics
    return tasks


def load_board(path, tasks: dict[str, TaskSpec] | None = None, raw: dict | None = None) -> Board:
    """The file's `board:` (title, columns: [{task, metric, header, probe}], per_class); without
    one, a column per task and metric in file order, headed by the task's title."""
    from .metrics import FACTS

    raw = raw if raw is not None else _task_file(path)
    tasks = tasks if tasks is not None else load_task_file(path)
    where = f"{path}: board"
    b = raw.get("board") or {}
    if not isinstance(b, dict) or set(b) - {"title", "columns", "per_class"}:
        raise CatalogError(f"{where}: a board is a mapping of title, columns and per_class")
    cols = b.get("columns")
    if cols is None:
        cols = [
            {
                "task": n,
                "metric": m,
                "header": f"{t.title} {FACTS[m][0]}" + (" (%)" if FACTS[m][2] else ""),
            }
            for n, t in tasks.items()
            for m, _, _ in t.metrics
        ]
    if not isinstance(cols, list) or not cols:
        raise CatalogError(f"{where}: columns must be a list of {{task, metric, header[, probe]}}")
    out, probes = [], []
    for c in cols:
        if not (
            isinstance(c, dict)
            and {"task", "metric", "header"} <= set(c) <= {"task", "metric", "header", "probe"}
        ):
            raise CatalogError(f"{where}: a column is {{task, metric, header[, probe]}}, got {c!r}")
        t = tasks.get(str(c["task"]))
        if t is None or c["metric"] not in [m for m, _, _ in t.metrics]:
            raise CatalogError(
                f"{where}: column {c['header']!r} names {c['task']}.{c['metric']}, which no task of"
                " the file scores"
            )
        out.append((str(c["task"]), str(c["metric"]), str(c["header"])))
        probes.append(None if c.get("probe") is None else str(c["probe"]))
    return Board(
        title=str(b.get("title", "question tasks")),
        columns=tuple(out),
        probes=tuple(probes),
        per_class=bool(b.get("per_class", False)),
    )


def board_of(stem: str) -> Board:
    """The board of the catalog task file named `stem` (a lab's folder first), as `report` lays out
    a dataset."""
    for d in catalog_dirs():
        p = d / "tasks" / f"{stem}.yaml"
        if p.exists():
            return load_board(p)
    raise CatalogError(f"no task file {stem}.yaml in catalogs/tasks")


def all_tasks() -> dict[str, TaskSpec]:
    """Every task of catalogs/tasks/*.yaml in the search path (a lab's folder first: its task wins a
    name)."""
    out: dict[str, TaskSpec] = {}
    for d in catalog_dirs():
        for p in sorted((d / "tasks").glob("*.yaml")):
            for n, t in load_task_file(p).items():
                out.setdefault(n, t)
    return out


def select(
    names: list[str] | None, cube_kind: str = "samples", dataset: str | None = None
) -> list[TaskSpec]:
    """The named tasks (or every task about `cube_kind` cubes of `dataset`: a file's `datasets:`
    limits its tasks to those); a named task about another kind of cube, or for other datasets, is
    refused."""
    from ..errors import UserError

    tasks = all_tasks()

    def fits(t: TaskSpec) -> bool:
        return not t.datasets or dataset is None or dataset in t.datasets

    if not names:
        return [t for t in tasks.values() if t.cube_kind == cube_kind and fits(t)]
    bad = [n for n in names if n not in tasks]
    if bad:
        raise UserError(
            f"unknown task {bad[0]!r}; known: {', '.join(tasks)} (catalogs/tasks/*.yaml)"
        )
    other = [tasks[n] for n in names if tasks[n].cube_kind != cube_kind]
    if other:
        raise UserError(
            f"task {other[0].name!r} asks about {other[0].cube_kind} cubes ({other[0].source}) and"
            f" this is a {cube_kind} cube; its tasks:"
            f" {', '.join(n for n, t in tasks.items() if t.cube_kind == cube_kind)}"
        )
    other = [tasks[n] for n in names if not fits(tasks[n])]
    if other:
        raise UserError(
            f"task {other[0].name!r} asks about {', '.join(other[0].datasets)} cubes only"
            f" ({other[0].source}: datasets) and this cube is {dataset}"
        )
    return [tasks[n] for n in names]


# -- prompts --------------------------------------------------------------------------------------


def picture_text(r: RenderSpec, rendered: bool) -> str:
    """The {picture} sentence of an interferogram prompt: what the render draws (the published
    rendering or the wrapped phase; coherence right)."""
    src = (
        "the published rendering of the phase"
        if rendered
        else (
            f"the wrapped phase in a cyclic colour map ({r.phase_colormap}, one colour cycle = one"
            " fringe)"
        )
    )
    if r.layout == "phase":
        return f"The picture shows {src}."
    return f"The picture shows, left, {src}; right, the coherence in grey (black = 0, white = 1)."


def _days(a: str, b: str) -> str:
    try:
        return str(abs((_dt.date.fromisoformat(b) - _dt.date.fromisoformat(a)).days))
    except (TypeError, ValueError):
        return "?"


def tile_picture_text(how: str) -> str:
    """The {picture} sentence of a tile prompt; `how` is what the task's render picks from the
    tile's bands (questions.py)."""
    return f"The picture shows {how}."


def choices(labels: tuple[str, ...]) -> str:
    """A multiple-choice phrasing's options: "A. low; B. medium; C. high" (the parser maps a letter
    back)."""
    return "; ".join(f"{chr(ord('A') + k)}. {lab}" for k, lab in enumerate(labels))


def fill_tile(task: TaskSpec, sample: dict[str, Any], variant: int = 0) -> str:
    """The prompt of a tile task for one (sample, class) (`sample`: class_name, dataset, picture,
    width, height)."""
    vals = {
        "labels": " or ".join(task.labels),
        "choices": choices(task.labels),
        "class_name": str(sample["class_name"]).replace("_", " "),
        "dataset": sample.get("dataset", ""),
        "picture": tile_picture_text(sample.get("picture", "the tile")),
        "width": sample.get("width", "?"),
        "height": sample.get("height", "?"),
    }
    return task.phrasings[variant].format(**vals)


def fill(task: TaskSpec, sample: dict[str, Any], variant: int = 0) -> str:
    """The prompt of `task` for one sample (`sample`: primary_date, secondary_date,
    radar_wavelength_m, frame, width, height, rendered)."""
    lam = float(sample.get("radar_wavelength_m") or float("nan"))
    vals = {
        "labels": ", ".join(task.labels),
        "choices": choices(task.labels),
        "primary_date": sample.get("primary_date", "?"),
        "secondary_date": sample.get("secondary_date", "?"),
        "days": _days(sample.get("primary_date", ""), sample.get("secondary_date", "")),
        "wavelength_cm": f"{100 * lam:.2f}",
        "fringe_cm": f"{50 * lam:.2f}",
        "picture": picture_text(task.render, bool(sample.get("rendered"))),
        "width": sample.get("width", "?"),
        "height": sample.get("height", "?"),
        "frame": sample.get("frame") or "unknown",
    }
    return task.phrasings[variant].format(**vals)
