"""A table model (raw values for CSV/JSON beside display texts such as "61.47 (4/5)", so every
format shows the same numbers) and its renderers: Markdown, CSV, JSON, LaTeX and HTML."""

from __future__ import annotations

import csv
import html
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable, Mapping, TypeVar

MISSING = "–"
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Column:
    key: str  # CSV/JSON name
    header: str  # display header
    show: bool = True  # False: CSV/JSON only (e.g. the count behind "61.47 (4/5)")
    numeric: bool = True
    decimals: int = 2  # how a float displays where the row gives no text of its own


MODEL = Column("model", "Model", numeric=False)


def columns(
    spec: str, text: str = "", hidden: str = "", decimals: dict[str, int] | None = None
) -> list[Column]:
    """Columns from "key=Header; key=Header"; `text` names the text columns' keys, `hidden` the
    CSV/JSON-only ones, `decimals` the floats not shown at two."""
    out = []
    for part in spec.split(";"):
        key, _, header = part.strip().partition("=")
        places = (decimals or {}).get(key, 2)
        out.append(Column(key, header, key not in hidden.split(), key not in text.split(), places))
    return out


def rounded(v: float, decimals: int | None) -> float:
    """`v` at the displayed precision, so what prints as a tie is a tie (None: as it is)."""
    return round(v, decimals) if decimals is not None else v


def best_two(
    values: Mapping[K, float], *, higher_is_better: bool = True, decimals: int | None = None
) -> dict[K, int]:
    """1 for every key holding the best value, 2 for every key holding the next distinct value."""
    vals = {
        k: rounded(v, decimals) for k, v in values.items() if v is not None and math.isfinite(v)
    }
    distinct = sorted(set(vals.values()), reverse=higher_is_better)[:2]
    return {k: distinct.index(v) + 1 for k, v in vals.items() if v in distinct}


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

    def add(self, raw: list[Any], text: list[str] | dict[str, str] | None = None) -> None:
        """Appends a row: raw values and their texts, all or {column key: text} for some (others:
        `fmt` at the column's decimals); a wrong length is a ValueError."""
        if len(raw) != len(self.columns):
            raise ValueError(
                f"table {self.name}: row has {len(raw)} values for {len(self.columns)} columns"
            )
        self.rows.append(raw)
        if not isinstance(text, list):
            own = text or {}
            text = [own.get(c.key, fmt(v, c.decimals)) for v, c in zip(raw, self.columns)]
        self.texts.append(text)

    def col(self, key: str) -> int:
        """A column's index by key (ValueError if none), to read a row's raw value or text."""
        return [c.key for c in self.columns].index(key)

    def column_values(self, key: str) -> list[Any]:
        """One column's raw values, in row order."""
        return [r[self.col(key)] for r in self.rows]

    def mark_best(self, key: str, decimals: int = 2, higher: bool = True, rows=None) -> None:
        """Marks the best and second values of one column (`rows`: only these row indexes)."""
        j = self.col(key)
        vals = {i: r[j] for i, r in enumerate(self.rows) if rows is None or i in rows}
        for i, m in best_two(vals, higher_is_better=higher, decimals=decimals).items():
            self.marks[(i, key)] = m

    def shown(self) -> list[tuple[int, Column]]:
        """(index, column) of the columns display formats show; CSV and JSON write every column."""
        return [(j, c) for j, c in enumerate(self.columns) if c.show]

    def marked(self, escape: Callable[[str], str], best: str, second: str) -> list[list[str]]:
        """Each row's shown texts escaped, the best and second wrapped as a format marks them."""
        wrap = {1: best, 2: second}
        return [
            [
                wrap.get(self.marks.get((i, c.key)), "{}").format(escape(text[j]))
                for j, c in self.shown()
            ]
            for i, text in enumerate(self.texts)
        ]


def fmt(v: Any, decimals: int = 2) -> str:
    """Display text: MISSING for None or non-finite, yes/no for a bool, floats at `decimals`."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return MISSING
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{decimals}f}"
    return str(v)


def _json_value(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, tuple):
        return list(v)
    return v


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
    out += ["| " + " | ".join(row) + " |" for row in t.marked(esc, "**{}**", "<u>{}</u>")]
    if t.notes:
        out += [""] + [f"- {n}" for n in t.notes]
    return "\n".join(out) + "\n"


def to_csv(t: Table) -> str:
    """The raw values of every column: floats to 6 significant digits, missing as an empty field."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([c.key for c in t.columns])
    for r in t.rows:
        w.writerow(
            ["" if _json_value(v) is None else f"{v:.6g}" if isinstance(v, float) else v for v in r]
        )
    return buf.getvalue()


def to_json(t: Table) -> str:
    """The raw values (non-finite as null) with the marks and notes, for other tools to read."""
    keys = [c.key for c in t.columns]
    doc = {
        "name": t.name,
        "title": t.title,
        "columns": [{"key": c.key, "header": c.header} for c in t.columns],
        "rows": [{k: _json_value(v) for k, v in zip(keys, r)} for r in t.rows],
        "marks": [
            {"row": i, "column": k, "mark": "best" if m == 1 else "second"}
            for (i, k), m in sorted(t.marks.items())
        ],
        "notes": t.notes,
    }
    return json.dumps(doc, indent=1) + "\n"


_TEX = {c: "\\" + c for c in "&%$#_{}"}  # LaTeX's special characters, as LaTeX spells them
_TEX |= {"\\": r"\textbackslash{}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
_TEX |= {"±": r"$\pm$", "–": "--", "†": r"$^\dagger$", "Δ": r"$\Delta$"}


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
    marks = (r"\textbf{{{}}}", r"\underline{{{}}}")
    out += [" & ".join(row) + r" \\" for row in t.marked(tex_escape, *marks)]
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
    for text, row in zip(t.texts, t.marked(e, "<strong>{}</strong>", "<u>{}</u>")):
        out.append("<tr>")
        for (j, c), s in zip(cols, row):
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
# what `cryocube report --format` takes: the tables' and the page's
ALL_FORMATS = (*RENDERERS, "html")


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
