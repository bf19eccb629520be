"""The vqa family's report: a board per cube of VLMs and GFMs side by side (columns from the task
file's `board:`), then per task tables, a fringe plot, a gallery and LEADERBOARD.md (docs/vlm.md).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ... import store
from ...catalog import CatalogError
from ...questions.cells import unit
from ...questions.tasks import Board, all_tasks, board_of
from ...report import plots
from ...report.board import Cube, about, cell_text
from ...report.board import cubes as board_cubes
from ...report.records import Results, Run
from ...report.tables import MISSING, Column, Table, columns, to_markdown

CANNOT = "cannot answer (encoder)"
NOT_IN_CUBE = f"{MISSING} (not in cube)"
TOO_FEW = "too few to test"
NOT_ASKED = "not asked"
NOT_RUN = "blind: not run"
BOX_ROUTE = "segmentation, mask->box"
TEXT_METRICS = ("token_f1",)  # scored against text: no encoder writes it


def cubes(res: Results) -> list[Cube]:
    """One board per (dataset, cube, split) the vqa and heads runs were scored on."""
    return board_cubes(res.of("vqa") + res.of("heads"))


def _of(res: Results, family: str, cube: Cube) -> list[Run]:
    return sorted((r for r in res.of(family) if cube.holds(r)), key=lambda r: r.model_name)


@dataclass
class BoardRow:
    """A board row, and what its columns without a cell say (not asked, cannot answer, ...)."""

    name: str
    kind: str
    cells: dict  # (task, metric, class) -> cell
    missing: Callable[[str, str], str]  # (task, metric) -> what the empty cell says
    baseline: bool = False
    unparsed: Callable[[str | None], str] = lambda cls: MISSING  # per class (None: every class)


def _by_key(cells: list[dict]) -> dict:
    return {(c["task"], c["metric"], c.get("class")): c for c in cells or []}


def _tasks_of(r: Run, key: str) -> set:
    return set(r.record.get(key) or {})


def _unparsed(cells: list[dict], cls: str | None) -> str:
    """A VLM row's Unparsed cell (test split) for one class (None: every class), once per task."""
    cs = list({c["task"]: c for c in reversed(cells) if c.get("class") == cls}.values())
    if not cs:
        return MISSING
    return f"{sum(int(c.get('unparsed', 0)) for c in cs)} / {sum(int(c['n']) for c in cs)}"


def _run_row(r: Run, name: str, kind: str, baseline: bool = False) -> BoardRow:
    """A VLM's or a head's row: a task it was asked (a head: or a text task) without a cell is one
    the VLM left empty or the encoder cannot answer."""
    cs, vlm = r.metrics.get("cells") or [], r.family == "vqa"
    asked = _tasks_of(r, "tasks") | _tasks_of(r, "tasks_text")
    left, first = _tasks_of(r, "tasks_left_out"), MISSING if vlm else CANNOT
    return BoardRow(
        name,
        kind,
        _by_key(cs),
        lambda t, m: first if t in asked else (NOT_IN_CUBE if t in left else NOT_ASKED),
        baseline,
        (lambda cls: _unparsed(cs, cls)) if vlm else (lambda cls: MISSING),
    )


def _localiser_rows(res: Results, cube: Cube) -> list[BoardRow]:
    """Per model, its latest segmentation run on the board's cube that scored localisation."""
    runs = sorted(res.runs, key=lambda r: r.created)
    latest = {r.model: r for r in runs if cube.holds(r) and r.record.get("localisation")}
    rows = []
    for r in sorted(latest.values(), key=lambda r: r.model_name):
        loc = r.record.fields["localisation"]
        cells = {(loc["task"], "box_iou", None): {**loc, "class": None, "how": BOX_ROUTE}}
        rows.append(BoardRow(r.model_name, "GFM (segmentation)", cells, _boxes_only))
    return rows


def _boxes_only(task: str, metric: str) -> str:
    return CANNOT if metric in TEXT_METRICS else f"{MISSING} (segmentation answers boxes only)"


