"""Question-answering tasks as data: catalogs/tasks/*.yaml -> typed `TaskSpec`s, and their prompts.
Checked when read, so a bad task never costs a cluster start; frozen specs travel to workers that
never saw a lab's catalog folder. The file format: docs/vlm.md."""

from __future__ import annotations

import datetime as _dt
import math
import string
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from ..catalog import CatalogError, catalog_dirs, read_yaml
from ..errors import FieldError
from ..mapping import from_mapping, rule
from ..record import content_hash
from .metrics import FACTS, SCORES
from .parsers import COUNT, PARSERS, Parsed, in_domain

PROMPT_FIELDS = tuple(
    "labels choices primary_date secondary_date days wavelength_cm fringe_cm picture width height"
    " frame".split()
)
TILE_PROMPT_FIELDS = ("labels", "choices", "class_name", "dataset", "picture", "width", "height")
# cube kind (a task file's `cubes:`) -> the prompt fields its samples fill
CUBE_KINDS = {"samples": PROMPT_FIELDS, "tiles": TILE_PROMPT_FIELDS}
REFERENCE_KINDS = ("target", "box", "answer", "class")
# `class: present|fraction`: the probe's derived labels (families/class_labels.py)
CLASS_REFERENCES = ("present", "fraction")
RENDER_LAYOUTS = ("side_by_side", "phase")
STRETCHES = ("percentile", "statistics")


def _ordered(r: tuple[float, float], what: str) -> None:
    if not r[0] < r[1]:
        raise FieldError(f"render {what} must be [low, high] with low < high, got {list(r)!r}")


@dataclass(frozen=True)
class RenderSpec:
    """An interferogram as a picture: the phase in a cyclic colour map (or the published rendering)
    beside the coherence in grey. The YAML nests `phase:`, `coherence:` and `rendered:`."""

    NOUN: ClassVar[str] = "render field"

    layout: str = rule(
        "side_by_side",
        choices=RENDER_LAYOUTS,
        msg=f"render layout {{v!r}} is not one of {', '.join(RENDER_LAYOUTS)}",
    )
    phase_band: str = rule("wrapped_phase", key="phase.band")
    phase_colormap: str = rule("twilight", key="phase.colormap")
    phase_range: tuple[float, float] = rule((-math.pi, math.pi), key="phase.range")
    coherence_band: str = rule("coherence", key="coherence.band")
    coherence_colormap: str = rule("gray", key="coherence.colormap")
    coherence_range: tuple[float, float] = rule((0.0, 1.0), key="coherence.range")
    rendered_phase: tuple[str, ...] = rule(("insar_r", "insar_g", "insar_b"), key="rendered.phase")
    rendered_coherence: str = rule("coherence_grey", key="rendered.coherence")
    rendered_range: tuple[float, float] = rule((0.0, 255.0), key="rendered.range")
    scale: int = rule(1, lo=1)

    def __post_init__(self):
        for k in ("phase_range", "coherence_range", "rendered_range"):
            _ordered(getattr(self, k), k)
        for cmap in {self.phase_colormap, self.coherence_colormap} - {"twilight", "gray"}:
            import matplotlib  # only for a colour map of the file's own: its import is slow

            if cmap not in matplotlib.colormaps:
                raise FieldError(f"unknown colour map {cmap!r} (matplotlib's names)")


@dataclass(frozen=True)
class TileRender:
    """A Cryo-Bench tile as a picture: the optical bands nearest to red, green and blue in colour,
    else the first band of `grey_roles` in grey, stretched (docs/vlm.md)."""

    NOUN: ClassVar[str] = "render field"

    rgb_um: tuple[float, float, float] = rule(
        (0.665, 0.560, 0.490), key="rgb.wavelength_um", unit="µm", what="three numbers (r, g, b)"
    )
    rgb_role: str = rule("optical", key="rgb.role")
    rgb_tolerance_um: float = rule(0.06, key="rgb.tolerance_um", unit="µm")
    grey_roles: tuple[str, ...] = rule(("sar",), key="grey.roles")
    stretch: str = rule(
        "percentile",
        key="stretch.kind",
        choices=STRETCHES,
        msg=f"render stretch kind {{v!r}} is not one of {', '.join(STRETCHES)}",
    )
    percentiles: tuple[float, float] = rule((2.0, 98.0), key="stretch.percentiles", lo=0, hi=100)
    stds: float = rule(2.0, key="stretch.stds")
    scale: int = rule(1, lo=1)

    def __post_init__(self):
        _ordered(self.percentiles, "stretch percentiles")


