"""`build_report`: results (and/or a published table) -> tables, figures and one HTML file (the
folder's layout: docs/report.md)."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .. import families, outputs
from ..catalog import DEFAULT_TASK, CatalogError, load_dataset
from ..errors import ReportError
from ..models.profile import measured_costs
from ..report import intervals, plots, stats
from ..report.html import FigureRef, Section, write_html
from ..report.leaderboard import Leaderboard, leaderboard_from_runs
from ..report.names import protocol_sort_key, protocol_title
from ..report.published import (
    Mismatch,
    check_consistency,
    load_leaderboard_csv,
    published_leaderboard,
)
from ..report.records import Results, Run, load_results
from ..report.tables import ALL_FORMATS, RENDERERS, Table, to_markdown, write_table
from . import analysis, sweeps
from .qualitative import find_predictions, qualitative_panels


@dataclass
class Report:
    out: Path
    files: list[Path] = field(default_factory=list)
    html: Path | None = None
    leaderboards: dict[str, Leaderboard] = field(default_factory=dict)
    tables: dict[str, Table] = field(default_factory=dict)  # "<group>/<name>" -> table
    figures: list[Path] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)
    results: Results | None = None
    final: Path | None = None  # where the report is swapped in (`out` is the folder it is built in)
    # per board key: its cells' intervals and across-dataset aggregates (docs/statistics.md)
    uncertainty: dict[str, intervals.BoardIntervals] = field(default_factory=dict)
    # the tables `cryocube report` prints: intervals, across datasets, paired comparisons
    printed: list[Table] = field(default_factory=list)


def _title(protocol: str, fraction: float) -> str:
    base, _, part = protocol.partition(":")
    t = protocol_title(base) + (
        f" ({part}: deformation masks, not in the Cryo-Bench averages)" if part else ""
    )
    return t if math.isclose(fraction, 1.0) else f"{t}, {fraction * 100:g}% labels"


def group_runs(runs: Sequence[Run]) -> dict[tuple[str, float], list[Run]]:
    """Runs per (protocol, fraction) board; interferogram cubes get `<protocol>:interferograms`."""
    groups: dict[tuple[str, float], list[Run]] = defaultdict(list)
    for r in runs:
        try:  # the dataset's catalog task: interferogram runs stay out of Cryo-Bench's boards
            task = load_dataset(r.dataset).task
        except (CatalogError, OSError):
            task = DEFAULT_TASK
        proto = r.protocol if task == DEFAULT_TASK else f"{r.protocol}:interferograms"
        groups[(proto, r.fraction)].append(r)
    return dict(sorted(groups.items(), key=lambda kv: (protocol_sort_key(kv[0][0]), -kv[0][1])))


def _metadata(res: Results | None, rep: Report, extra: dict[str, str]) -> dict[str, str]:
    meta: dict[str, str] = {}
    if res is not None:
        runs = res.runs + res.failures
        left = f", {len(res.other_recipes)} of other recipes left out of the leaderboards"
        rnd = ", ".join(sorted({r.model for r in runs if r.random_init}))
        created = sorted(r.created for r in runs if r.created)
        gpu, cpu = (
            sum(r.total_s or 0 for r in res.runs if r.device.startswith("cuda") == on_gpu) / 3600
            for on_gpu in (True, False)
        )
        meta = {
            "results files": ", ".join(map(str, res.sources)),
            "runs": f"{len(res.runs)} ok, {len(res.failures)} failed, {len(res.replaced)} older"
            f" duplicates replaced{left if res.other_recipes else ''}",
            "protocols": ", ".join(sorted({r.protocol for r in runs}, key=protocol_sort_key)),
            "seeds": ", ".join(map(str, sorted({r.seed for r in runs}))),
            "devices": ", ".join(sorted({r.device for r in runs if r.device})) or "–",
            "precision": ", ".join(sorted({r.precision for r in runs})) or "–",
            "random-init models": rnd or "none (every pretrained model loaded its checkpoint)",
            **({"run times": f"{created[0]} … {created[-1]}"} if created else {}),
            "compute": f"{gpu:.3f} GPU hours, {cpu:.3f} CPU hours (successful runs)",
        }
        cubes = {}
        versions: dict[str, set[str]] = defaultdict(set)
        for r in runs:
            if r.cube.get("url"):
                cubes[str(r.cube["url"])] = str(r.cube.get("checksum", ""))
            for k, x in (r.versions or {}).items():
                versions[str(k)].add(str(x))
        for u, c in sorted(cubes.items()):
            meta[f"cube {u}"] = f"checksum {c}" if c else "no checksum recorded"
        if versions:
            meta["versions"] = "; ".join(
                f"{k} {' / '.join(sorted(v))}" for k, v in sorted(versions.items())
            )
    return meta | extra | {"report files": str(rep.final or rep.out)}


@dataclass
class _Writer:
    """Writes tables and figures and keeps them for the page; families write their sections through
    it (`Family.report_sections`): section, table, figure, picture, stem and add_file."""

    rep: Report
    all_formats: list[str]
    measured: dict[str, dict]  # model id -> measured compute profile (`list models --profile`)
    draws: int = 2000  # bootstrap draws per interval (report/stats.py)
    sections: list[Section] = field(default_factory=list)

    @property
    def formats(self) -> list[str]:
        """The table formats asked for (md, csv, json, tex): the page's are written apart."""
        return [f for f in self.all_formats if f in RENDERERS]

    def section(self, title: str, level: int = 2, text: str = "") -> Section:
        s = Section(title, level=level, text=text)
        self.sections.append(s)
        return s

    def table(self, sec: Section, group: str, *tables: Table) -> list[Table]:
        """Writes the tables into the folder `group` ("": the top level) and shows them in `sec`."""
        for t in tables:
            t.group = group
            self.rep.files += write_table(t, self.rep.out / group, self.formats)
            self.rep.tables[f"{group}/{t.name}".lstrip("/")] = t
            sec.tables.append(t)
        return list(tables)

    def figure(self, sec: Section, paths: list[Path], caption: str) -> None:
        self.rep.files += paths
        self.rep.figures += paths
        png = next(p for p in paths if p.suffix == ".png")
        sec.figures.append(FigureRef(png, caption))

    def stem(self, name: str) -> Path:
        return self.rep.out / "figures" / name

    def picture(self, sec: Section, path: Path, caption: str) -> None:
        """A picture already written (a gallery's PNG) shown in a section."""
        self.rep.files.append(path)
        sec.figures.append(FigureRef(path, caption))

    def add_file(self, name: str, text: str) -> Path:
        """A file of its own beside the report (a family's LEADERBOARD.md)."""
        p = self.rep.out / name
        p.write_text(text, encoding="utf-8")
        self.rep.files.append(p)
        return p

    @property
    def figures_dir(self) -> Path:
        return self.rep.out / "figures"