def _baseline_rows(vlms: list[Run], heads: list[Run]) -> list[BoardRow]:
    """The chance row (any run's baselines) and the blind rows, or one saying blind did not run."""
    # tasks the cube has no reference for, by any run's record
    left = set().union(*[_tasks_of(r, "tasks_left_out") for r in vlms + heads])
    baselines = [(r.metrics.get("baselines") or {}).get("chance") for r in vlms + heads]
    chance = next((c for c in baselines if c), None)
    rows = []
    if chance:
        why = lambda t, m: NOT_IN_CUBE if t in left else "cannot answer (chance)"  # noqa: E731
        rows.append(BoardRow("chance", "baseline: chance", _by_key(chance), why, True))
    blind = [r for r in vlms if r.record.get("blind")]
    rows += [_run_row(r, f"{r.model_name} (blind)", "baseline: blind", True) for r in blind]
    if not blind:
        why = lambda t, m: NOT_IN_CUBE if t in left else NOT_RUN  # noqa: E731
        rows.append(BoardRow("blind", "baseline: blind", {}, why, True))
    return rows


def board_rows(res: Results, cube: Cube) -> list[BoardRow]:
    """The board's rows: chance, blind (or that it did not run), VLMs, heads, segmentation boxes."""
    vlms, heads = (
        sorted((r for r in res.of(f) if cube.holds(r)), key=lambda r: (r.model_name, r.run_id))
        for f in ("vqa", "heads")
    )
    return (
        _baseline_rows(vlms, heads)
        + [_run_row(r, r.model_name, "VLM") for r in vlms if not r.record.get("blind")]
        + [_run_row(r, r.model_name, "GFM (linear head)") for r in heads]
        + _localiser_rows(res, cube)
    )


def _header(task, metric: str, header: str, units: set[str]) -> str:
    """A column's header with its unit: its cells', or (no cell) the one its task's would have."""
    t = None if units else all_tasks().get(task)
    if t is not None and metric in [m for m, _, _ in t.metrics]:
        units = {unit(t, metric)}
    u = next(iter(units)) if len(units) == 1 else ""
    return header if not u or f"({u})" in header else f"{header} ({u})"


def _refusal(cell: dict, first: str, fc: dict) -> str | None:
    """Why a cell cannot share its column with the column's first cell (`first`'s), or None."""
    if cell.get("unit") != fc.get("unit"):
        return f"in {cell.get('unit')!r}, the column's unit is {fc.get('unit')!r}"
    if cell.get("samples") != fc.get("samples"):
        return (
            f"is over other samples (hash {cell.get('samples')}, n {cell.get('n')})"
            f" than {first}'s (hash {fc.get('samples')}, n {fc.get('n')})"
        )
    return None


def _layout(
    rows: list[BoardRow], cols, classes: list, cube_name: str, b_per_class: bool = False
) -> tuple[list[list], list[list], list[str], list[str]]:
    """(raw rows, text rows, headers, notes): per column the first cell (in row order: chance first)
    fixes its samples and unit; a later cell over other samples or in another unit is refused."""
    notes: list[str] = []
    raws, txts = [], []
    ref: dict[tuple, tuple[str, dict]] = {}
    units: dict[tuple, set] = {}
    for row in rows:
        # a row without cells (blind not run) shows once
        for c in classes if row.cells else [None]:
            if c is not None and not any(k[2] == c for k in row.cells):
                continue
            raw = [row.name, row.kind] + ([c or "all"] if b_per_class else [])
            txt = list(raw)
            for task, m, header in cols:
                cell = row.cells.get((task, m, c))
                if cell is None:
                    raw.append(None)
                    txt.append(row.missing(task, m))
                    continue
                if (task, m, c) not in ref:
                    ref[(task, m, c)] = (row.name, cell)
                    units.setdefault((task, m), set()).add(cell.get("unit", ""))
                if why := _refusal(cell, *ref[(task, m, c)]):
                    raw.append(None)
                    txt.append(f"refused (other {'samples' if 'samples' in why else 'unit'})")
                    notes.append(
                        f"{cube_name}, column {header!r}{'' if c is None else ', class ' + c}:"
                        f" {row.name}'s cell {why}, so it is left out: a column holds one metric in"
                        " one unit over one set of samples"
                    )
                    continue
                raw.append(cell["value"])
                how = cell.get("how") or ""
                txt.append(
                    cell_text(cell) + (f" ({how})" if "box" in how and not row.baseline else "")
                )
            raws.append(raw + [None])
            txts.append(txt + [row.unparsed(c)])
    headers = [_header(task, m, h, units.get((task, m), set())) for task, m, h in cols]
    return raws, txts, headers, notes


