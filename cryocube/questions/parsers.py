"""Answer parsers: a model's free text -> a class, a number, a fraction, a box or a cleaned text.
A parser never raises: an answer it cannot read is `ok=False`, scored as wrong and counted. The
rules: docs/vlm.md ("Answer parsing rules"), tested on tests/data/vqa_answers.yaml."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import UserError


@dataclass(frozen=True)
class Parsed:
    value: Any  # class name, float, (x0, y0, x1, y1) in [0, 1], or text; None when not ok
    ok: bool
    text: str = ""  # the description left beside a box (grounding answers)


_DIGITS = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+"
NUMBER = r"[-+−]?(?:" + _DIGITS + r")(?:[eE][-+]?\d+)?"
_NUM_RE = re.compile(r"(?<![\w.,])" + NUMBER)
_UNITS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen"
).split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
WORDS = {w: i for i, w in enumerate(_UNITS)}
WORDS |= {w: 10 * (k + 2) for k, w in enumerate(_TENS)}
# twenty-one .. ninety-nine, hyphenated or spaced
WORDS |= {
    f"{t}{sep}{u}": 10 * (k + 2) + j
    for k, t in enumerate(_TENS)
    for j, u in enumerate(_UNITS[1:10], 1)
    for sep in ("-", " ")
}
WORDS |= dict.fromkeys(("no", "none", "not a single", "not one"), 0) | {"a single": 1, "single": 1}
WORDS |= {"a couple of": 2, "a dozen": 12, "a hundred": 100, "one hundred": 100}


def _alternation(words) -> re.Pattern:
    """Any of `words` as a whole word, the longest first ("twenty-one" before "twenty")."""
    return re.compile(
        r"\b(" + "|".join(sorted(map(re.escape, words), key=len, reverse=True)) + r")\b", re.I
    )


_WORD_RE = _alternation(WORDS)
# answers that say the picture does not tell: unparsed, whatever number or label they name
_REFUSAL = re.compile(
    r"\bno\s+way\s+to\s+(?:tell|know|say|determine|count)\b|\b(?:can\s*not|can't|cannot|unable\s+to|"
    r"impossible\s+to|not\s+possible\s+to|hard\s+to|difficult\s+to)\s+(?:\w+\s+){0,2}?(?:tell|say|"
    r"know|determine|count|judge|discern|assess|estimate|be\s+(?:determined|told|counted))\b|"
    r"\b(?:don't|do\s+not)\s+know\b|\bnot\s+(?:sure|certain)\b|"
    r"^(?:it\s+is\s+|it's\s+)?(?:unclear|uncertain|unknown|n/a|indeterminate)\b",
    re.I,
)


# "half", "a half", "one half", ..., "two thirds", "three quarters"
SHARES = {"half": 0.5, "two thirds": 2 / 3, "three quarters": 0.75} | {
    f"{a} {w}": v
    for w, v in {"half": 0.5, "third": 1 / 3, "quarter": 0.25, "fifth": 0.2}.items()
    for a in ("a", "one")
}
_SHARE_RE = _alternation(SHARES)
# units a count or share is not measured in: a number followed by one is not the answer (12 days)
FOREIGN_UNITS = (
    r"(?:cm|mm|km|m|metres?|meters?|days?|weeks?|months?|years?|yrs?|hours?|h|s|rad|radians?|°|deg|"
    r"degrees?|px|pixels?|hz|mhz|ghz|%|per\s*cent|percent)(?![A-Za-z])"
)
_PERCENT = r"(?:%|per\s*cent|percent)(?![A-Za-z])"
_MONTHS = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|"
    r"oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_DATES = re.compile(
    r"\b\d{4}[-/.]\d{1,2}[-/.]\d{1,2}\b|\b(?:19|20)\d{6}\b|\b\d{1,2}[-/.]\d{1,2}[-/.]\d{4}\b|"
    r"\b\d{1,2}(?:st|nd|rd|th)?\s+MONTH\.?,?\s+\d{4}\b|"
    r"\bMONTH\.?\s+\d{1,2}(?:st|nd|rd|th)?,?\s+\d{4}\b|"
    r"\bMONTH\.?\s+\d{4}\b".replace("MONTH", _MONTHS),
    re.I,
)
_BOUND = re.compile(
    r"(?:\b(?:more|less|fewer|greater|lower|higher)\s+than|\bat\s+(?:least|most)|\b(?:over|under|"
    r"above|below|up\s+to)|[<>≤≥]=?)\s*$",
    re.I,
)
_RANGE_JOIN = r"\s*(?:-|–|—|to|or)\s*"
_RANGE_RE = re.compile(rf"({NUMBER})\s*({_PERCENT})?({_RANGE_JOIN}|\s+and\s+)({NUMBER})", re.I)
ANSWER_KEYS = tuple(
    "answer final_answer value count number fringes fraction label class coherence result"
    " prediction output".split()
)
_SPECIAL = re.compile(
    r"</?s>|<eos>|<bos>|<pad>|<unk>|<image>|<end_of_utterance>|<end_of_turn>|<start_of_turn>|"
    r"<\|[a-z_]+\|>|<fake_token_around_image>|<global-img>",
    re.I,
)
_ROLE = re.compile(
    r"(?:<\|im_start\|>\s*assistant|<start_of_turn>\s*model|(?:^|\s)(?:ASSISTANT|Assistant|assistant)\s*:)"
)


def _squash(text: Any) -> str:
    return " ".join(str(text or "").split())


def _unwrap(text: Any) -> str:
    """The answer inside what a chat model wraps it in: after a closed <think> block (an unclosed
    one: only what came before it), after the last assistant role marker, inside <answer> tags."""
    t = "" if text is None else str(text)
    if "</think>" in t:
        t = t.rsplit("</think>", 1)[1]
    elif "<think>" in t:
        t = t.split("<think>", 1)[0]
    if roles := list(_ROLE.finditer(t)):
        t = t[roles[-1].end() :]
    m = re.search(r"<answer>(.*?)(?:</answer>|$)", t, re.S | re.I)
    return m.group(1) if m else t


def _drop_echo(t: str, prompt: str) -> str:
    """Remove every prompt sentence (12 characters or more) the answer repeats word for word."""
    if not prompt:
        return t
    sentences = sorted(
        {s.strip() for s in re.split(r"(?<=[.?!:])\s+", _squash(prompt)) if len(s.strip()) >= 12},
        key=len,
        reverse=True,
    )
    flat = _squash(t)
    for s in sentences:
        flat = re.sub(re.escape(s), " ", flat, flags=re.I)
    return flat


def _latex(t: str) -> str:
    if boxed := re.findall(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}", t):
        t = boxed[-1]
    t = re.sub(r"\\d?frac\{([^{}]*)\}\{([^{}]*)\}", r"\1/\2", t)
    t = re.sub(r"\\(?:text|mathrm|textbf|mathbf|textit|operatorname)\{([^{}]*)\}", r"\1", t)
    t = re.sub(r"(\d)\\[,;!]\s*(?=\d)", r"\1", t)  # 1\,000
    for a, b in (("\\%", "%"), ("\\approx", " about "), ("\\sim", " about "), ("\\times", " x ")):
        t = t.replace(a, b)
    return re.sub(r"\\[()\[\]]|\$", " ", t)


def _markdown(t: str) -> str:
    t = re.sub(r"```[a-zA-Z]*", " ", t)
    lines = [re.sub(r"^\s*(?:#{1,6}\s+|>\s+|[-*+•]\s+)", "", x) for x in t.splitlines()]
    t = "\n".join(lines)
    # a numbered list: its numbers are not answers
    if sum(bool(re.match(r"\s*\d+[.)]\s+[A-Za-z*]", x)) for x in lines) >= 2:
        t = re.sub(r"(?m)^\s*\d+[.)]\s+(?=[A-Za-z*])", "", t)
    return re.sub(r"\*\*|__|`|(?<!\w)\*(?!\s)|(?<!\s)\*(?!\w)", "", t)


def _json_value(t: str) -> Any:
    """The JSON object or list the answer is (or holds between its outer braces), else None."""
    s = t.strip()
    for a, b in (("{", "}"), ("[", "]")):
        i, j = s.find(a), s.rfind(b)
        if 0 <= i < j:
            try:
                return json.loads(s[i : j + 1])
            except ValueError:
                continue
    return None


def _json_keys(v: Any) -> dict | None:
    """A JSON object (a list's first) with lower-case keys, else None."""
    if isinstance(v, list) and v and isinstance(v[0], dict):
        v = v[0]
    return {str(k).lower(): x for k, x in v.items()} if isinstance(v, dict) else None


def _json_answer(v: Any) -> Any:
    """A JSON answer's value: its first answer-like key, else its only value; a list's first."""
    low = _json_keys(v)
    if low is not None:
        for k in ANSWER_KEYS:
            if k in low:
                return low[k]
        return next(iter(low.values())) if len(low) == 1 else None
    return v


def clean(text: Any, prompt: str = "", json_ok: bool = True) -> str:
    """The answer's words without their wrapping (docs/vlm.md), on one line."""
    t = _unwrap(text)
    t = _SPECIAL.sub(" ", t)
    t = _drop_echo(t, prompt) if prompt else t
    t = _latex(t)
    t = _markdown(t)
    if json_ok and ("{" in t or "[" in t):
        v = _json_value(_squash(t))
        a = _json_answer(v) if v is not None else None
        if a is not None and not isinstance(a, (dict, list)):
            t = str(a)
    t = _squash(t)
    t = re.sub(r"^(?:the\s+)?(?:final\s+|short\s+)?answer(?:\s+is)?\s*[:\-]?\s*", "", t, flags=re.I)
    return t.strip()


# -- classes ---------------------------------------------------------------------------------------

# a label after one of these is negated: "not an earthquake", "doesn't look like a dyke"
_NEGATION = re.compile(
    r"(?:\b(?:not|never|neither|nor)|n't)\s+(?:(?:a|an|the|very|so|too|that|really|particularly|quite|"
    r"at\s+all|call(?:ed)?\s+it|consider(?:ed)?\s+it|describe(?:d)?\s+it\s+as|classify\s+it\s+as|"
    r"say\s+(?:it\s+is|it's)|be|been|look(?:s)?|seem(?:s)?|appear(?:s)?|like|to\s+be|as)\s+)*$",
    re.I,
)
# what joins two labels into a hedge ("medium-high", "low-to-medium", "low or maybe medium")
_HEDGE_PUNCT = set("-–—/,")
_HEDGE_WORDS = {"or", "to", "and", "maybe", "perhaps", "possibly"}


def _hedge_join(between: str) -> bool:
    words = re.findall(r"[a-z]+", between.lower())
    punct = re.sub(r"[a-z\s]", "", between.lower())
    return bool(words or punct) and set(words) <= _HEDGE_WORDS and set(punct) <= _HEDGE_PUNCT


_NEGATION_LABELS = {"no", "none", "not", "absent"}


def _letter(t: str, labels: tuple[str, ...]) -> tuple[str, str] | None:
    """A multiple-choice answer's letter (A = labels[0]): alone, or opening as "B.", "B)", "(B)"."""
    m = re.match(r"^(?i:option\s+)?(?:\(([A-Z])\)|([A-Z])(?:[.):]|$))", t) or re.search(
        r"\b(?:option|choice)\s+\(?([A-Z])\)?\b", t
    )
    if not m:
        return None
    k = ord(next(g for g in m.groups() if g)) - ord("A")
    return (labels[k], t[m.end() :]) if 0 <= k < len(labels) else None


def _word(w: str) -> re.Pattern:
    """`w` as a whole word of a lower-cased answer."""
    return re.compile(r"(?<![a-z0-9])" + re.escape(w.lower()) + r"(?![a-z0-9])")


def parse_class(
    text: str,
    labels: tuple[str, ...],
    aliases: dict[str, tuple[str, ...]] | None = None,
    prompt: str = "",
    letters: bool = False,
    **_,
) -> Parsed:
    """The one label (or alias of it) the answer names, by the rules of docs/vlm.md."""
    t0 = clean(text, prompt)
    t = t0.lower()
    if not t or _REFUSAL.search(t):
        return Parsed(None, False)
    if letters and (got := _letter(t0, labels)) is not None:
        lab, rest = got
        others = [o for o in labels if o != lab and _word(o).search(rest.lower())]
        return Parsed(lab, True) if not others else Parsed(None, False)
    names = {lab: (lab, *(aliases or {}).get(lab, ())) for lab in labels}
    hits = sorted(  # (start, end, label) of each label not negated
        (m.start(), m.end(), lab)
        for lab, words in names.items()
        for w in words
        for m in _word(w).finditer(t)
        if w.lower() in _NEGATION_LABELS or not _NEGATION.search(t[: m.start()])
    )
    found = {lab for _, _, lab in hits}
    # a hedge: "medium-high", "low-to-medium", "low or medium"
    hedged = any(a != b and _hedge_join(t[e1:s2]) for (_, e1, a), (s2, _, b) in zip(hits, hits[1:]))
    if len(found) == 1 or (found and not hedged and hits[0][0] == 0):  # one label, or one opening
        return Parsed(hits[0][2], True)
    return Parsed(None, False)


# -- numbers ---------------------------------------------------------------------------------------


def _num(s: str) -> float:
    return float(s.replace(",", "").replace("−", "-"))


# _read_number: the answer gives a number, but not one that can be read as the answer
REFUSED = "refused"


def _read_number(t: str, percent_ok: bool = False) -> tuple[float | str | None, bool, int]:
    """(value, percent?, where) of the first number in digits (a range: its midpoint); value None
    when it writes none, REFUSED when the first is a bound, a reversed range or "2,5"."""
    t = _DATES.sub(" <date> ", t)
    if re.search(r"\d,\d(?!\d\d(?!\d))", t):
        return REFUSED, False, 0
    units = FOREIGN_UNITS.replace(r"|%|per\s*cent|percent", "") if percent_ok else FOREIGN_UNITS
    after_unit = re.compile(r"\s*" + units, re.I)
    pct_after = re.compile(r"\s*" + _PERCENT, re.I)
    for m in _NUM_RE.finditer(t):
        if after_unit.match(t, m.end()):
            continue  # 2.77 cm, 12 days: not the answer
        if _BOUND.search(t[: m.start()]):
            return REFUSED, False, m.start()
        r = _RANGE_RE.match(t, m.start())
        if r and "and" in r.group(3) and not re.search(r"\bbetween\s+$", t[: m.start()], re.I):
            r = None  # "2 and 4" is a list; "between 2 and 4" a range
        if r:
            lo, hi = _num(r.group(1)), _num(r.group(4))
            if lo > hi:
                return REFUSED, False, m.start()
            return (lo + hi) / 2, bool(r.group(2) or pct_after.match(t, r.end())), m.start()
        return _num(m.group(0)), bool(pct_after.match(t, m.end())), m.start()
    return None, False, -1


# a number task's domain unless its file gives one: a count is not negative
COUNT = (0.0, None)


def in_domain(v: float, domain) -> bool:
    """Whether `v` is a finite number within `domain` (lowest, highest; None: open)."""
    lo, hi = domain if domain is not None else (None, None)
    return math.isfinite(v) and (lo is None or v >= lo) and (hi is None or v <= hi)


def parse_number(
    text: str, prompt: str = "", domain: tuple[float | None, float | None] | None = COUNT, **_
) -> Parsed:
    """The first number in digits, else in words ("2-4" -> 3, "three or four" -> 3.5, "no" -> 0),
    within `domain` (None: open; a count's [0, open) by default); rules in docs/vlm.md."""
    t = clean(text, prompt)
    if _REFUSAL.search(t):
        return Parsed(None, False)
    v, _pct, _ = _read_number(t)
    if v is None:  # in words, as digits: "three or four" is the range "3 or 4" (3.5)
        v, _pct, _ = _read_number(_WORD_RE.sub(lambda m: str(WORDS[m.group(1).lower()]), t))
    if v is None or v == REFUSED or not in_domain(v, domain):
        return Parsed(None, False)
    return Parsed(float(v), True)


def parse_fraction(text: str, prompt: str = "", **_) -> Parsed:
    """A share of the image in 0..1: a number, a percentage ("30%", or "30": a number in (1, 100]),
    "a/b" or a word ("half", "a quarter"); anything else outside 0..1 is unparsed."""
    t = clean(text, prompt)
    if _REFUSAL.search(t):
        return Parsed(None, False)
    v, pct, at = _read_number(t, percent_ok=True)
    frac = re.search(
        r"(?<![\w./])(\d+)\s*/\s*(\d+)(?![\w/])", _DATES.sub(lambda m: " " * len(m.group(0)), t)
    )
    if frac and v != REFUSED and (v is None or frac.start() <= at) and float(frac.group(2)) > 0:
        v, pct = float(frac.group(1)) / float(frac.group(2)), False
    if v is None:
        s, w = _SHARE_RE.search(t), _WORD_RE.search(t)
        v = SHARES[s.group(1).lower()] if s else float(WORDS[w.group(1).lower()]) if w else None
    if v is None or v == REFUSED or not math.isfinite(v):
        return Parsed(None, False)
    if pct or 1.0 < v <= 100.0:
        v /= 100.0
    return Parsed(float(v), True) if 0.0 <= v <= 1.0 else Parsed(None, False)


# -- boxes -----------------------------------------------------------------------------------------

_N = r"\s*(" + NUMBER + r")\s*"
_SEP = r"(?:[,;]|(?<=\s))"  # numbers of a box are separated (never "53" "3" out of "533")
_BOX_RE = re.compile(r"[\[(]" + _N + _SEP + _N + _SEP + _N + _SEP + _N + r"[\])]")
_POINTS_RE = re.compile(r"\(" + _N + r"," + _N + r"\)\s*,?\s*\(" + _N + r"," + _N + r"\)")
_BARE_BOX_RE = re.compile(r"(?<![\w.])" + r"\s*,\s*".join([f"({NUMBER})"] * 4))
_QWEN_RE = re.compile(
    r"(?:<\|box_start\|>|<box>)\s*" + _POINTS_RE.pattern + r"\s*(?:<\|box_end\|>|</box>)"
)
_LOC_RE = re.compile(r"<loc(\d{4})>\s*<loc(\d{4})>\s*<loc(\d{4})>\s*<loc(\d{4})>")
# x0, y0, x1, y1 named: "xmin: 12", "'left'=0.2"
_KEYED = [
    re.compile(r"\b(?:" + k + r")[\"']?\s*[:=]\s*(" + NUMBER + r")", re.I)
    for k in ("x_?min|x1|left", "y_?min|y1|top", "x_?max|x2|right", "y_?max|y2|bottom")
]
BOX_KEYS = ("bbox_2d", "bbox", "box", "bounding_box", "coordinates")
# a coordinate's name in a stated order: "(y_min, x_min, y_max, x_max)", "[top, left, ...]"
_COORD = r"(x_?min|x_?max|y_?min|y_?max|[xy][0-2]|left|right|top|bottom)"
_ORDER_RE = re.compile(r"\b" + r"\s*,\s*".join([_COORD] * 4) + r"\b", re.I)
_SIDES = {"left": ("x", 0), "right": ("x", 1), "top": ("y", 0), "bottom": ("y", 1)}


def _stated_order(t: str) -> list[int] | None:
    """Where x0, y0, x1, y1 stand among four numbers whose order the answer states ("(y_min,
    x_min, y_max, x_max)": [1, 0, 3, 2]); None when it states none (or not one of each)."""
    m = _ORDER_RE.search(t)
    if not m:
        return None
    names = [g.lower().replace("_", "") for g in m.groups()]
    roles = []
    for n in names:
        if n in _SIDES:
            roles.append(_SIDES[n])
        elif n[1:] in ("min", "max"):
            roles.append((n[0], int(n[1:] == "max")))
        else:  # x1, y2: the lower digit of an axis is its minimum
            same = sorted(int(o[1]) for o in names if o[0] == n[0] and o[1:].isdigit())
            roles.append((n[0], int(int(n[1]) == same[-1] and len(same) == 2)))
    want = [("x", 0), ("y", 0), ("x", 1), ("y", 1)]
    return [roles.index(r) for r in want] if sorted(roles) == sorted(want) else None


def _box_numbers(raw: str, prompt: str = "") -> tuple[list[float] | None, str, str]:
    """(x0, y0, x1, y1 as written, how: "fractions_or_pixels" | "per_mille" | "loc", the rest)."""
    if m := _LOC_RE.search(raw):
        y0, x0, y1, x1 = (int(g) / 1024 for g in m.groups())
        return [x0, y0, x1, y1], "loc", raw[: m.start()] + " " + raw[m.end() :]
    if m := _QWEN_RE.search(raw):
        cut = raw[: m.start()] + " " + raw[m.end() :]
        return [_num(g) / 1000 for g in m.groups()], "per_mille", cut
    t = clean(raw, prompt, json_ok=False)
    low = _json_keys(_json_value(t))
    if low is not None:
        for k in BOX_KEYS:
            b = low.get(k)
            if isinstance(b, list) and len(b) == 4 and all(isinstance(c, (int, float)) for c in b):
                rest = " ".join(str(x) for kk, x in low.items() if kk != k and isinstance(x, str))
                return [float(c) for c in b], "fractions_or_pixels", rest
    keyed = [k.search(t) for k in _KEYED]
    if all(keyed):
        rest = t
        for k in keyed:
            rest = rest.replace(k.group(0), " ")
        return [_num(k.group(1)) for k in keyed], "fractions_or_pixels", rest
    m = _BOX_RE.search(t) or _POINTS_RE.search(t) or _BARE_BOX_RE.search(t)
    if not m:
        return None, "", t
    v = [_num(m.group(i)) for i in range(1, 5)]
    rest = t[: m.start()] + " " + t[m.end() :]
    order = _stated_order(rest) if m.re is not _POINTS_RE else None
    if order is not None:  # "[0.2, 0.1, 0.6, 0.5] (y_min, x_min, y_max, x_max)"
        v = [v[i] for i in order]
        rest = re.sub(r"[(\[]\s*[)\]]", " ", _ORDER_RE.sub(" ", rest))
    return v, "fractions_or_pixels", rest


def parse_box(text: str, size: tuple[int, int] | None = None, prompt: str = "", **_) -> Parsed:
    """The first box of the answer as fractions of the picture (x0, y0, x1, y1), corners sorted and
    clipped; the rest of the answer is its description. Formats and refusals: docs/vlm.md."""
    raw = _unwrap(text)
    v, how, rest = _box_numbers(raw, prompt)
    rest = _squash(clean(_SPECIAL.sub(" ", rest), prompt, json_ok=False))
    if v is None or not all(math.isfinite(c) for c in v):
        return Parsed(None, False, rest)
    if how == "fractions_or_pixels" and max(v) > 1.0:
        if any(0.0 < c < 1.0 for c in v) or not size or not size[0] or not size[1]:
            return Parsed(None, False, rest)  # half fractions, half pixels; or no picture size
        w, h = size
        v = [v[0] / w, v[1] / h, v[2] / w, v[3] / h]
    x0, x1 = sorted((v[0], v[2]))
    y0, y1 = sorted((v[1], v[3]))
    box = tuple(min(max(c, 0.0), 1.0) for c in (x0, y0, x1, y1))
    if box[2] <= box[0] or box[3] <= box[1]:
        return Parsed(None, False, rest)  # zero width or height (or wholly outside the picture)
    return Parsed(box, True, rest)


def parse_text(text: str, prompt: str = "", **_) -> Parsed:
    """The cleaned answer itself (token F1 reads it); one that cleans to nothing is unparsed."""
    t = clean(text, prompt, json_ok=False)
    return Parsed(t or None, bool(t), t)


# a task's `answer:` kind -> its parser (task files are checked against it when read)
PARSERS: dict[str, Callable[..., Parsed]] = {
    f.__name__.removeprefix("parse_"): f
    for f in (parse_class, parse_number, parse_fraction, parse_box, parse_text)
}


def parse(kind: str, text: str, **options) -> Parsed:
    """Never fails on an answer: a parser bug on odd text leaves it unparsed, the run going."""
    if kind not in PARSERS:
        raise UserError(f"unknown answer kind {kind!r}; known: {', '.join(PARSERS)}")
    try:
        return PARSERS[kind](text, **options)
    except Exception:  # noqa: BLE001 - answers are arbitrary model output
        return Parsed(None, False, _squash(text))