def _protocol_sections(
    w: _Writer, res: Results, protocols: set[str] | None
) -> dict[tuple[str, float], Leaderboard]:
    groups = group_runs(res.runs)
    fractions = Counter(p for p, _ in groups)  # boards (one per fraction) of each protocol
    lbs = {}
    for (proto, frac), runs in groups.items():
        base = proto.partition(":")[0]
        if protocols and base not in protocols:
            continue
        key = proto if fractions[proto] == 1 else f"{proto}-{round(frac * 100):g}pct"
        key = key.replace(":", "-")
        lb = leaderboard_from_runs(
            runs, key=key, title=_title(proto, frac), protocol=base, fraction=frac
        )
        lbs[(proto, frac)] = lb
        w.rep.leaderboards[key] = lb
        cost = analysis.costs(runs, w.measured)
        sec = w.section(lb.title)
        w.table(sec, key, analysis.leaderboard_table(lb, cost), analysis.robustness_table(lb))
        radar = plots.radar_chart(lb, w.stem(f"{key}_radar"))
        w.figure(sec, radar, f"{lb.title}: mIoU per dataset")
        w.table(sec, key, analysis.cost_table(lb, cost))
        pts = [
            (r.name, c.gflops, r.avg, c.gflops_source)
            for r in lb.rows
            if (c := cost.get(r.name)) and c.gflops and r.avg is not None
        ]
        if pts:
            stem, title = w.stem(f"{key}_miou_vs_gflops"), f"{lb.title}: accuracy vs cost"
            w.figure(
                sec,
                plots.cost_scatter(pts, stem, title),
                "Average mIoU against GFLOPs per forward pass (measured where a profile exists; "
                '"(catalog)": the published figure, copied)',
            )
        _interval_tables(w, sec, key, lb, runs)
        if pc := w.table(sec, key, *analysis.per_class_tables(lb, runs)):
            heat = plots.per_class_heatmap(
                pc, w.stem(f"{key}_per_class_iou"), f"{lb.title}: per-class IoU"
            )
            w.figure(sec, heat, "Per-class IoU (%) per model and dataset")
    return lbs


