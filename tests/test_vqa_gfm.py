"""GFMs beside VLMs on the interferogram tasks: a random-weights encoder is probed on a synthetic
interferogram cube (phase and coherence fed by the cross-sensor rule, the 3-way coherence class as
one-vs-rest binary tasks), the tiny random VLM answers the same cube, and `report` puts both on one
LEADERBOARD.md, on a real LocalCluster.
"""

from __future__ import annotations

import json
import re

import pytest

from cryocube.families import RunSpec


@pytest.fixture(scope="module")
def ifg12(insar_cube):
    # 12: NeuCo-Bench's 10 % test split keeps 2 rows for R²
    return insar_cube(n=12, size=32, seed=0)[0]


def _run(cube, out, client, model, protocol, sets):
    from cryocube.engine.evaluate import evaluate
    from cryocube.families.recipes import load_recipe

    return evaluate(
        [RunSpec(model, cube, protocol)],
        str(out),
        load_recipe(None, list(sets)),
        client=client,
        progress=False,
        allow_random_weights=True,
    )


def test_gfm_and_vlm_on_one_interferogram_board(ifg12, tmp_path, client):
    from cryocube.cli import main
    from cryocube.errors import UserError

    out = tmp_path / "results"
    # the catalog publishes no statistics for phase and coherence: the refusal names the fix
    with pytest.raises(UserError, match=r"no published mean/std.*--set normalization=cube"):
        _run(ifg12, out, client, "vit_scratch", "probe", ["input_size=32"])
    (gfm,) = _run(
        ifg12, out, client, "vit_scratch", "probe", ["input_size=32", "normalization=cube"]
    ).records
    assert gfm["status"] == "ok", gfm.get("error")
    assert gfm["band_mode"].startswith(
        "cross_sensor: B4<-wrapped_phase, B3<-coherence, B2<-unwrapped_phase"
    )
    ovr = sorted(t for t in gfm["tasks"] if t.startswith("coherence_classification"))
    assert ovr == [f"coherence_classification_{c}_vs_rest__cls" for c in ("high", "low", "medium")]
    assert (
        "fringe_counting__regr" in gfm["tasks"]
        and "coherence_classification__cls" not in gfm["tasks"]
    )
    assert any("one-vs-rest" in d for d in gfm["neuco_bench_differences"])
    (vlm,) = _run(
        ifg12,
        out,
        client,
        "transformers",
        "vqa",
        ["block_samples=6", "gen_batch=6", "max_new_tokens=6"],
    ).records
    assert vlm["status"] == "ok", vlm.get("error")

    assert main(["report", str(out), "--out", str(tmp_path / "report")]) == 0
    board = (tmp_path / "report" / "LEADERBOARD.md").read_text()
    rows = {
        r[0]: r
        for r in (
            [c.strip() for c in line.strip("|").split("|")]
            for line in board.splitlines()
            if line.startswith("| ")
        )
    }
    assert rows["Model"][2:7] == [
        "Coherence Acc (%)",
        "Localisation IoU (%)",
        "Localisation F1 (%)",
        "Fringe MAE (count)",
        "Noise F1 (%)",
    ]
    v = rows["tiny random llava (random init)"]
    mae = {(c["task"], c["metric"]): c for c in vlm["metrics"]["cells"] if c["class"] is None}[
        ("fringe_counting", "mae")
    ]
    assert (
        v[1] == "VLM"
        and v[5] == f"{mae['value']:.2f} [{mae['ci_low']:.2f}, {mae['ci_high']:.2f}] n={mae['n']}"
    )
    # the probe's F1 / R² (NeuCo-Bench, its own 10 % splits) stay in the embedding report, off the
    # VLM columns
    assert "ViT" not in rows and "(probe" not in board
    assert re.search(r"ViT", (tmp_path / "report" / "report.html").read_text())
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert {r["family"] for r in recs} == {"embedding", "vqa"}


def _board_rows(text: str) -> dict[str, list[str]]:
    return {
        r[0]: r
        for r in (
            [c.strip() for c in line.strip("|").split("|")]
            for line in text.splitlines()
            if line.startswith("| ")
        )
    }


def test_quickstart_puts_a_random_vlm_and_a_gfm_on_the_interferogram_board(
    tmp_path, client, capsys
):
    """`quickstart --datasets ''` runs only the interferogram part, on the session's LocalCluster;
    the printed board holds the tiny random VLM and the probed encoder, and the screen says random
    models measure the pipeline.
    """
    from cryocube.cli import main
    from cryocube.engine.quickstart import QUICKSTART_MIN_PAIRS
    from cryocube.families.embedding.probe import _min_labelled

    # the probe's own floor (R² needs 2 test rows)
    assert QUICKSTART_MIN_PAIRS == _min_labelled(0.1, 2)
    out = tmp_path / "qs"
    # too few pairs for the GFM's probe: refused before any cluster (nothing listens on port 9)
    assert (
        main(
            [
                "quickstart",
                "--datasets",
                "",
                "--interferograms",
                str(QUICKSTART_MIN_PAIRS - 1),
                "--out",
                str(out),
                "--cluster",
                "tcp://127.0.0.1:9",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert (
        f"--interferograms {QUICKSTART_MIN_PAIRS - 1}: the probe of --gfm ssl4eo_moco needs at"
        " least" in err
    )
    assert not out.exists()

    assert (
        main(
            [
                "quickstart",
                "--datasets",
                "",
                "--interferograms",
                str(QUICKSTART_MIN_PAIRS),
                "--out",
                str(out),
                "--cluster",
                client.scheduler.address,
            ]
        )
        == 0
    )
    printed = capsys.readouterr()
    assert (
        "random models measure the pipeline" in printed.err
        and "ssl4eo_moco answers them through linear heads" in printed.err
    )
    assert "blind baseline" in printed.err
    assert "fills its 'Localisation IoU' cell" in printed.err
    text = printed.out.splitlines()
    start = next(
        i for i, x in enumerate(text) if x.startswith("| Model | Kind | Coherence Acc (%)")
    )
    end = next((i for i in range(start, len(text)) if not text[i].startswith("|")), len(text))
    lines = [
        [c.strip() for c in x.strip().strip("|").split("|")]
        for x in text[start:end]
        if x.startswith("| ")
    ]
    gfm = "S12-MoCo (random init)"
    vlm = "tiny random llava (random init)"
    assert [tuple(r[:2]) for r in lines if r[0] != "Model"] == [
        ("chance", "baseline: chance"),
        (f"{vlm} (blind)", "baseline: blind"),
        (vlm, "VLM"),
        (gfm, "GFM (linear head)"),
        (gfm, "GFM (segmentation)"),
    ]
    heads = [r for r in printed.out.splitlines() if "| GFM (linear head) |" in r]
    assert len(heads) == 1 and heads[0].startswith(f"| {gfm} |") and "n=" in heads[0]
    seg = [r for r in printed.out.splitlines() if "| GFM (segmentation) |" in r]
    # the frozen run of the same encoder localises
    assert len(seg) == 1 and "(segmentation, mask->box)" in seg[0]
    assert "| chance | baseline: chance |" in printed.out
    recs = [json.loads(x) for x in (out / "results" / "results.jsonl").read_text().splitlines()]
    assert sorted((r["family"], r["status"]) for r in recs) == [
        ("embedding", "ok"),
        ("heads", "ok"),
        ("segmentation", "ok"),
        ("vqa", "ok"),
        ("vqa", "ok"),
    ]
    assert sorted(bool(r.get("blind")) for r in recs if r["family"] == "vqa") == [False, True]
    assert not (out / "cubes" / "glid.zarr").exists()  # no segmentation part was run