@dataclass(frozen=True)
class Board:
    """A task file's leaderboard: title, columns (task, metric, header), a row per class or not."""

    title: str
    columns: tuple[tuple[str, str, str], ...]
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
    variants: tuple[str, ...] = ()  # further phrasings (`prompts:`); the board scores `prompt`
    domain: tuple[float | None, float | None] | None = None  # numbers: lowest, highest (None: open)
    datasets: tuple[str, ...] = ()  # its file's `datasets:`, the only ones it asks (empty: any)
    unit: str = ""  # a number answer's unit on the board (empty: by answer kind, cells.UNITS)

    @property
    def phrasings(self) -> tuple[str, ...]:
        """Every phrasing of the question, the board's first."""
        return (self.prompt, *self.variants)

    def digest(self) -> str:
        """The prompt-template hash: all that decides what the model is asked and how it is read."""
        d = asdict(self)
        # its file, the cubes it asks (others are refused) and the board's unit move no answer
        for k in ("source", "cube_kind", "datasets", "unit"):
            d.pop(k)
        # skipped classes, further phrasings and a domain do, but kept out when empty: old ids stand
        for k in ("skip_classes", "variants", "domain"):
            if not d[k]:
                d.pop(k)
        return content_hash(d, 16)

    def parser_options(self, variant: int = 0) -> dict[str, Any]:
        """What the parser needs besides the answer: labels (multiple choice: letters), a domain."""
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
        """A parsed answer held to the task's domain at scoring, whichever parser read it."""
        if self.answer == "number" and p.ok and not in_domain(float(p.value), self.number_domain):
            return Parsed(None, False, p.text)
        return p


def prompt_fields(template: str) -> list[str]:
    """The `{field}` names of a prompt template (a malformed one raises ValueError)."""
    return [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]


@dataclass(frozen=True)
class TaskEntry:
    """One `tasks:` entry as its file writes it (the metrics a mapping, one or more phrasings)."""

    answer: str = rule(
        choices=PARSERS, msg=f"answer {{v!r}} has no parser; known: {', '.join(PARSERS)}"
    )
    metrics: dict[str, Any]
    title: str = ""
    labels: tuple[str, ...] = ()
    aliases: dict[str, tuple[str, ...]] = rule(factory=dict, what="labels of the task -> words")
    prompt: str | None = None
    prompts: tuple[str, ...] | None = rule(
        None, msg="prompts must be a list of one or more phrasings (text), got {v!r}"
    )
    max_new_tokens: int = rule(32, lo=1, what="a positive integer")
    unparsed_value: float = 0.0
    domain: tuple[float | None, float | None] | None = rule(
        None, msg="domain is [lowest, highest] (null: open) of a number answer, got {v!r}"
    )
    unit: str = ""

    def __post_init__(self):
        if self.answer == "class" and len(self.labels) < 2:
            _refuse("a class answer needs `labels` (two or more)")
        if set(self.aliases) - set(self.labels):
            _refuse(f"aliases must map labels of the task to lists of words, got {self.aliases!r}")
        lo, hi = self.domain or (None, None)
        bad = self.answer != "number" or (None not in (lo, hi) and lo > hi)
        if self.domain is not None and bad:
            _refuse(f"domain is [lowest, highest] (null: open) of a number answer, got {[lo, hi]}")


def _metrics(e: TaskEntry, cube_kind: str) -> list[tuple[str, str, str]]:
    """(metric, reference kind, reference name) of each `metrics:` entry, held to its cube kind."""
    out = []
    for m, ref in e.metrics.items():
        if m not in SCORES:
            raise FieldError(f"unknown metric {m!r}; known: {', '.join(SCORES)}")
        if not (isinstance(ref, dict) and len(ref) == 1 and next(iter(ref)) in REFERENCE_KINDS):
            raise FieldError(
                f"metric {m}: the reference must be one of"
                f" {{{', '.join(f'{k}: NAME' for k in REFERENCE_KINDS)}}}, got {ref!r}"
            )
        ((kind, name),) = ref.items()
        if (kind == "class") != (cube_kind == "tiles") or (
            kind == "class" and name not in CLASS_REFERENCES
        ):
            raise FieldError(
                f"metric {m}: a task about {cube_kind} cubes cannot be scored against"
                f" {{{kind}: {name}}} (tiles take class: {' | '.join(CLASS_REFERENCES)};"
                " samples take target, box or answer)"
            )
        out.append((str(m), kind, str(name)))
    return out or _refuse("a task needs at least one metric")


def _refuse(text: str):
    raise FieldError(text)