def _interval_tables(w: _Writer, sec: Section, key: str, lb: Leaderboard, runs) -> None:
    """A board's uncertainty (docs/statistics.md): intervals; from two models, rliable's figures."""
    bi = intervals.board_intervals(lb, runs, draws=w.draws)
    w.rep.uncertainty[key] = bi
    w.rep.printed += w.table(sec, key, intervals.cells_table(bi), intervals.aggregate_table(bi))
    if len(bi.aggregates) < 2:
        return
    w.rep.printed += w.table(sec, key, intervals.improvement_table(bi))
    rows = [
        (m, a.iqm, a.iqm_lo, a.iqm_hi, a.mean, a.mean_lo, a.mean_hi)
        for m, a in sorted(bi.aggregates.items(), key=lambda kv: -kv[1].iqm)
    ]
    w.figure(
        sec,
        plots.interval_estimates(rows, w.stem(f"{key}_iqm"), f"{lb.title}: across datasets"),
        "IQM and mean of the (dataset, seed) mIoU per model, 95 % stratified bootstrap intervals",
    )
    models = [m for m in lb.model_names if m in bi.scores]
    pairs = [[bi.improvement.get((x, y), (np.nan,) * 3)[:3] for y in models] for x in models]
    mat = np.moveaxis(np.array(pairs, dtype=float), -1, 0)  # P, lo, hi: each models x models
    stem, title = w.stem(f"{key}_improvement"), f"{lb.title}: probability of improvement"
    heat = plots.improvement_heatmap(models, *mat, stem, title)
    w.figure(
        sec, heat, "P(X > Y): the chance that model X beats model Y on a dataset, [95 % interval]"
    )
    taus = intervals.profile_taus(bi.scores)
    profile = stats.performance_profile(bi.scores, taus)
    title = f"{lb.title}: performance profile"
    plot = plots.performance_profile(taus, profile, w.stem(f"{key}_profile"), title)
    w.figure(sec, plot, "Fraction of each model's (dataset, seed) runs above each mIoU")


def _paired_section(w: _Writer, pairs: Sequence[tuple[str, str]]) -> None:
    """`--compare A,B`: A - B on every board and dataset both ran, paired over the same draws."""
    boards = list(w.rep.uncertainty.values())
    if not pairs:
        return
    sec = w.section("Paired comparisons")
    for a, b in pairs:
        a, b = intervals.resolve_model(a, boards), intervals.resolve_model(b, boards)
        stem = "paired_" + "_vs_".join(
            "".join(ch if ch.isalnum() else "_" for ch in m).strip("_").lower() for m in (a, b)
        )
        t = intervals.paired_table(boards, a, b, stem)
        if t is None:
            raise ReportError(f"--compare {a},{b}: no protocol board where both models ran")
        w.rep.printed += w.table(sec, "compare", t)


