"""A small table model and its renderers: Markdown, CSV, JSON, LaTeX and HTML. A table keeps raw
values (CSV/JSON) and display texts ("61.47 (4/5)", "–") side by side, so every format shows the
same numbers."""

from __future__ import annotations

import csv
import html
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

MISSING = "–"


@dataclass(frozen=True)
class Column:
    key: str  # CSV/JSON name
    header: str  # display header
    show: bool = True  # False: CSV/JSON only (e.g. the count behind "61.47 (4/5)")
    numeric: bool = True


def columns(spec: str, text: str = "", hidden: str = "") -> list[Column]:
    """Columns from "key=Header; key=Header" (a table's columns read as one line each, not a
    Column call each); `text` names the text columns' keys, `hidden` the CSV/JSON-only ones."""
    out = []
    for part in spec.split(";"):
        key, _, header = part.strip().partition("=")
        out.append(Column(key, header, key not in hidden.split(), key not in text.split()))
    return out


@dataclass
class Table:
    name: str  # file stem
    title: str
    columns: list[Column]
    rows: list[list[Any]] = field(default_factory=list)  # raw values
    texts: list[list[str]] = field(default_factory=list)  # display texts
    # (row, column key) -> 1 best, 2 second
    marks: dict[tuple[int, str], int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    group: str = ""  # the report section/folder it belongs to (makes HTML ids unique)

    def add(self, raw: list[Any], text: list[str] | None = None) -> None:
        """Appends a row: raw values and their display texts (`fmt` of each by default); a wrong
        length is a ValueError."""
        if len(raw) != len(self.columns):
            raise ValueError(
                f"table {self.name}: row has {len(raw)} values for {len(self.columns)} columns"
            )
        self.rows.append(raw)
        self.texts.append(text if text is not None else [fmt(v) for v in raw])

    def col(self, key: str) -> int:
        """A column's index by key (ValueError if none), to read a row's raw value or text."""
        return [c.key for c in self.columns].index(key)

    def column_values(self, key: str) -> list[Any]:
        """One column's raw values, in row order."""
        j = self.col(key)
        return [r[j] for r in self.rows]

    def mark(self, marks: dict[int, int], key: str) -> None:
        """Marks rows of one column: {row index: 1 best, 2 second}, as `best_two` returns them."""
        for i, m in marks.items():
            self.marks[(i, key)] = m

    def shown(self) -> list[tuple[int, Column]]:
        """(index, column) of the columns display formats show; CSV and JSON write every column."""
        return [(j, c) for j, c in enumerate(self.columns) if c.show]


def fmt(v: Any, decimals: int = 2) -> str:
    """Display text: MISSING for None or non-finite, yes/no for a bool, floats at `decimals`."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return MISSING
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.{decimals}f}"
    return str(v)


def _json_value(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, tuple):
        return list(v)
    return v


# --- renderers
# ---------------------------------------------------------------------------------------


def to_markdown(t: Table) -> str:
    """Markdown: best in bold, second underlined (<u>), the notes as a list below."""
    cols = t.shown()
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    out = [
        f"### {t.title}",
        "",
        "| " + " | ".join(esc(c.header) for _, c in cols) + " |",
        "|" + "|".join("---:" if c.numeric else "---" for _, c in cols) + "|",
    ]
    for i, text in enumerate(t.texts):
        cells = []
        for j, c in cols:
            s, m = esc(text[j]), t.marks.get((i, c.key))
            cells.append(f"**{s}**" if m == 1 else f"<u>{s}</u>" if m == 2 else s)
        out.append("| " + " | ".join(cells) + " |")
    if t.notes:
        out += [""] + [f"- {n}" for n in t.notes]
    return "\n".join(out) + "\n"


def to_csv(t: Table) -> str:
    """The raw values of every column: floats to 6 significant digits, missing as an empty field."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([c.key for c in t.columns])
    for r in t.rows:
        # missing (None, NaN) as an empty field, floats to 6 significant digits
        w.writerow(
            ["" if _json_value(v) is None else f"{v:.6g}" if isinstance(v, float) else v for v in r]
        )
    return buf.getvalue()


def to_json(t: Table) -> str:
    """The raw values (non-finite as null) with the marks and notes, for other tools to read."""
    keys = [c.key for c in t.columns]
    return (
        json.dumps(
            {
                "name": t.name,
                "title": t.title,
                "columns": [{"key": c.key, "header": c.header} for c in t.columns],
                "rows": [{k: _json_value(v) for k, v in zip(keys, r)} for r in t.rows],
                "marks": [
                    {"row": i, "column": k, "mark": "best" if m == 1 else "second"}
                    for (i, k), m in sorted(t.marks.items())
                ],
                "notes": t.notes,
            },
            indent=1,
        )
        + "\n"
    )


_TEX = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "–": "--",
    "†": r"$^\dagger$",
    "Δ": r"$\Delta$",
}