NOTES = [
    "each cell: the value on the cube's test split with its 95 % bootstrap interval and n, the"
    " number of test questions scored; every row of a column is scored on the same samples (the"
    " cell's sample hash) in one unit",
    "baselines (not ranked): chance answers the train split's majority class, mean number or"
    " mean box; blind is a VLM shown a blank picture of the same size (`--set blind=true`):"
    " what a model scores without the picture",
    "VLM: an unparsed answer counts as wrong (IoU 0, F1 0, MAE against the task's unparsed"
    " value); Unparsed: unparsed / asked on the test split. The VLM's figure over every sample"
    " asked is the per-task table below",
    "GFM (linear head): a linear head on the frozen encoder's pooled features (`--protocol"
    " heads`), regularisation chosen on the val split; a box from a box head, or from a"
    " segmentation run's predicted mask (mask->box, `--protocol frozen`) where the cell says"
    " so; encoders cannot write text",
    "probe F1 / R² (NeuCo-Bench) stay in the embedding report: another metric on other samples",
]


def _answered(res: Results, cube: Cube) -> list[Run]:
    return [r for r in res.of("vqa") + res.of("heads") if cube.holds(r)]


def board(res: Results, cube: Cube) -> Board:
    """The board of every task file the cube's VLM and head runs answered, the dataset's own file's
    columns first (a Hephaestus cube: its file, then InSAR-VLM-Bench's); else InSAR-VLM-Bench's."""
    known = all_tasks()
    # file stem -> whether its tasks are this dataset's own (`datasets:`)
    stems: dict[str, bool] = {}
    for r in _answered(res, cube):
        for name, d in (r.record.get("tasks") or {}).items():
            if d.get("source"):
                stem = Path(str(d["source"])).stem
                own = bool(getattr(known.get(name), "datasets", ()))
                stems[stem] = stems.get(stem, False) or own
    boards = []
    for stem in sorted(stems, key=lambda s: (not stems[s], s)):
        try:
            boards.append(board_of(stem))
        except CatalogError:
            continue  # a file that moved: its tasks' cells have no column
    if len(boards) < 2:
        return boards[0] if boards else board_of("insar")
    cols: dict[tuple, tuple] = {}  # (task, metric) -> its column: the first board's
    for c in (c for b in boards for c in b.columns):
        cols.setdefault(c[:2], c)
    title = "; ".join(b.title for b in boards)
    return Board(title, tuple(cols.values()), any(b.per_class for b in boards))


def leaderboard(res: Results, cube: Cube) -> Table:
    """One cube's board as a table: baselines, VLMs and GFMs, the task file's columns, per class."""
    b = board(res, cube)
    rows = board_rows(res, cube)
    classes: list = [None]
    if b.per_class:  # a row per class, and one over every class where there are several
        named = sorted({k[2] for r in rows for k in r.cells if k[2] is not None})
        classes = ([None] if len(named) > 1 else []) + named
    raws, txts, headers, notes = _layout(rows, b.columns, classes, cube.name, b.per_class)
    lead = "model=Model; kind=Kind" + ("; class=Class" if b.per_class else "")
    which = ", ".join(x for x in (cube.dataset, about(cube)) if x)
    cols = [Column(f"{task}.{m}", h) for (task, m, _), h in zip(b.columns, headers)]
    cols = columns(lead, text="model kind class") + cols + [Column("unparsed", "Unparsed")]
    title = f"{b.title} on {cube.name} ({which}): VLMs and GFMs on the same test samples"
    t = Table(f"leaderboard_{cube.slug}", title, cols, notes=NOTES + notes + _split_note(res, cube))
    for raw, txt in zip(raws, txts):
        t.add(raw, txt)
    if any(r.random_init for r in _answered(res, cube) + res.runs if cube.holds(r)):
        t.notes.append("(random init) rows measure the pipeline, not a model")
    return t


