"""One self-contained HTML file (tables, figures as data: URIs, run metadata): nothing linked from
outside, so it can be mailed, archived beside the results or opened offline."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .tables import Table, to_html

# the page's only style sheet, inlined into it
CSS = (Path(__file__).resolve().parent / "data" / "report.css").read_text(encoding="utf-8")


@dataclass
class FigureRef:
    path: Path  # a PNG; embedded as base64
    caption: str


@dataclass
class Section:
    title: str
    tables: list[Table] = field(default_factory=list)
    figures: list[FigureRef] = field(default_factory=list)
    text: str = ""
    level: int = 2

    @property
    def anchor(self) -> str:
        """The section's HTML id, linked from the contents: its title lower-cased, symbols '-'."""
        return "".join(ch if ch.isalnum() else "-" for ch in self.title.lower()).strip("-")


def data_uri(path: Path) -> str:
    """A figure as a data: URI (the page needs no file beside it); an unknown type: ValueError."""
    types = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg"}
    if (mime := types.get(path.suffix.lower())) is None:
        raise ValueError(f"{path}: cannot embed a {path.suffix} file")
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def render(title: str, sections: list[Section], metadata: dict[str, str]) -> str:
    """The whole page as one string: contents, sections, run metadata; nothing from outside."""
    e = html.escape
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    toc = (f'<li><a href="#{s.anchor}">{e(s.title)}</a></li>' for s in sections if s.level == 2)
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>",
        f'<p class="generated">Generated {e(now)} by cryocube.</p>',
        f"<nav><ul>{''.join(toc)}</ul></nav>",
    ]
    for s in sections:
        out.append(f'<h{s.level} id="{s.anchor}">{e(s.title)}</h{s.level}>')
        if s.text:
            out.append(f"<p>{e(s.text)}</p>")
        out += [f'<div class="scroll">{to_html(t)}</div>' for t in s.tables]
        for f in s.figures:
            out.append(
                f'<figure><img src="{data_uri(f.path)}" alt="{e(f.caption)}">'
                f"<figcaption>{e(f.caption)}</figcaption></figure>"
            )
    if metadata:
        out.append('<h2 id="run-metadata">Run metadata</h2><dl class="meta">')
        out += [f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in metadata.items()]
        out.append("</dl>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write_html(path: Path, title: str, sections: list[Section], metadata: dict[str, str]) -> Path:
    """Writes the page (its folder made) and returns the path, for the report's list of files."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(title, sections, metadata), encoding="utf-8")
    return path