def _prompts(e: TaskEntry, cube_kind: str) -> list[str]:
    """The phrasings, whitespace folded, each a template of the fields its cube kind fills."""
    if (e.prompt is None) == (e.prompts is None):
        _refuse(
            "give `prompt` (one phrasing) or `prompts` (a list of phrasings, the board's first),"
            " not both or neither"
        )
    raw = [e.prompt] if e.prompts is None else list(e.prompts)
    if not raw or not all(p.strip() for p in raw):
        _refuse(f"prompts must be a list of one or more phrasings (text), got {raw!r}")
    prompts = [" ".join(p.split()) for p in raw]
    if len(set(prompts)) != len(prompts):
        _refuse("prompts lists the same phrasing twice")
    allowed = CUBE_KINDS[cube_kind]
    for k, prompt in enumerate(prompts):
        which = "prompt" if e.prompts is None else f"prompts[{k}]"
        try:
            fields = prompt_fields(prompt)
        except ValueError as err:
            _refuse(f"{which} is not a valid template ({err})")
        if bad := [f for f in fields if f not in allowed]:
            _refuse(
                f"{which} names unknown field {{{bad[0]}}}; a prompt may use "
                f"{', '.join('{' + f + '}' for f in allowed)}"
            )
        if "choices" in fields and e.answer != "class":
            _refuse(f"{which} lists {{choices}} (lettered options), which only a class answer has")
    return prompts


def parse_task(name: str, d: Any, where: str, file: TaskFile) -> TaskSpec:
    """One `tasks:` entry as a TaskSpec, checked against its file's cube kind (CatalogError)."""
    e = from_mapping(TaskEntry, d, where)
    try:
        metrics, prompts = _metrics(e, file.cubes), _prompts(e, file.cubes)
    except FieldError as err:
        raise CatalogError(f"{where}: {err}") from None
    as_written = ("answer", "max_new_tokens", "labels", "unparsed_value", "domain", "unit")
    return TaskSpec(
        name=name,
        title=e.title or name,
        metrics=tuple(metrics),
        prompt=prompts[0],
        variants=tuple(prompts[1:]),
        aliases=tuple(e.aliases.items()),
        render=file.render,
        source=where.split(":")[0],
        cube_kind=file.cubes,
        skip_classes=file.skip_classes,
        datasets=file.datasets,
        **{k: getattr(e, k) for k in as_written},
    )


@dataclass(frozen=True)
class Column:
    task: str
    metric: str
    header: str
    probe: str | None = None  # the GFM's probe task answering it (documentation in the file)


@dataclass(frozen=True)
class BoardEntry:
    """A file's `board:` as written; columns default to one per task and metric."""

    NOUN: ClassVar[str] = "board field"

    title: str = "question tasks"
    columns: tuple[Column, ...] | None = None
    per_class: bool = False


@dataclass(frozen=True)
class TaskFile:
    """A catalogs/tasks/*.yaml file: its tasks, their cube kind, its pictures and its board."""

    tasks: dict[str, Any]
    cubes: str = rule(
        "samples",
        choices=tuple(CUBE_KINDS),
        msg="cubes must be one of samples, tiles (the cube kind its tasks ask about), got {v!r}",
    )
    render: dict[str, Any] = field(default_factory=dict)
    board: BoardEntry = field(default_factory=BoardEntry)
    skip_classes: tuple[str, ...] = ()
    datasets: tuple[str, ...] = rule((), what="a list of dataset ids (the cubes its tasks ask)")

    def __post_init__(self):
        if self.skip_classes and self.cubes != "tiles":
            raise FieldError("skip_classes applies to tile cubes (cubes: tiles) only")
        kind = TileRender if self.cubes == "tiles" else RenderSpec
        if not isinstance(self.render, kind):  # the file's mapping, read once
            try:
                object.__setattr__(self, "render", from_mapping(kind, self.render, ""))
            except CatalogError as e:
                raise FieldError(str(e)) from None


def _task_file(path) -> TaskFile:
    return from_mapping(TaskFile, read_yaml(path), str(path))


def load_task_file(path) -> dict[str, TaskSpec]:
    """A task file's tasks with its render, skip_classes and datasets; its board checked too."""
    f = _task_file(path)
    tasks = {n: parse_task(n, d, f"{path}: task {n}", f) for n, d in f.tasks.items()}
    load_board(path, tasks, f)  # its columns name its own tasks and metrics
    return tasks