def _split_classes(res: Results, cube: Cube) -> dict:
    """The board split's answer classes per task (a sample cube's record), {} where none says."""
    splits = [r.record.get("board_split") for r in _answered(res, cube)]
    split = next((s for s in splits if isinstance(s, dict)), {})
    return split.get("classes") or {}


def _split_note(res: Results, cube: Cube) -> list[str]:
    """The line under a sample cube's board: test samples per answer class, which are too few."""
    parts = []
    for task, by in _split_classes(res, cube).items():
        cs = ", ".join(
            f"{c} {n['test']}" if n["test"] else f"{c} {TOO_FEW} ({sum(n.values())} samples)"
            for c, n in by.items()
        )
        parts.append(f"{task}: {cs}")
    return [f"test split per class: {'; '.join(parts)}"] if parts else []


def split_table(res: Results, cube: Cube) -> Table | None:
    """A sample cube's answer classes per split ("too few to test"); None for a tile cube."""
    classes = _split_classes(res, cube)
    if not classes:
        return None
    t = Table(
        f"split_{cube.slug}",
        f"The board's split of {cube.name} per answer class",
        columns("task=Task; class=Class; train=Train; val=Val; test=Test", text="task class"),
        notes=[
            "a class with fewer samples than splits (3) cannot be in train, val and test at once:"
            " it reads 'too few to test', and the board's cells hold no test sample of it"
        ],
    )
    for task, by in classes.items():
        for c, n in by.items():
            row = [task, c, n["train"], n["val"], n["test"] or None]
            t.add(row, [str(x) for x in row[:4]] + [str(n["test"]) if n["test"] else TOO_FEW])
    return t


def task_table(res: Results, cube: Cube) -> Table:
    """Each VLM run's per-task metrics over every sample asked, prompt hash and generation cost."""
    t = Table(
        f"tasks_{cube.slug}",
        f"Per task metrics on {cube.name} over every sample asked (the VLM's all-samples "
        "figure: a second figure, not the board's test split)",
        columns(
            "model=Model; task=Task; metric=Metric; value=Value; ci_low=CI low; ci_high=CI high;"
            " n=n; unparsed=Unparsed; prompt=Prompt sha256",
            text="model task metric prompt",
        ),
    )
    for r in _of(res, "vqa", cube):
        for task, d in (r.metrics.get("tasks") or {}).items():
            sha = ((r.record.get("tasks") or {}).get(task) or {}).get("prompt_sha256", "")
            for m, s in d.get("metrics", {}).items():
                figures = [s[k] for k in ("value", "ci_low", "ci_high", "n")]
                t.add([r.model_name, task, m, *figures, d.get("unparsed"), sha])
        t.notes.append(generation_cost(r))
    return t


def _phrasings(p: list[dict]) -> str:
    """Each phrasing's unparsed answers of those asked: "#1: 0 of 12; #2 (MC): 3 of 12"."""
    return "; ".join(
        f"#{k + 1}{' (MC)' if q.get('multiple_choice') else ''}: {q['unparsed']} of {q['n']}"
        for k, q in enumerate(p)
    )


