"""Question-answering tasks as data: catalogs/tasks/*.yaml -> typed `TaskSpec`s, and their prompts.

A task names its answer parser, its metrics with the cube reference each is scored against, a prompt
template and how the interferogram is drawn. Everything is checked when the catalog is read (an
unknown prompt field, parser, metric or reference kind is one sentence naming the file and task), so
a bad task never costs a cluster start. Specs are plain frozen dataclasses: they travel with the tasks
to workers that never saw a lab's catalog folder.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import string
from dataclasses import asdict, dataclass, field
from typing import Any

from ...catalog import CatalogError, _read_yaml, catalog_dirs, need
from .metrics import SCORES
from .parsers import PARSERS

PROMPT_FIELDS = ("labels", "primary_date", "secondary_date", "days", "wavelength_cm", "fringe_cm", "picture", "width",
                 "height", "frame")
REFERENCE_KINDS = ("target", "box", "answer")
RENDER_LAYOUTS = ("side_by_side", "phase")


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
    render: RenderSpec = field(default_factory=RenderSpec)
    source: str = ""  # the catalog file

    @property
    def primary_metric(self) -> str:
        return self.metrics[0][0]

    def digest(self) -> str:
        """The prompt-template hash: everything that decides what the model is asked and how it is read."""
        d = asdict(self)
        d.pop("source")
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    def parser_options(self) -> dict[str, Any]:
        return {"labels": self.labels, "aliases": dict(self.aliases)} if self.answer == "class" else {}


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
        raise CatalogError(f"{where}: render layout {layout!r} is not one of {', '.join(RENDER_LAYOUTS)}")
    ph, co, rd = d.get("phase") or {}, d.get("coherence") or {}, d.get("rendered") or {}
    base = RenderSpec()

    def rng(x, default):
        if x is None:
            return default
        if not (isinstance(x, list) and len(x) == 2 and all(isinstance(v, (int, float)) for v in x) and x[0] < x[1]):
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
    return RenderSpec(layout=layout, phase_band=str(ph.get("band", base.phase_band)),
                      phase_colormap=str(ph.get("colormap", base.phase_colormap)), phase_range=rng(ph.get("range"), base.phase_range),
                      coherence_band=str(co.get("band", base.coherence_band)),
                      coherence_colormap=str(co.get("colormap", base.coherence_colormap)),
                      coherence_range=rng(co.get("range"), base.coherence_range),
                      rendered_phase=tuple(rd.get("phase", base.rendered_phase)),
                      rendered_coherence=str(rd.get("coherence", base.rendered_coherence)),
                      rendered_range=rng(rd.get("range"), base.rendered_range), scale=scale)


def prompt_fields(template: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]


def parse_task(name: str, d: Any, render: RenderSpec, where: str) -> TaskSpec:
    if not isinstance(d, dict):
        raise CatalogError(f"{where}: a task must be a mapping")
    unknown = set(d) - {"title", "answer", "labels", "aliases", "metrics", "prompt", "max_new_tokens", "unparsed_value"}
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
        raise CatalogError(f"{where}: aliases must map labels of the task to lists of words, got {aliases!r}")
    metrics = need(d, "metrics", where, dict)
    ms = []
    for m, ref in metrics.items():
        if m not in SCORES:
            raise CatalogError(f"{where}: unknown metric {m!r}; known: {', '.join(SCORES)}")
        if not (isinstance(ref, dict) and len(ref) == 1 and next(iter(ref)) in REFERENCE_KINDS):
            raise CatalogError(f"{where}: metric {m}: the reference must be one of {{{', '.join(f'{k}: NAME' for k in REFERENCE_KINDS)}}}, got {ref!r}")
        (kind, ref_name), = ref.items()
        ms.append((str(m), kind, str(ref_name)))
    if not ms:
        raise CatalogError(f"{where}: a task needs at least one metric")
    prompt = " ".join(str(need(d, "prompt", where, str)).split())
    try:
        fields = prompt_fields(prompt)
    except ValueError as e:
        raise CatalogError(f"{where}: prompt is not a valid template ({e})") from None
    bad = [f for f in fields if f not in PROMPT_FIELDS]
    if bad:
        raise CatalogError(f"{where}: prompt names unknown field {{{bad[0]}}}; a prompt may use "
                           f"{', '.join('{' + f + '}' for f in PROMPT_FIELDS)}")
    mnt = d.get("max_new_tokens", 32)
    if not isinstance(mnt, int) or mnt < 1:
        raise CatalogError(f"{where}: max_new_tokens must be a positive integer, got {mnt!r}")
    return TaskSpec(name=name, title=str(d.get("title", name)), answer=answer, metrics=tuple(ms), prompt=prompt,
                    max_new_tokens=mnt, labels=labels, aliases=tuple((k, tuple(map(str, v))) for k, v in aliases.items()),
                    unparsed_value=float(d.get("unparsed_value", 0.0)), render=render, source=where.split(":")[0])


def load_task_file(path) -> dict[str, TaskSpec]:
    raw = _read_yaml(path)
    if not isinstance(raw, dict) or not isinstance(raw.get("tasks"), dict):
        raise CatalogError(f"{path}: a task file is a mapping with `tasks:` (and optionally `render:`)")
    unknown = set(raw) - {"tasks", "render"}
    if unknown:
        raise CatalogError(f"{path}: unknown top-level fields {sorted(unknown)}")
    render = _render(raw.get("render"), f"{path}: render")
    return {n: parse_task(n, d, render, f"{path}: task {n}") for n, d in raw["tasks"].items()}


def all_tasks() -> dict[str, TaskSpec]:
    """Every task of catalogs/tasks/*.yaml in the search path (a lab's folder first: its task wins a name)."""
    out: dict[str, TaskSpec] = {}
    for d in catalog_dirs():
        for p in sorted((d / "tasks").glob("*.yaml")):
            for n, t in load_task_file(p).items():
                out.setdefault(n, t)
    return out


def select(names: list[str] | None) -> list[TaskSpec]:
    from ...errors import UserError

    tasks = all_tasks()
    if not names:
        return list(tasks.values())
    bad = [n for n in names if n not in tasks]
    if bad:
        raise UserError(f"unknown task {bad[0]!r}; known: {', '.join(tasks)} (catalogs/tasks/*.yaml)")
    return [tasks[n] for n in names]


# -- prompts --------------------------------------------------------------------------------------


def picture_text(r: RenderSpec, rendered: bool) -> str:
    src = "the published rendering of the phase" if rendered else f"the wrapped phase in a cyclic colour map ({r.phase_colormap}, one colour cycle = one fringe)"
    if r.layout == "phase":
        return f"The picture shows {src}."
    return f"The picture shows, left, {src}; right, the coherence in grey (black = 0, white = 1)."


def _days(a: str, b: str) -> str:
    try:
        return str(abs((_dt.date.fromisoformat(b) - _dt.date.fromisoformat(a)).days))
    except (TypeError, ValueError):
        return "?"


def fill(task: TaskSpec, sample: dict[str, Any]) -> str:
    """The prompt of `task` for one sample (`sample`: primary_date, secondary_date, radar_wavelength_m, frame,
    width, height, rendered)."""
    lam = float(sample.get("radar_wavelength_m") or float("nan"))
    vals = {"labels": ", ".join(task.labels), "primary_date": sample.get("primary_date", "?"),
            "secondary_date": sample.get("secondary_date", "?"),
            "days": _days(sample.get("primary_date", ""), sample.get("secondary_date", "")),
            "wavelength_cm": f"{100 * lam:.2f}", "fringe_cm": f"{50 * lam:.2f}",
            "picture": picture_text(task.render, bool(sample.get("rendered"))), "width": sample.get("width", "?"),
            "height": sample.get("height", "?"), "frame": sample.get("frame") or "unknown"}
    return task.prompt.format(**vals)