def load_board(path, tasks: dict[str, TaskSpec] | None = None, f: TaskFile | None = None) -> Board:
    """The file's `board:` (title, columns: [{task, metric, header, probe}], per_class); without
    columns, one per task and metric in file order, headed by the task's title."""
    f = f if f is not None else _task_file(path)
    tasks = tasks if tasks is not None else load_task_file(path)
    cols = f.board.columns or tuple(
        Column(n, m, f"{t.title} {FACTS[m][0]}" + (" (%)" if FACTS[m][2] else ""))
        for n, t in tasks.items()
        for m, _, _ in t.metrics
    )
    for c in cols:
        if c.task not in tasks or c.metric not in [m for m, _, _ in tasks[c.task].metrics]:
            raise CatalogError(
                f"{path}: board: column {c.header!r} names {c.task}.{c.metric}, which no task of"
                " the file scores"
            )
    return Board(
        title=f.board.title,
        columns=tuple((c.task, c.metric, c.header) for c in cols),
        per_class=f.board.per_class,
    )


def board_of(stem: str) -> Board:
    """The board of the catalog task file `stem` (a lab's folder first), as `report` lays it out."""
    for d in catalog_dirs():
        p = d / "tasks" / f"{stem}.yaml"
        if p.exists():
            return load_board(p)
    raise CatalogError(f"no task file {stem}.yaml in catalogs/tasks")


def all_tasks() -> dict[str, TaskSpec]:
    """Every task of catalogs/tasks/*.yaml on the search path (a lab's folder first wins a name)."""
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
    limits its tasks); a named task about another kind of cube or other datasets is refused."""
    tasks = all_tasks()

    def fits(t: TaskSpec) -> bool:
        return not t.datasets or dataset is None or dataset in t.datasets

    if not names:
        return [t for t in tasks.values() if t.cube_kind == cube_kind and fits(t)]
    if bad := [n for n in names if n not in tasks]:
        raise CatalogError(
            f"unknown task {bad[0]!r}; known: {', '.join(tasks)} (catalogs/tasks/*.yaml)"
        )
    if other := [tasks[n] for n in names if tasks[n].cube_kind != cube_kind]:
        raise CatalogError(
            f"task {other[0].name!r} asks about {other[0].cube_kind} cubes ({other[0].source}) and"
            f" this is a {cube_kind} cube; its tasks:"
            f" {', '.join(n for n, t in tasks.items() if t.cube_kind == cube_kind)}"
        )
    if other := [tasks[n] for n in names if not fits(tasks[n])]:
        raise CatalogError(
            f"task {other[0].name!r} asks about {', '.join(other[0].datasets)} cubes only"
            f" ({other[0].source}: datasets) and this cube is {dataset}"
        )
    return [tasks[n] for n in names]


# -- prompts --------------------------------------------------------------------------------------


def picture_text(r: RenderSpec, rendered: bool) -> str:
    """The {picture} sentence of an interferogram prompt (phase or rendering; coherence)."""
    src = "the published rendering of the phase"
    if not rendered:
        src = f"the wrapped phase in a cyclic colour map ({r.phase_colormap}, one colour cycle ="
        src += " one fringe)"
    if r.layout == "phase":
        return f"The picture shows {src}."
    return f"The picture shows, left, {src}; right, the coherence in grey (black = 0, white = 1)."


def _days(a: str, b: str) -> str:
    try:
        return str(abs((_dt.date.fromisoformat(b) - _dt.date.fromisoformat(a)).days))
    except (TypeError, ValueError):
        return "?"


def choices(labels: tuple[str, ...]) -> str:
    """A multiple-choice phrasing's options: "A. low; B. medium; C. high" (parsers map back)."""
    return "; ".join(f"{chr(ord('A') + k)}. {lab}" for k, lab in enumerate(labels))


def fill(task: TaskSpec, sample: dict[str, Any], variant: int = 0) -> str:
    """The prompt of `task` for one sample: a tile's (sample, class) class_name, dataset, picture
    and size; an interferogram's dates, radar_wavelength_m, frame, size and rendering."""
    vals = {
        "choices": choices(task.labels),
        "width": sample.get("width", "?"),
        "height": sample.get("height", "?"),
    }
    if task.cube_kind == "tiles":
        vals |= {
            "labels": " or ".join(task.labels),
            "class_name": str(sample["class_name"]).replace("_", " "),
            "dataset": sample.get("dataset", ""),
            "picture": f"The picture shows {sample.get('picture', 'the tile')}.",
        }
        return task.phrasings[variant].format(**vals)
    lam = float(sample.get("radar_wavelength_m") or float("nan"))
    vals |= {
        "labels": ", ".join(task.labels),
        "primary_date": sample.get("primary_date", "?"),
        "secondary_date": sample.get("secondary_date", "?"),
        "days": _days(sample.get("primary_date", ""), sample.get("secondary_date", "")),
        "wavelength_cm": f"{100 * lam:.2f}",
        "fringe_cm": f"{50 * lam:.2f}",
        "picture": picture_text(task.render, bool(sample.get("rendered"))),
        "frame": sample.get("frame") or "unknown",
    }
    return task.phrasings[variant].format(**vals)