def phrasing_table(res: Results, cube: Cube) -> Table | None:
    """Per model and task asked in several phrasings: the primary metric's mean and spread."""
    cols = columns(
        "model=Model; task=Task; metric=Metric; phrasings=Phrasings; mean=Mean; sd=SD;"
        " min=Min; max=Max; first=First (the board's phrasing);"
        " unparsed=Unparsed of asked, per phrasing",
        text="model task metric unparsed",
    )
    title = f"Prompt phrasings on {cube.name}: mean and spread over each task's phrasings"
    t = Table(
        f"phrasings_{cube.slug}",
        title,
        cols,
        notes=[
            "SD: the sample standard deviation over phrasings; MC: the multiple-choice phrasing"
            " (lettered options); Unparsed: per phrasing in the task file's order (#1 is the"
            ' board\'s), its unparsed answers of those asked ("#2 (MC): 3 of 12"); every phrasing'
            " is asked of the same samples; figures over every sample asked (the board's cell:"
            " the first phrasing on the test split)"
        ],
    )
    for r in _of(res, "vqa", cube):
        for task, d in (r.metrics.get("tasks") or {}).items():
            ph = d.get("phrasings") or []
            m = next(iter(d.get("metrics") or {}), None)
            vals = [p["metrics"][m]["value"] for p in ph if m and m in p.get("metrics", {})]
            if len(vals) >= 2:
                spread = [statistics.fmean(vals), statistics.stdev(vals), min(vals), max(vals)]
                t.add([r.model_name, task, m, len(vals), *spread, vals[0], _phrasings(ph)])
    return t if t.rows else None


def generation_cost(r: Run) -> str:
    """The run's worker seconds inside generate() per question (no model load, rendering or
    parsing; from generation_stats); answers kept from an earlier run were not timed."""
    n = int((r.record.get("generation_stats") or {}).get("questions_generated") or 0)
    sec = (r.record.get("timings") or {}).get("generate_s")
    if not n or not sec:
        return f"{r.model_name}: no generation timed (answers kept from an earlier run)"
    return (
        f"{r.model_name}: {sec / n:.3g} s per example ({n} questions generated in {sec:.3g} s,"
        f" batch {(r.record.get('generation') or {}).get('batch', '?')},"
        f" {r.record.get('torch_threads')} torch threads,"
        f" {(r.record.get('precision') or {}).get('effective', '?')})"
    )


def confusion_tables(res: Results, cube: Cube) -> list[Table]:
    """A table per VLM run and class task: reference rows, answer columns, then the unparsed."""
    out = []
    for r in _of(res, "vqa", cube):
        for task, d in (r.metrics.get("tasks") or {}).items():
            if c := d.get("confusion"):
                t = Table(
                    f"confusion_{task}_{r.run_id[:8]}",
                    f"{r.model_name}: {task} (rows reference, columns answer)",
                    [Column("reference", "Reference", numeric=False)]
                    + [Column(x, x) for x in c["labels"]]
                    + [Column("unparsed", "unparsed")],
                )
                for lab, row in zip(c["labels"], c["matrix"]):
                    t.add([lab, *row])
                out.append(t)
    return out


def _fringe_pairs(r: Run) -> list:
    return ((r.metrics.get("tasks") or {}).get("fringe_counting") or {}).get("pairs") or []


def fringe_plot(res: Results, cube: Cube, stem: Path) -> list[Path]:
    """Answered against true fringe counts, a series per VLM run (unparsed in the legend), y = x."""
    fig, ax = plots.panel((4.6, 4.2))
    hi = 1.0
    for r in _of(res, "vqa", cube):
        if pairs := _fringe_pairs(r):
            pts = [(a, b) for a, b in pairs if b is not None]
            xs, ys = [a for a, _ in pts], [b for _, b in pts]
            hi = max([hi, *xs, *ys])
            label = f"{r.model_name} ({len(pairs) - len(pts)} unparsed)"
            ax.scatter(xs, ys, s=18, alpha=0.7, label=label)
    ax.plot([0, hi], [0, hi], color="#888", lw=0.8, ls="--")
    labels = ("true fringe count", "answered fringe count")
    return plots.finish(
        ax, stem, f"Fringe counting on {cube.name}", *labels, legend={"fontsize": 7}
    )


