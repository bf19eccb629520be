"""Answer parsers on messy model output, and the metrics on hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cryocube.questions.metrics import (
    bootstrap_ci,
    box_iou,
    confusion,
    normalize_answer,
    score,
    summarize,
    token_f1,
)
from cryocube.questions.parsers import parse

LABELS = ("low", "medium", "high")


@pytest.mark.parametrize(
    "text, want",
    [
        ("high", "high"),
        ("High.", "high"),
        ("The coherence is medium overall.", "medium"),
        ("  LOW  ", "low"),
        ("poor", "low"),  # an alias
        ("High. Not low at all.", "high"),  # two labels, the answer starts with one
        ("between low and high", None),  # ambiguous
        # a word containing a label is not the label
        ("", None),
        (None, None),
        ("I cannot tell", None),
        ("highly", None),
    ],
)
def test_class_answers(text, want):
    p = parse("class", text, labels=LABELS, aliases={"low": ("poor",)})
    assert p.ok == (want is not None) and p.value == want


@pytest.mark.parametrize(
    "text, want",
    [
        ("3", 3.0),
        ("about 3", 3.0),
        ("3 fringes", 3.0),
        ("I count 4.5 fringes (22 cm)", 4.5),
        ("three", 3.0),
        ("There are two fringes.", 2.0),
        ("2-3", 2.5),
        ("2 to 4 fringes", 3.0),
        ("no fringes", 0.0),
        ("No: I count 3", 3.0),
        ("", None),
        ("many", None),
        (None, None),
    ],
)
def test_number_answers(text, want):
    p = parse("number", text)
    assert p.ok == (want is not None) and p.value == want


def test_box_answers():
    p = parse("box", "The uplift is at [0.2, 0.3, 0.6, 0.7], a ring north of the summit")
    assert (
        p.ok
        and p.value == (0.2, 0.3, 0.6, 0.7)
        and p.text == "The uplift is at , a ring north of the summit"
    )
    # two boxes: the first counts; corners given in the wrong order are sorted
    assert parse("box", "(0.6, 0.7, 0.2, 0.3) and [0, 0, 1, 1]").value == (0.2, 0.3, 0.6, 0.7)
    # pixels of a 64 x 32 panel become fractions; coordinates beyond the picture are clipped
    assert parse("box", "[16, 8, 48, 40]", size=(64, 32)).value == (0.25, 0.25, 0.75, 1.0)
    assert not parse("box", "[16, 8, 48, 40]").ok  # pixels without a picture size cannot be read
    assert parse("box", "0.1, 0.2, 0.3, 0.4").value == (0.1, 0.2, 0.3, 0.4)
    for text in ("", "somewhere in the north", "[0.1, 0.2]", None):
        p = parse("box", text)
        assert not p.ok and p.value is None


def test_text_answers_and_parsers_never_raise():
    assert parse("text", "  turbulent   atmosphere ").value == "turbulent atmosphere"
    assert not parse("text", "   ").ok
    for kind in ("class", "number", "box", "text"):
        for junk in ("\x00\x01", "[[[", "1e999999", "9" * 5000, "((1,2,3,4", object()):
            p = parse(kind, junk, labels=LABELS)
            assert isinstance(p.ok, bool)


def test_token_f1_by_hand():
    assert normalize_answer("The Ring, north!") == "ring north"
    # prediction "uplift ring north" vs reference "a ring to the north": common {ring, north} = 2,
    # precision 2/3, recall 2/3 ("a" and "the" dropped: ring, to, north) -> F1 2/3
    assert token_f1("uplift ring north", "a ring to the north") == pytest.approx(2 / 3)
    assert token_f1("", "anything") == 0.0 and token_f1("", "") == 1.0
    assert token_f1("north north", "north") == pytest.approx(2 * 0.5 * 1 / 1.5)


def test_box_iou_by_hand():
    assert box_iou((0, 0, 0.5, 0.5), (0, 0, 0.5, 0.5)) == 1.0
    # overlap 0.25 x 0.5 = 0.125; union 0.25 + 0.25 - 0.125 = 0.375
    assert box_iou((0, 0, 0.5, 0.5), (0.25, 0, 0.75, 0.5)) == pytest.approx(1 / 3)
    assert box_iou((0, 0, 0.1, 0.1), (0.5, 0.5, 1, 1)) == 0.0
    assert box_iou(None, (0, 0, 1, 1)) == 0.0


def test_unparsed_answers_score_as_wrong():
    assert (
        score("accuracy", None, "low", False) == 0.0
        and score("accuracy", "low", "low", True) == 1.0
    )
    assert (
        score("mae", None, 4.0, False, unparsed_value=0.0) == 4.0
        and score("mae", 2.5, 4.0, True) == 1.5
    )
    assert score("box_iou", None, (0, 0, 1, 1), False) == 0.0
    # an unparsed answer's text does not count
    assert score("token_f1", None, "ring", False, text="ring") == 0.0


def test_means_and_bootstrap_intervals():
    s = summarize("accuracy", [1, 0, 1, 1])
    assert (
        s["value"] == 75.0
        and s["n"] == 4
        and s["ci_low"] <= 75.0 <= s["ci_high"]
        and s["ci_high"] <= 100.0
    )
    assert summarize("mae", [1.0, 3.0])["value"] == 2.0
    assert bootstrap_ci([2.0] * 10) == (2.0, 2.0)  # no spread, no interval
    lo, hi = bootstrap_ci(np.r_[np.zeros(50), np.ones(50)])
    # the mean of 100 fair coin flips: its standard error is 0.05, so the 95 % interval is about
    # +-0.1
    assert 0.37 < lo < 0.43 and 0.57 < hi < 0.63
    assert bootstrap_ci([0.0, 1.0, 1.0], seed=3) == bootstrap_ci([0.0, 1.0, 1.0], seed=3)
    assert all(math.isnan(x) for x in bootstrap_ci([]))


def test_confusion_counts_unparsed_in_its_own_column():
    m = confusion(["low", "low", "high", "medium"], ["low", None, "medium", "medium"], LABELS)
    assert m == [[1, 0, 0, 1], [0, 1, 0, 0], [0, 1, 0, 0]]


# -- the answer table: tests/data/vqa_answers.yaml
# --------------------------------------------------------

TABLE_FILE = __import__("pathlib").Path(__file__).parent / "data" / "vqa_answers.yaml"


def _table() -> list[dict]:
    import yaml

    return yaml.safe_load(TABLE_FILE.read_text())


def _options(row: dict) -> tuple[str, dict]:
    """The row's answer text (a `{prompt}` echo filled) and the parser options a task would pass."""
    from cryocube.questions.tasks import all_tasks, fill

    text, opts = row["text"], {}
    if "prompt" in row:
        opts["prompt"] = fill(
            all_tasks()[row["prompt"]],
            {
                "primary_date": "2020-01-01",
                "secondary_date": "2020-01-13",
                "radar_wavelength_m": 0.05546576,
            },
        )
        text = text.replace("{prompt}", opts["prompt"])
    if row["kind"] == "class":
        opts["labels"] = tuple(row.get("labels", LABELS))
        opts["aliases"] = {
            k: tuple(v)
            for k, v in row.get(
                "aliases", {"low": ["poor", "bad", "decorrelated"], "high": ["good", "excellent"]}
            ).items()
        }
        opts["letters"] = bool(row.get("letters"))
    if row["kind"] == "number" and row.get("domain", ()) is not None:
        # null: no domain given, the parser's own (a count's)
        opts["domain"] = tuple(row.get("domain", (0, None)))
    if "size" in row:
        opts["size"] = tuple(row["size"])
    return text, opts