def tex_escape(s: str) -> str:
    """Text as LaTeX source: special characters escaped; ±, –, †, Δ spelled as LaTeX spells them."""
    return "".join(_TEX.get(ch, ch) for ch in str(s))


def to_latex(t: Table) -> str:
    """A booktabs table (the document needs that package): best in bold, second underlined."""
    cols = t.shown()
    spec = "".join("r" if c.numeric else "l" for _, c in cols)
    out = [
        r"\begin{table}[t]",
        r"\centering",
        r"\caption{" + tex_escape(t.title) + "}",
        r"\begin{tabular}{" + spec + "}",
        r"\toprule",
        " & ".join(tex_escape(c.header) for _, c in cols) + r" \\",
        r"\midrule",
    ]
    for i, text in enumerate(t.texts):
        cells = []
        for j, c in cols:
            s, m = tex_escape(text[j]), t.marks.get((i, c.key))
            cells.append(
                r"\textbf{" + s + "}" if m == 1 else r"\underline{" + s + "}" if m == 2 else s
            )
        out.append(" & ".join(cells) + r" \\")
    out += [r"\bottomrule", r"\end{tabular}"]
    if t.notes:
        out.append(r"\par\footnotesize " + " ".join(tex_escape(n) for n in t.notes))
    out.append(r"\end{table}")
    return "\n".join(out) + "\n"


def to_html(t: Table) -> str:
    """The table for the report page; its id carries the table's group, so ids stay unique."""
    cols = t.shown()
    e = html.escape
    tid = f"table-{t.group}-{t.name}" if t.group else f"table-{t.name}"
    out = [
        f'<table class="report" id="{e(tid)}">',
        f"<caption>{e(t.title)}</caption>",
        "<thead><tr>",
    ]
    out += [f'<th class="{"num" if c.numeric else "txt"}">{e(c.header)}</th>' for _, c in cols]
    out.append("</tr></thead><tbody>")
    for i, text in enumerate(t.texts):
        out.append("<tr>")
        for j, c in cols:
            s, m = e(text[j]), t.marks.get((i, c.key))
            s = f"<strong>{s}</strong>" if m == 1 else f"<u>{s}</u>" if m == 2 else s
            cls = ("num" if c.numeric else "txt") + (" missing" if text[j] == MISSING else "")
            out.append(f'<td class="{cls}">{s}</td>')
        out.append("</tr>")
    out.append("</tbody></table>")
    if t.notes:
        out.append('<ul class="notes">' + "".join(f"<li>{e(n)}</li>" for n in t.notes) + "</ul>")
    return "\n".join(out)


RENDERERS: dict[str, tuple[str, Callable[[Table], str]]] = {
    "md": (".md", to_markdown),
    "csv": (".csv", to_csv),
    "json": (".json", to_json),
    "tex": (".tex", to_latex),
}


def write_table(t: Table, out_dir: Path, formats: list[str]) -> list[Path]:
    """One file per format of RENDERERS (md, csv, json, tex); HTML goes through the page."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for f in formats:
        ext, render = RENDERERS[f]
        p = out_dir / f"{t.name}{ext}"
        p.write_text(render(t), encoding="utf-8")
        written.append(p)
    return written