def _question(q: dict, sample) -> tuple:
    return sample, q["task"], q.get("class"), q.get("variant", 0)


def gallery(res: Results, cube: Cube, figures: Path) -> list[tuple[Path | None, str, Table]]:
    """Per gallery sample: its picture (the first run's, in `figures`), a caption, the answers."""
    runs = _of(res, "vqa", cube)
    if not runs:
        return []
    rdir = str(runs[0].record.get("answers_file", "")).rsplit("/", 1)[0]
    answers = [  # each run's gallery answers by (sample, task, class, phrasing)
        {_question(q, gg["sample"]): q for gg in r.record.get("gallery") or [] for q in gg["qa"]}
        for r in runs
    ]
    out = []
    for g in runs[0].record.get("gallery") or []:
        t = Table(
            f"gallery_{g['sample']}",
            f"sample {g['source']}",
            columns("task=Task; question=Question; reference=Reference", "task question reference")
            + [Column(f"answer_{k}", r.model_name, numeric=False) for k, r in enumerate(runs)],
        )
        for q in g["qa"]:
            ref = "; ".join(f"{m}: {v}" for m, v in q["reference"].items())
            said = [
                (a.get(_question(q, g["sample"])) or {}).get("answer", MISSING) or "(empty)"
                for a in answers
            ]
            row = [q["task"], q["question"], ref, *said]
            t.add(row, [str(x) for x in row])
        pic = figures / f"vqa_{cube.slug}_{g['picture'].rsplit('/', 1)[-1]}"
        try:
            data = store.read_bytes(f"{rdir}/{g['picture']}")
        except (OSError, ValueError):
            pic = None  # the run folder moved: the answers stay, the picture is left out
        else:
            pic.parent.mkdir(parents=True, exist_ok=True)
            pic.write_bytes(data)
        out.append((pic, f"{g['source']}: the picture the models were shown", t))
    return out


def leaderboard_md(res: Results) -> str:
    """LEADERBOARD.md: a table per cube (columns from its task file), split counts under it."""
    boards = cubes(res)
    titles = sorted({board(res, c).title for c in boards}) or ["InSAR-VLM-Bench tasks"]
    parts = [
        f"# Leaderboard ({'; '.join(titles)})",
        "",
        "Written by `cryocube report`; every number is read from the run records (results.jsonl).",
        "",
    ]
    for c in boards:  # the test split per class is the last note under each
        parts += [to_markdown(leaderboard(res, c)), ""]
    return "\n".join(parts)


def sections(page, res: Results) -> None:
    """`Vqa.report_sections`: per cube a board and its tables; LEADERBOARD.md beside the report."""
    if not res.of("vqa") and not res.of("heads"):
        return
    for c in cubes(res):
        sec = page.section(
            f"{board(res, c).title} ({c.dataset}) on {c.name}"
            + (f" ({about(c)})" if about(c) else "")
            + ": VLMs and GFMs",
            text="Each task's metric on the cube's test split with its 95 % bootstrap interval and"
            " n, beside the chance and blind baselines; unparsed answers count as wrong.",
        )
        tables = [f(res, c) for f in (leaderboard, split_table, task_table, phrasing_table)]
        page.table(sec, "vqa", *[t for t in tables + confusion_tables(res, c) if t is not None])
        if any(_fringe_pairs(r) for r in _of(res, "vqa", c)):
            stem = page.stem(f"vqa_fringes_{c.slug}")
            caption = f"{c.name}: answered against true fringe counts"
            page.figure(sec, fringe_plot(res, c, stem), caption)
        for pic, caption, t in gallery(res, c, page.figures_dir):
            sub = page.section(f"Gallery: {t.title}", level=3)
            if pic is not None:
                page.picture(sub, pic, caption)
            page.table(sub, "vqa", t)
    page.add_file("LEADERBOARD.md", leaderboard_md(res))