def test_the_answer_table_is_big_and_covers_every_habit_and_misread():
    rows = _table()
    assert len(rows) >= 150
    assert {"llava", "qwen2-vl", "smolvlm", "paligemma"} <= {r["habit"] for r in rows}
    assert {"class", "number", "fraction", "box", "text"} == {r["kind"] for r in rows}
    # verbatim answers from public logs, with where they were published
    assert sum("source" in r for r in rows) >= 3
    texts = {(r["kind"], r["text"]): r["want"] for r in rows}
    # every misread of issue 25, with its refusal or its one reading
    assert texts[("number", "between 2 and 4")] == texts[("number", "2 to 4 fringes")] == 3
    assert texts[("number", "1,000")] == 1000 and texts[("number", "-2")] == "unparsed"
    assert (
        texts[("number", "2020-01-01")] == "unparsed"
        and texts[("class", "Medium-high")] == "unparsed"
    )
    assert (
        texts[("box", "[0.2, 0.3, 45, 60]")] == "unparsed"
        and texts[("box", "[0.5, 0.2, 0.5, 0.6]")] == "unparsed"
    )
    assert sum("misread" in r for r in rows) >= 7
    # every misread of issue 38
    assert texts[("number", "three or four")] == 3.5
    assert texts[("number", "twenty-one fringes")] == 21
    for kind, text in (
        ("number", "There is no way to tell from this picture."),
        ("class", "low-to-medium"),
        ("class", "Not an earthquake."),
        ("class", "I would not call it high."),
        ("number", "-2 fringes"),
    ):
        assert texts[(kind, text)] == "unparsed"
    stated = "[0.2, 0.1, 0.6, 0.5] (y_min, x_min, y_max, x_max)"
    assert texts[("box", stated)] == [0.1, 0.2, 0.5, 0.6]


@pytest.mark.parametrize("row", _table(), ids=lambda r: f"{r['kind']}:{r['text'][:40]!r}")
def test_the_answer_table(row):
    text, opts = _options(row)
    p = parse(row["kind"], text, **opts)
    want = row["want"]
    if want == "unparsed":
        assert not p.ok and p.value is None, f"{text!r} read as {p.value!r}"
        return
    assert p.ok, f"{text!r} was not read (want {want!r})"
    if row["kind"] == "box":
        assert p.value == pytest.approx(tuple(want), abs=1e-9)
    elif row["kind"] in ("number", "fraction"):
        assert p.value == pytest.approx(float(want))
    else:
        assert p.value == str(want)


def test_a_number_tasks_domain_holds_at_scoring():
    """A count task without `domain:` is held to [0, open) at scoring, whichever parser read the
    answer; a task's own domain wins."""
    import dataclasses

    from cryocube.questions.parsers import Parsed
    from cryocube.questions.tasks import all_tasks

    t = dataclasses.replace(all_tasks()["fringe_counting"], domain=None)
    assert t.parser_options() == {"domain": (0.0, None)}
    assert not t.checked(Parsed(-2.0, True)).ok and t.checked(Parsed(2.0, True)).value == 2.0
    assert not t.checked(parse("number", "-2 fringes", domain=(None, None))).ok
    signed = dataclasses.replace(t, domain=(None, None))
    assert signed.checked(parse("number", "-2", **signed.parser_options())).value == -2.0
    level = all_tasks()["atmospheric_fringes"]
    assert not level.checked(Parsed(4.0, True)).ok and level.checked(Parsed(3.0, True)).ok
    # classes and boxes pass through
    cls = all_tasks()["coherence_classification"]
    assert cls.checked(Parsed("low", True)) == Parsed("low", True)