def _compare_sections(w: _Writer, lbs: dict[tuple[str, float], Leaderboard]) -> None:
    full = {p: lb for (p, f), lb in lbs.items() if math.isclose(f, 1.0)}  # at 100 % labels
    frozen, ft = full.get("frozen"), full.get("finetune")
    if frozen is None:
        return
    few = [lb for (p, f), lb in lbs.items() if p == "fewshot" and f < 1.0]
    if few or ft:
        sec = w.section("Across protocols")
    for lb in few:
        t = analysis.retention_table(frozen, lb)
        if len(few) > 1:
            t.name = f"fewshot_retention_{lb.key}"
        w.table(sec, "compare", t)
        w.figure(sec, plots.retention_bars(t, w.stem(t.name)), t.title)
    if ft is not None:
        w.table(sec, "compare", analysis.finetune_gain_table(frozen, ft))
    paper = published_leaderboard()
    if any(paper.row(m) for m in frozen.model_names):
        sec = w.section("Our runs against the paper")
        w.table(sec, frozen.key, analysis.published_comparison_table(frozen, paper))


def _family_sections(w: _Writer, res: Results) -> None:
    """Every installed family's sections, in registry order; runs of a missing family are listed."""
    known = families.names()
    for name in known:
        families.get(name).report_sections(w, res)
    if lost := sorted(f for f, runs in res.by_family.items() if runs and f not in known):
        w.section(
            "Runs of families not installed here",
            text=f"{sum(len(res.by_family[f]) for f in lost)} run(s) of the famil(ies)"
            f" {', '.join(lost)}: install the package that provides them to see their sections.",
        )


def _published_section(w: _Writer, path: str | Path | None) -> None:
    lb = load_leaderboard_csv(path) if path else published_leaderboard()
    mism = check_consistency(lb)
    w.rep.mismatches = mism
    w.rep.leaderboards["published"] = lb
    sec = w.section(
        lb.title,
        text="The printed table re-rendered from its per-dataset numbers; averages and "
        f"ranks recomputed. {len(mism)} printed value(s) disagree.",
    )
    w.table(sec, "published", analysis.leaderboard_table(lb, mismatches=mism))
    w.table(sec, "published", analysis.consistency_table(lb, mism))
    w.figure(sec, plots.radar_chart(lb, w.stem("published_radar")), f"{lb.title}: mIoU per dataset")


def _qualitative_section(
    w: _Writer, res: Results | None, cube_urls: Sequence[str], samples: Sequence[int] | None
) -> None:
    sec = w.section("Qualitative examples")
    for k, url in enumerate(cube_urls):
        want = str(url).rstrip("/")
        runs = (
            [r for r in res.runs if str(r.cube.get("url", "")).rstrip("/") == want] if res else []
        )
        stored = [(r, p) for r in runs if (p := find_predictions(r, res.sources)) is not None]
        best = max(stored, key=lambda rp: rp[0].miou or 0, default=None)  # the best run's
        name = Path(want).stem or f"cube{k}"
        title = f"{name}: test tiles" + (
            f", prediction of {best[0].model_name} ({best[0].protocol}, seed {best[0].seed})"
            if best
            else ", no stored prediction"
        )
        pred, stem = str(best[1]) if best else None, w.stem(f"qualitative_{k}_{name}")
        w.figure(sec, qualitative_panels(str(url), pred, samples, stem, title=title), title)


