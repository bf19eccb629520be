"""The board's split of a sample cube: stratified on the joint answer classes of the cube's class
tasks and the presence of a box, so every answer class with enough samples is tested (issue 38:
the old rule called box-less pairs unlabelled and kept every low-coherence pair in train)."""

from __future__ import annotations

import numpy as np
import pytest

from cryocube.families.split import SPLITS, draw_split

FRACTIONS = {"train": 0.6, "val": 0.2, "test": 0.2}


def _where(classes, splits, axis, cls):
    col = np.asarray(classes, dtype=object)[:, axis]
    return {s: int(((col == cls) & (splits == s)).sum()) for s in SPLITS}


def test_every_class_with_three_samples_reaches_every_split_and_the_draw_is_seeded():
    rng = np.random.default_rng(5)
    coh = rng.choice(["low", "medium", "high"], 60, p=[0.7, 0.25, 0.05])
    coh[:3] = "high"  # at least three of the rarest
    box = np.where(coh == "low", "no box", rng.choice(["box", "no box"], 60))
    classes = np.stack([coh, box], axis=1).astype(object)
    classes[-4:] = ""  # unlabelled: no label for any task
    classes[-6, 0] = "rare"  # two samples of a class: too few to test
    classes[-5, 0] = "rare"
    s = draw_split(classes, FRACTIONS, 7)
    assert (draw_split(classes, FRACTIONS, 7) == s).all()
    assert not (draw_split(classes, FRACTIONS, 8) == s).all()
    for axis, cls in ((0, "low"), (0, "medium"), (0, "high"), (1, "box"), (1, "no box")):
        got = _where(classes, s, axis, cls)
        assert all(got[x] >= 1 for x in SPLITS), (cls, got)
    rare = _where(classes, s, 0, "rare")
    assert rare["test"] == 0 and rare["train"] >= 1
    assert (s[-4:] == "train").all()
    # the fractions hold overall, within the per-class rounding
    assert abs((s == "test").sum() - 0.2 * 56) <= 3 and abs((s == "val").sum() - 0.2 * 56) <= 3


def test_a_class_with_three_samples_in_one_joint_stratum_reaches_test_and_val():
    # "low" pairs all lack a box, and "high" has exactly three: one per split
    classes = np.array(
        [["low", "no box"]] * 14 + [["medium", "box"]] * 20 + [["high", "box"]] * 3, dtype=object
    )
    for seed in range(20):
        s = draw_split(classes, FRACTIONS, seed)
        for cls in ("low", "medium", "high"):
            assert all(v >= 1 for v in _where(classes, s, 0, cls).values()), (seed, cls)


@pytest.fixture(scope="module")
def ifg40(insar_cube):
    return insar_cube(n=40, size=32, seed=0)


def test_forty_pairs_test_every_coherence_class_and_chance_scores_the_majority_share(ifg40):
    """Issue 38's case: all 14 low-coherence pairs have an empty mask; each class is in the test
    split, and chance (the train majority) scores that class's share of the test pairs."""
    from cryocube.cube import cube_info
    from cryocube.families.split import cube_split
    from cryocube.questions.ask import questions
    from cryocube.questions.cells import chance, chance_cells
    from cryocube.questions.tasks import select

    url, m = ifg40
    split, ids, record = cube_split(url, cube_info(url).checksum)
    truth = np.array(["low", "medium", "high"])[[p.coherence_class for p in m.pairs]]
    test = truth[split == "test"]
    assert set(test) == {"low", "medium", "high"}
    assert (truth == "low").sum() == 14
    assert record["classes"]["coherence_classification"] == {
        c: {s: int(((truth == c) & (split == s)).sum()) for s in SPLITS}
        for c in ("high", "low", "medium")
    }
    tasks = {t.name: t for t in select(None, "samples", "insar")}
    qs = questions(url, list(tasks.values()))[0]
    guess = chance(qs, tasks, split)(next(q for q in qs if q.task == "coherence_classification"))
    train = list(truth[split == "train"])
    labels = ["low", "medium", "high"]
    # the train majority (ties: the task's first label)
    assert guess == max(labels, key=lambda c: (train.count(c), -labels.index(c)))
    cell = next(
        c
        for c in chance_cells(qs, tasks, split, ids, 200, 0)
        if c["task"] == "coherence_classification" and c["class"] is None
    )
    assert cell["n"] == test.size
    assert cell["value"] == pytest.approx(100.0 * (test == guess).sum() / test.size)
    assert 0 < cell["value"] < 100


# -- one board per cube
# ------------------------------------------------------------------------------------------

BOARD_SETS = ["block_samples=8", "gen_batch=8", "max_new_tokens=6"]


def _tables(text: str) -> dict[str, list[list[str]]]:
    """LEADERBOARD.md's tables by title, each its rows of cells."""
    out: dict[str, list[list[str]]] = {}
    title = None
    for line in text.splitlines():
        if line.startswith("### "):
            title = line[4:]
            out[title] = []
        elif line.startswith("| ") and title is not None:
            out[title].append([c.strip() for c in line.strip().strip("|").split("|")])
    return out


def test_two_interferogram_cubes_in_one_results_folder_are_two_boards(insar_cube, tmp_path, client):
    """Issue 38: a second cube's run landed in the first cube's table with every cell refused. Each
    cube now has its own table, headed with its name, checksum and split, with its own cells; the
    test split per class is the note under each."""
    from cryocube.cli import main
    from cryocube.cube import cube_info
    from cryocube.engine.evaluate import evaluate
    from cryocube.families import RunSpec
    from cryocube.families.recipes import load_recipe

    out = tmp_path / "results"
    recs = {}
    for seed in (0, 1):
        url = insar_cube(n=8, size=32, seed=seed)[0]
        (recs[url],) = evaluate(
            [RunSpec("transformers", url, "vqa")],
            str(out),
            load_recipe(None, BOARD_SETS),
            client=client,
            progress=False,
            allow_random_weights=True,
        ).records
        assert recs[url]["status"] == "ok", recs[url].get("error")
    assert main(["report", str(out), "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "LEADERBOARD.md").read_text()
    tables = _tables(text)
    assert len(tables) == 2 and "refused" not in text
    for url, rec in recs.items():
        checksum = cube_info(url).checksum
        (title,) = [t for t in tables if f"cube {checksum[:8]}" in t]
        assert title.startswith(f"InSAR-VLM-Bench tasks on insar.zarr (insar, cube {checksum[:8]}")
        assert f"split {rec['board_split']['digest'][:6]}" in title
        rows = {r[0]: r for r in tables[title][1:]}
        acc = next(
            c
            for c in rec["metrics"]["cells"]
            if c["task"] == "coherence_classification" and c["class"] is None
        )
        vlm = rows["tiny random llava (random init)"]
        lo, hi = acc["ci_low"], acc["ci_high"]
        assert vlm[2] == f"{acc['value']:.2f} [{lo:.2f}, {hi:.2f}] n={acc['n']}"
        chance = next(
            c
            for c in rec["metrics"]["baselines"]["chance"]
            if c["task"] == "coherence_classification" and c["class"] is None
        )
        assert rows["chance"][2].startswith(f"{chance['value']:.2f} [")
    # the per-class test counts under each board
    for rec in recs.values():
        counts = rec["board_split"]["classes"]["coherence_classification"]
        line = "test split per class: coherence_classification: " + ", ".join(
            f"{c} {n['test']}" if n["test"] else f"{c} too few to test ({sum(n.values())} samples)"
            for c, n in counts.items()
        )
        assert line in text
    html = (tmp_path / "report" / "report.html").read_text()
    assert html.count("per answer class") >= 2
