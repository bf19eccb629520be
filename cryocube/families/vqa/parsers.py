"""Answer parsers: a model's free text -> a class, a number, a fraction, a box or a cleaned text.

A parser never raises: it returns `Parsed(value, ok)`, and an answer it cannot read (empty,
ambiguous, no number, no box) is `ok=False`. The metrics score such an answer as wrong and the
record counts it ("unparsed: n"). Parsers are chosen by name from a task's `answer:` field, so a
new kind of answer is one function registered here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from ...errors import UserError


@dataclass(frozen=True)
class Parsed:
    value: Any  # class name, float, (x0, y0, x1, y1) in [0, 1], or text; None when not ok
    ok: bool
    text: str = ""  # the description left beside a box (grounding answers)


NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                                    "fourteen fifteen sixteen seventeen eighteen nineteen twenty".split())}
WORDS |= {"no": 0, "none": 0, "a single": 1, "single": 1, "a couple of": 2, "a dozen": 12}
_WORD_RE = re.compile(r"\b(" + "|".join(sorted(map(re.escape, WORDS), key=len, reverse=True)) + r")\b", re.I)
_NUM_RE = re.compile(NUMBER)
_BOX_RE = re.compile(r"[\[(]\s*(" + NUMBER + r")\s*[, ;]\s*(" + NUMBER + r")\s*[, ;]\s*(" + NUMBER + r")\s*[, ;]\s*("
                     + NUMBER + r")\s*[\])]")
_BARE_BOX_RE = re.compile(r"(" + NUMBER + r")\s*,\s*(" + NUMBER + r")\s*,\s*(" + NUMBER + r")\s*,\s*(" + NUMBER + r")")


def _squash(text: Any) -> str:
    return " ".join(str(text or "").split())


def parse_class(text: str, labels: tuple[str, ...], aliases: dict[str, tuple[str, ...]] | None = None, **_) -> Parsed:
    """The one label (or alias of it) the answer names; two different labels named is ambiguous, unless
    the answer starts with one of them ("High. Not low at all.")."""
    t = _squash(text).lower()
    if not t:
        return Parsed(None, False)
    names = {lab: (lab, *(aliases or {}).get(lab, ())) for lab in labels}
    found: dict[str, int] = {}
    for lab, words in names.items():
        for w in words:
            m = re.search(r"(?<![a-z0-9])" + re.escape(w.lower()) + r"(?![a-z0-9])", t)
            if m:
                found[lab] = min(found.get(lab, m.start()), m.start())
    if len(found) == 1:
        return Parsed(next(iter(found)), True)
    first = [lab for lab, pos in found.items() if pos == 0]
    if len(first) == 1:
        return Parsed(first[0], True)
    return Parsed(None, False)


def parse_number(text: str, **_) -> Parsed:
    """The first number written in digits, else the first number word ("about 3", "3 fringes", "three",
    "2-3" -> 2.5, "no fringes" -> 0)."""
    t = _squash(text)
    rng = re.search(r"(" + NUMBER + r")\s*(?:-|–|to)\s*(" + NUMBER + r")", t)
    m = _NUM_RE.search(t)
    w = _WORD_RE.search(t)
    if rng and m and rng.start() == m.start() and not rng.group(1).startswith(("-", "+")):
        return Parsed((float(rng.group(1)) + float(rng.group(2).lstrip("+-"))) / 2, True)
    if m:  # digits win over number words ("No: I count 3")
        return Parsed(float(m.group(0)), True)
    if w:
        return Parsed(float(WORDS[w.group(1).lower()]), True)
    return Parsed(None, False)


def parse_fraction(text: str, **_) -> Parsed:
    """A share of the image in 0..1: the first number as parse_number reads it, a percentage ("30%", "30 percent")
    or a number above 1 and at most 100 read as percent ("30" -> 0.3); anything else outside 0..1 is unparsed."""
    p = parse_number(text)
    if not p.ok:
        return p
    v = float(p.value)
    if re.search(NUMBER + r"\s*(?:%|per\s*cent|percent)", _squash(text), re.I) or 1.0 < v <= 100.0:
        v /= 100.0
    return Parsed(v, True) if 0.0 <= v <= 1.0 else Parsed(None, False)


def parse_box(text: str, size: tuple[int, int] | None = None, **_) -> Parsed:
    """The first box [x0, y0, x1, y1] of the answer, as fractions of the image (coordinates above 1 are read as
    pixels of an image of `size` (width, height)); corners are sorted; the rest of the answer is its description."""
    t = _squash(text)
    m = _BOX_RE.search(t) or _BARE_BOX_RE.search(t)
    if not m:
        return Parsed(None, False, t)
    v = [float(g) for g in m.groups()]
    if max(v) > 1.0:
        if not size:
            return Parsed(None, False, t)
        w, h = size
        v = [v[0] / w, v[1] / h, v[2] / w, v[3] / h]
    x0, x1 = sorted((v[0], v[2]))
    y0, y1 = sorted((v[1], v[3]))
    box = tuple(min(max(c, 0.0), 1.0) for c in (x0, y0, x1, y1))
    rest = _squash(t[: m.start()] + " " + t[m.end():])
    return Parsed(box, True, rest)


def parse_text(text: str, **_) -> Parsed:
    t = _squash(text)
    return Parsed(t, bool(t), t)


PARSERS: dict[str, Callable[..., Parsed]] = {"class": parse_class, "number": parse_number, "fraction": parse_fraction,
                                              "box": parse_box, "text": parse_text}


def parser(kind: str) -> Callable[..., Parsed]:
    if kind not in PARSERS:
        raise UserError(f"unknown answer kind {kind!r}; known: {', '.join(PARSERS)}")
    return PARSERS[kind]


def parse(kind: str, text: str, **options) -> Parsed:
    """Never raises on any answer text (a parser bug on odd text counts the answer as unparsed, not the run as failed)."""
    fn = parser(kind)
    try:
        return fn(text, **options)
    except Exception:  # noqa: BLE001 - answers are arbitrary model output
        return Parsed(None, False, _squash(text))
