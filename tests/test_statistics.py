"""The report's uncertainty (docs/statistics.md): intervals that cover what they say on synthetic
test sets drawn from a known model, point estimates equal to rliable's definitions computed the
straightforward way, per-tile data written by a real segmentation run, and reports of generated
and of old records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from cryocube.families.segmentation.metrics import metrics_from_confusion
from cryocube.report import stats

K = 3
# the known model: expected confusion rates of a decent segmenter (rows truth, columns prediction)
RATES = np.array([[0.50, 0.04, 0.02], [0.03, 0.25, 0.03], [0.01, 0.02, 0.10]])
TRUTH = float(stats.miou(RATES))
SETS = 1000  # simulated test sets per coverage figure
COVERAGE_DRAWS = 1000  # bootstrap draws per simulated set (the report uses 2,000)


def simulate(rng, sets, scenes, tiles, scene_concentration=None, rates=RATES, pixels=400):
    """Per-tile confusion matrices (sets, scenes, tiles, K, K). Each scene's rates are drawn from a
    Dirichlet around `rates` (None: every scene has `rates`, tiles independent), each tile's from a
    Dirichlet around its scene's, then its pixels from a multinomial. Every tile's expected rates
    are `rates`, so the true mIoU is miou(rates)."""
    k2 = rates.size
    a = rates.ravel()
    if scene_concentration is None:
        ps = np.broadcast_to(a, (sets, scenes, 1, k2))
    else:
        g = rng.gamma(scene_concentration * a, size=(sets, scenes, 1, k2))
        ps = g / g.sum(-1, keepdims=True)
    g = rng.gamma(np.broadcast_to(200.0 * ps, (sets, scenes, tiles, k2)))
    cms = rng.multinomial(pixels, g / g.sum(-1, keepdims=True))
    return cms.reshape(sets, scenes, tiles, *rates.shape)


def coverage(units: np.ndarray, rng, draws=COVERAGE_DRAWS, chunk=100) -> float:
    """The share of simulated sets whose cell interval covers the truth; units (sets, n, K, K) are
    what the bootstrap resamples (scene sums, or tiles)."""
    sets, n = units.shape[:2]
    flat = units.reshape(sets, n, -1).astype(float)
    hit = 0
    for s0 in range(0, sets, chunk):
        u = flat[s0 : s0 + chunk]
        counts = rng.multinomial(n, np.full(n, 1 / n), size=(u.shape[0], draws)).astype(float)
        d = stats.miou((counts @ u).reshape(u.shape[0], draws, K, K))
        lo, hi = stats.cluster_interval(d, n, axis=1)
        hit += int(((lo <= TRUTH) & (TRUTH <= hi)).sum())
    return hit / sets


def test_miou_of_many_matrices_is_the_runs_own():
    rng = np.random.default_rng(0)
    cms = rng.integers(0, 50, size=(40, 4, 4))
    cms[3, 2, :] = 0
    cms[3, :, 2] = 0  # a class absent from prediction and truth: left out of the mean
    cms[5] = 0
    got = stats.miou(cms)
    for c, g in zip(cms, got):
        want = metrics_from_confusion(c)["mIoU"]
        assert (np.isnan(want) and np.isnan(g)) or g == pytest.approx(want, abs=1e-9)


@pytest.mark.parametrize("concentration", [None, 20.0], ids=["independent", "scene-correlated"])
def test_scene_bootstrap_covers_95_percent_with_20_scenes(concentration):
    rng = np.random.default_rng(1)
    cms = simulate(rng, SETS, 20, 5, concentration)
    cov = coverage(cms.sum(2), rng)
    assert 0.93 <= cov <= 0.97, cov


def test_tile_bootstrap_undercovers_scene_correlated_tiles():
    """Treating tiles of one scene as independent makes the interval far too narrow."""
    rng = np.random.default_rng(2)
    cms = simulate(rng, 300, 20, 5, 20.0)
    assert coverage(cms.reshape(300, 100, K, K), rng) < 0.8
    # ...while on independent tiles it is right
    cms = simulate(rng, 300, 20, 5, None)
    assert coverage(cms.reshape(300, 100, K, K), rng) > 0.9


def _tiles(cms: np.ndarray, tiles_per_scene: int) -> stats.TileData:
    n = cms.shape[0]
    return stats.TileData(
        cms, np.arange(n), np.array([f"scene{i // tiles_per_scene}" for i in range(n)])
    )


def test_a_cell_on_few_scenes_says_so_and_one_without_tiles_says_that():
    rng = np.random.default_rng(3)
    cms = simulate(rng, 2, 4, 6, 20.0).reshape(2, 24, K, K)
    cells = {
        "A": [(float(stats.miou(c.sum(0))), _tiles(c, 6)) for c in cms],
        "B": [(50.0, None)],
    }
    out = stats.dataset_intervals("glid", cells, draws=500)
    a, b = out["A"], out["B"]
    assert (a.tiles, a.scenes, a.unit) == (24, 4, "scene")
    assert "only 4 scenes" in a.note
    assert a.lo < a.mean < a.hi
    assert a.seed_sd == pytest.approx(np.std([v for v, _ in cells["A"]], ddof=1))
    assert b.lo is None and b.note == stats.NO_TILES
    # every tile its own scene: the tile bootstrap, and no few-scenes note
    solo = stats.dataset_intervals(
        "glid", {"A": [(1.0, stats.TileData(cms[0], np.arange(24), np.arange(24).astype(str)))]}
    )["A"]
    assert solo.unit == "tile" and solo.note == ""


def test_paired_bootstrap_uses_the_same_draws_for_both_models():
    rng = np.random.default_rng(4)
    base = simulate(rng, 1, 30, 4, 20.0)[0].reshape(120, K, K)
    # B is A with a few more errors on each tile: a small difference, highly correlated
    worse = base.copy()
    worse[:, 0, 0] -= 3
    worse[:, 0, 1] += 3
    cells = {
        "A": [(float(stats.miou(base.sum(0))), _tiles(base, 4))],
        "B": [(float(stats.miou(worse.sum(0))), _tiles(worse, 4))],
    }
    out = stats.dataset_intervals("sicd", cells, draws=2000)
    diff, lo, hi = stats.paired_difference(out["A"], out["B"])
    assert diff > 0 and lo > 0  # paired: the small, consistent gain is clear...
    # ...though the two cells' own intervals overlap, so the ranking calls them tied
    assert out["A"].lo < out["B"].hi and out["A"].ties == ("B",)
    assert out["A"].rank == (1, 1) and out["B"].rank == (2, 2)


def _loop_iqm(scores: dict[str, list[float]]) -> float:
    flat = sorted(v for vs in scores.values() for v in vs)
    return float(sps.trim_mean(flat, 0.25))


def _loop_improvement(xs: dict[str, list[float]], ys: dict[str, list[float]]) -> float:
    per = []
    for d in sorted(set(xs) & set(ys)):
        wins = [1.0 if x > y else 0.5 if x == y else 0.0 for x in xs[d] for y in ys[d]]
        per.append(sum(wins) / len(wins))
    return sum(per) / len(per)


def test_across_dataset_point_estimates_are_rliables_definitions():
    rng = np.random.default_rng(5)
    scores = {
        m: {
            d: list(np.round(rng.normal(50 + 3 * i + j, 2, size=3), 1))
            for j, d in enumerate("wxyz")
        }
        for i, m in enumerate(["A", "B", "C"])
    }
    scores["C"]["w"] = scores["B"]["w"]  # ties count half
    aggs = stats.aggregates(scores, draws=200)
    poi = stats.improvement_matrix(scores, draws=200)
    for m, per in scores.items():
        assert aggs[m].iqm == pytest.approx(_loop_iqm(per), abs=1e-9)
        assert aggs[m].mean == pytest.approx(np.mean([v for vs in per.values() for v in vs]))
        for o in scores:
            if o != m:
                assert poi[(m, o)][0] == pytest.approx(_loop_improvement(per, scores[o]))
                assert poi[(m, o)][0] + poi[(o, m)][0] == pytest.approx(1.0)
    # odd counts: scipy cuts int(0.25 n) from each end
    a = rng.normal(size=(7, 13))
    assert np.allclose(stats.trimmed_mean(a, axis=1), sps.trim_mean(a, 0.25, axis=1))


def test_stratified_interval_matches_a_loop_bootstrap_within_monte_carlo_error():
    """The vectorised stratified bootstrap against a plain loop (resample each dataset's seeds,
    recompute the IQM), independent draws; their ends agree to Monte-Carlo error."""
    rng = np.random.default_rng(6)
    per = {d: list(rng.normal(60 + 5 * j, 3, size=5)) for j, d in enumerate("abcd")}
    a = stats.aggregates({"M": per}, draws=20000)["M"]
    loop = []
    for _ in range(4000):
        drawn = {d: list(rng.choice(v, size=len(v))) for d, v in per.items()}
        loop.append(_loop_iqm(drawn))
    lo, hi = np.percentile(loop, [2.5, 97.5])
    width = hi - lo
    assert abs(a.iqm_lo - lo) < 0.05 * width and abs(a.iqm_hi - hi) < 0.05 * width


# -- reports of generated records ------------------------------------------------------------------

MODELS = ("ssl4eo_moco", "dofa", "croma_optical", "prithvi")
DATASETS = ("glid", "gld", "sicd", "caffe")
PROTOCOLS = ("frozen", "fewshot", "finetune", "cross_sensor")
NAMES = ("S12-MoCo", "DOFA", "CROMA", "Prithvi")


def write_grid(
    out: Path,
    models=MODELS,
    datasets=DATASETS,
    protocols=PROTOCOLS,
    seeds=(0, 1, 2),
    scenes: int = 12,
    tiles: int = 8,
    seed: int = 0,
) -> int:
    """A results folder of segmentation records with per-tile files, as the family writes them:
    one run per (model, dataset, protocol, seed), models of increasing quality. Returns runs."""
    from cryocube.families.base import content_hash
    from cryocube.families.segmentation import PER_TILE_FILE
    from cryocube.record import RunRecord, run_dir, write_record

    rng = np.random.default_rng(seed)
    n = 0
    for d_i, d in enumerate(datasets):
        scene_rates = {}
        for m_i, m in enumerate(models):
            # a better model moves mass onto the diagonal; scenes differ the same way for all
            good = RATES + np.diag([0.02, 0.06, 0.08]) * m_i
            scene_rates[m] = good / good.sum()
        for p in protocols:
            for m in models:
                for s in seeds:
                    rates = scene_rates[m] * rng.uniform(0.95, 1.05, size=(K, K))
                    cms = simulate(rng, 1, scenes, tiles, 30.0, rates / rates.sum())[0]
                    cms = cms.reshape(scenes * tiles, K, K)
                    identity = {"model": m, "dataset": d, "protocol": p, "seed": s, "grid": seed}
                    rid = content_hash(identity)
                    rdir = Path(run_dir(str(out), rid))
                    rdir.mkdir(parents=True, exist_ok=True)
                    source = np.array([f"{d}-scene{i // tiles}" for i in range(scenes * tiles)])
                    np.savez_compressed(
                        rdir / PER_TILE_FILE,
                        confusion=cms,
                        sample=np.arange(scenes * tiles) + 1000,
                        source=source,
                    )
                    data = (rdir / PER_TILE_FILE).read_bytes()
                    rec = RunRecord(
                        run_id=rid, family="segmentation", model=m, dataset=d, protocol=p, seed=s,
                        status="ok", primary_metric="mIoU",
                        metrics=metrics_from_confusion(cms.sum(0), ["a", "b", "c"]),
                        identity=identity,
                        fields={
                            "per_tile": {
                                "file": PER_TILE_FILE,
                                "url": str(rdir / PER_TILE_FILE),
                                "sha256": __import__("hashlib").sha256(data).hexdigest(),
                                "tiles": scenes * tiles,
                                "scenes": scenes,
                            }
                        },
                    )  # fmt: skip
                    write_record(str(out), rec)
                    n += 1
    return n


def test_the_192_run_grid_report_builds_with_every_interval(tmp_path):
    from cryocube.pages import build_report
    from cryocube.report.records import load_results

    assert write_grid(tmp_path / "results") == 192
    res = load_results(tmp_path / "results")
    assert len(res.runs) == 192
    rep = build_report(res, tmp_path / "report", formats=["md", "json"], draws=300)
    for key in PROTOCOLS:
        bi = rep.uncertainty[key]
        assert len(bi.cells) == 16 and all(c.lo < c.mean < c.hi for c in bi.cells.values())
        assert all((c.tiles, c.scenes, c.seeds) == (96, 12, 3) for c in bi.cells.values())
        for m, a in bi.aggregates.items():
            flat = [v for vs in bi.scores[m].values() for v in vs]
            assert len(flat) == 12 and abs(a.iqm - sps.trim_mean(flat, 0.25)) < 0.01
        # the best model (the last) beats the worst by far on every dataset
        p, lo, hi, n = bi.improvement[(NAMES[-1], NAMES[0])]
        assert p > 0.9 and lo <= p <= hi and n == 4
    t = json.loads((tmp_path / "report" / "frozen" / "intervals.json").read_text())
    assert len(t["rows"]) == 16
    assert (tmp_path / "report" / "figures" / "frozen_improvement.png").exists()
    assert (tmp_path / "report" / "figures" / "frozen_profile.svg").exists()


def test_same_records_same_report_and_a_paired_comparison_from_the_cli(tmp_path, capsys):
    from cryocube.cli import main

    write_grid(
        tmp_path / "results", models=MODELS[:2], datasets=DATASETS[:2], protocols=("frozen",)
    )
    texts = []
    for k in range(2):
        args = ["report", str(tmp_path / "results"), "--out", str(tmp_path / f"r{k}")]
        args += ["--format", "md,json", "--draws", "400", "--compare", "dofa,ssl4eo_moco"]
        assert main(args) == 0
        texts.append(capsys.readouterr().out.split("\nwrote ")[0])
    assert texts[0] == texts[1]
    out = texts[0]
    assert "mIoU with 95 % intervals over test scenes" in out
    assert "across datasets (IQM and mean" in out and "probability of improvement" in out
    assert "DOFA − S12-MoCo [95 % interval]" in out
    paired = json.loads((tmp_path / "r0" / "compare" / "paired_dofa_vs_s12_moco.json").read_text())
    assert len(paired["rows"]) == 2
    # DOFA is the better model on every tile: its difference is positive with the interval
    for row in paired["rows"]:
        assert row["diff"] > 0 and row["lo"] < row["diff"] < row["hi"]


def test_an_unknown_model_to_compare_is_one_sentence(tmp_path):
    from cryocube.errors import ReportError
    from cryocube.pages import build_report

    write_grid(
        tmp_path / "results", models=MODELS[:2], datasets=DATASETS[:1], protocols=("frozen",)
    )
    with pytest.raises(ReportError, match="no model 'nope'"):
        build_report(
            tmp_path / "results", tmp_path / "r", formats=["md"], compare=[("nope", "dofa")]
        )


def test_a_damaged_per_tile_file_is_named(tmp_path):
    from cryocube.errors import ReportError
    from cryocube.pages import build_report

    write_grid(
        tmp_path / "results", models=MODELS[:1], datasets=DATASETS[:1], protocols=("frozen",)
    )
    victim = next((tmp_path / "results" / "runs").glob("*/per_tile.npz"))
    victim.write_bytes(victim.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(ReportError, match="per_tile.npz: per-tile file of run .* sha256"):
        build_report(tmp_path / "results", tmp_path / "r", formats=["md"])


def test_a_segmentation_run_keeps_its_test_tiles_confusion_matrices(tmp_path, client, tile_cube):
    """Both test paths (cached features; an encoder trained end to end) in blocks of two tiles,
    which the reduce may join in any order: the per-tile file holds every test tile in cube order
    with its scene, sums to the run's confusion matrix, and the report gives the cell an
    interval."""
    import hashlib

    from cryocube.cube.read import open_cube
    from cryocube.cube.schema import as_text
    from cryocube.engine.evaluate import evaluate
    from cryocube.families import RunSpec
    from cryocube.families.recipes import load_recipe
    from cryocube.pages import build_report

    url = tile_cube("sicd", train=6, val=2, test=5, seed=39)
    sets = ["epochs=1", "decoder_channels=16", "input_size=32", "batch_size=4"]
    sets += ["crops_per_sample=1", "val_every=1", "block_samples=2", "normalization=cube"]
    runs = [RunSpec("ssl4eo_moco", url, "frozen", seed=s) for s in (0, 1)]
    runs.append(RunSpec("unet", url, "frozen"))
    res = evaluate(
        runs, str(tmp_path / "res"), load_recipe(None, sets), client=client, progress=False,
        allow_random_weights=True,
    )  # fmt: skip
    ds = open_cube(url)
    test = np.flatnonzero(as_text(ds["split"].values) == "test")
    for rec in res.records:
        assert rec["status"] == "ok", rec.get("error")
        pt = rec["per_tile"]
        data = Path(pt["url"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == pt["sha256"]
        tiles = stats.read_tiles(data, pt["url"], pt["sha256"])
        assert tiles.sample.tolist() == test.tolist()
        assert tiles.source.tolist() == as_text(ds["source"].values)[test].tolist()
        assert tiles.confusion.sum(0).tolist() == rec["confusion_matrix"]
        assert (pt["tiles"], pt["scenes"]) == (test.size, np.unique(tiles.source).size)
    rep = build_report(tmp_path / "res", tmp_path / "report", formats=["json"], draws=200)
    cells = rep.uncertainty["frozen"].cells
    assert len(cells) == 2 and all(
        c.lo is not None and c.tiles == test.size for c in cells.values()
    )


def test_q_interval_over_folds_matches_a_loop_bootstrap_and_leaves_failed_folds_out():
    from cryocube.families.embedding.neuco import q_draws, task_stats

    rng = np.random.default_rng(7)
    runs = [
        {"a__cls": list(rng.uniform(0.6, 0.8, 10)), "b__regr": list(rng.uniform(0.2, 0.5, 10))}
        for _ in range(2)
    ]
    runs[1]["b__regr"][3] = None  # a failed probe: left out, as task_stats leaves it out
    d = q_draws(runs, 20000, np.random.default_rng(8))
    loop = []
    for _ in range(3000):
        per_task = []
        for t in ("a__cls", "b__regr"):
            qs = []
            for r in runs:
                f = [x for x in r[t] if x is not None]
                qs.append(task_stats(list(rng.choice(f, size=len(r[t]))))[2])
            per_task.append(np.mean(qs))
        loop.append(np.mean(per_task))
    point = np.mean([np.mean([task_stats(r[t])[2] for r in runs]) for t in ("a__cls", "b__regr")])
    lo, hi = np.percentile(d, [2.5, 97.5])
    llo, lhi = np.percentile(loop, [2.5, 97.5])
    assert lo < point < hi
    # the loop draws the failed fold's slot from the finite folds, the vectorised one leaves it
    # out of that draw: the same up to Monte-Carlo error and one fold of ten
    assert abs(lo - llo) < 0.1 * (hi - lo) and abs(hi - lhi) < 0.1 * (hi - lo)
    # constant folds: no spread to resample
    same = q_draws([{"a__cls": [0.5] * 5}], 100, np.random.default_rng(0))
    assert np.allclose(same, task_stats([0.5] * 5)[2])