def build_report(
    results: str | Path | Iterable[str | Path] | Results | None = None,
    out: str | Path = "report",
    *,
    protocols: Iterable[str] | None = None,
    formats: Iterable[str] | None = None,
    cube_urls: Sequence[str] = (),
    samples: Sequence[int] | None = None,
    published: bool | str | Path = False,
    title: str = "cryocube report",
    profiles: str | Path | None = None,
    compare: Sequence[tuple[str, str]] = (),
    draws: int | None = None,
) -> Report:
    """The report of results files/folders (or a loaded `Results`) in `out`; published: True for the
    bundled Cryo-Bench table, or a CSV; the rest as `cryocube report`'s options say."""
    fmts = [f.strip().lower() for x in formats or [] for f in str(x).split(",") if f.strip()]
    if bad := [f for f in fmts if f not in ALL_FORMATS]:
        raise ReportError(f"unknown format(s) {', '.join(bad)} (known: {', '.join(ALL_FORMATS)})")
    fmts = list(ALL_FORMATS) if formats is None else fmts
    if results is None and not published:
        raise ReportError(
            "nothing to report: give results files/directories, or published=True (--published)"
        )
    # never replace a folder report did not write
    outputs.claim(str(out), "report", "report", write_marker=False)
    res = results
    if not (isinstance(results, Results) or results is None):
        res = load_results(results, families.report_key)
    # built in a sibling folder and swapped in whole: complete, or the previous report untouched
    with outputs.staged_folder(out, "report", "report") as tmp:
        rep = Report(out=tmp, results=res, final=Path(out))
        w = _Writer(
            rep, fmts, measured_costs(profiles), stats.DRAWS if draws is None else int(draws)
        )
        if res is not None:
            _result_sections(w, res, set(protocols or ()), bool(published), compare)
        if published:
            _published_section(w, None if published is True else published)
        if cube_urls:
            _qualitative_section(w, res, cube_urls, samples)
        if res is not None and (res.failures or res.replaced or res.other_recipes):
            w.table(w.section("Failures"), "", analysis.failures_table(res))  # at the top level
        extra = {"published table": str(published)} if published and published is not True else {}
        _write_pages(w, title, _metadata(res, rep, extra))

    def moved(p: Path) -> Path:
        return rep.final / p.relative_to(tmp)

    rep.files, rep.figures = [moved(p) for p in rep.files], [moved(p) for p in rep.figures]
    rep.html = moved(rep.html) if rep.html else None
    rep.out = rep.final
    return rep


def _result_sections(w: _Writer, res: Results, wanted: set[str], published: bool, compare) -> None:
    if not res.runs and not res.failures and not any(res.by_family.values()):
        raise ReportError(f"{', '.join(map(str, res.sources))}: no run records")
    lbs = _protocol_sections(w, res, wanted)
    if wanted and not lbs and not published:
        known = sorted({r.protocol for r in res.runs})
        raise ReportError(
            f"no successful runs of protocol(s) {', '.join(sorted(wanted))} (found:"
            f" {', '.join(known)})"
        )
    _compare_sections(w, lbs)
    _paired_section(w, compare)
    _family_sections(w, res)
    # tune studies (their trials never reach the leaderboards) and label-fraction curves
    sweeps.sections(w, res)


def _write_pages(w: _Writer, title: str, meta: dict[str, str]) -> None:
    """report.md and report.html, each as the formats ask."""
    rep = w.rep
    if "md" in w.all_formats:
        md = [f"# {title}", ""]
        for s in w.sections:
            md += [f"{'#' * s.level} {s.title}", ""] + ([s.text, ""] if s.text else [])
            md += [to_markdown(t) for t in s.tables]
            md += [f"![{f.caption}]({f.path.relative_to(rep.out).as_posix()})\n" for f in s.figures]
        md += ["## Run metadata", ""] + [f"- **{k}**: {v}" for k, v in meta.items()]
        p = rep.out / "report.md"
        p.write_text("\n".join(md) + "\n", encoding="utf-8")
        rep.files.append(p)
    if "html" in w.all_formats:
        rep.html = write_html(rep.out / "report.html", title, w.sections, meta)
        rep.files.append(rep.html)
