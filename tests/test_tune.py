"""`cryocube tune` on a generated cube: real Optuna studies over real engine runs on a
LocalCluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cryocube.cli import main
from cryocube.engine.evaluate import evaluate
from cryocube.engine.tune import JOURNAL, load_tune_config, parse_space, tune
from cryocube.families import RunSpec
from cryocube.families.recipes import RecipeError, load_recipe
from cryocube.record import read_results

optuna = pytest.importorskip("optuna")

FAST = [
    "epochs=4",
    "decoder_channels=32",
    "input_size=32",
    "val_every=2",
    "crops_per_sample=2",
    "batch_size=4",
    "normalization=cube",
]
MODEL = "ssl4eo_moco"  # frozen (random weights): trials share one feature cache and one pass


@pytest.fixture(scope="module")
def cube(tile_cube):
    return tile_cube("glid", train=16, val=4, test=4, seed=11)


def _sweeps(out) -> list[dict]:
    return [r for r in read_results(str(out)) if r.get("sweep")]


def _study(out):
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(Path(out) / JOURNAL))
    )
    (name,) = [s.study_name for s in storage.get_all_studies()]
    return optuna.load_study(study_name=name, storage=storage)


def test_the_space_is_checked_before_any_cluster(tmp_path, capsys):
    r = load_recipe(None, FAST)
    (p,) = parse_space(["lr=1e-5:1e-2:log"], None, r)
    assert (p.kind, p.low, p.high, p.log) == ("float", 1e-5, 1e-2, True)
    (p,) = parse_space(["decoder_channels=16,32"], None, r)
    assert p.kind == "choice" and p.choices == (16, 32)
    (p,) = parse_space(None, {"epochs": "2:6"}, r)
    assert p.kind == "int"
    for bad, words in (
        (["lrr=1e-5:1e-2"], "not a recipe field"),
        (["lr=0:1e-2:log"], "log range needs low > 0"),
        (["lr=1e-2:1e-5"], "low < high"),
        (["block_samples=2,4"], "execution field"),
        (["decoder_channels=0,32"], "decoder_channels must be an integer >= 1"),
        (["normalization=0:1"], "not numeric"),
    ):
        with pytest.raises(RecipeError, match=words):
            parse_space(bad, None, r)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "epochs: 3\nspace:\n  lr: 1e-4:1e-2:log\n  weight_decay: {low: 0.01, high: 0.1}\n"
    )
    recipe, space = load_tune_config(str(cfg), ["batch_size=2"])
    assert recipe.epochs == 3 and recipe.batch_size == 2
    assert [q.describe() for q in parse_space(None, space, recipe)] == [
        "lr=0.0001:0.01:log",
        "weight_decay=0.01:0.1",
    ]
    # through the CLI: one sentence, exit 2, no cluster started (the cube does not even exist)
    rc = main(
        [
            "tune",
            "--cubes",
            str(tmp_path / "none.zarr"),
            "--models",
            MODEL,
            "--space",
            "lr=1e-2:1e-5",
            "--trials",
            "2",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert rc == 2 and "low < high" in capsys.readouterr().err
    assert (
        main(
            [
                "tune",
                "--cubes",
                "x",
                "--models",
                MODEL,
                "--space",
                "lr=1e-4:1e-2",
                "--sampler",
                "grid",
                "--trials",
                "2",
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )


def test_tuned_lr_beats_a_bad_default_and_its_retrain_equals_evaluate(tmp_path, client, cube):
    """A deliberately bad default LR; 4 trials in one batch (one extraction, one pass per
    worker)."""
    from cryocube.pages import build_report

    out = tmp_path / "study"
    recipe = load_recipe(None, FAST + ["lr=1e-7"])
    space = parse_space(["lr=1e-3:3e-2:log"], None, recipe)
    (res,) = tune(
        [RunSpec(MODEL, cube, "frozen")],
        space,
        str(out),
        recipe,
        trials=4,
        pruner="none",
        client=client,
        progress=False,
        allow_random_weights=True,
    )
    best, base = res.best, res.baseline
    assert best["sweep"]["best"] and base["config"]["lr"] == 1e-7 and "sweep" not in base
    assert best["metrics"]["mIoU"] > base["metrics"]["mIoU"] + 10, (
        best["metrics"],
        base["metrics"],
    )
    trials = [r for r in _sweeps(out) if not r["sweep"].get("best")]
    assert sorted(r["sweep"]["trial"] for r in trials) == [0, 1, 2, 3]
    assert {r["sweep"]["state"] for r in trials} == {"complete"}
    # selection on validation only: the best trial has the best validation objective, whatever the
    # test says
    assert best["sweep"]["value"] == max(r["sweep"]["value"] for r in trials)
    assert (
        best["sweep"]["trial"] == max(trials, key=lambda r: r["sweep"]["value"])["sweep"]["trial"]
    )
    assert best["sweep"]["importance"] == {"lr": pytest.approx(1.0)}
    # one extraction for all trials; 4 decoders on 2 workers: 2 fit tasks
    assert all(r["decoders_in_task"] >= 2 for r in trials)
    feats = list((out / "features").iterdir())
    assert len(feats) == 1

    # the tuned record equals a plain evaluate of the same params and seed, elsewhere
    params = best["sweep"]["params"]
    plain = evaluate(
        [RunSpec(MODEL, cube, "frozen", overrides=tuple(params.items()))],
        str(tmp_path / "plain"),
        recipe,
        client=client,
        progress=False,
        allow_random_weights=True,
    ).records[0]
    assert (
        plain["run_id"] == best["run_id"] and plain["confusion_matrix"] == best["confusion_matrix"]
    )
    assert plain["metrics"]["mIoU"] == pytest.approx(best["metrics"]["mIoU"], abs=1e-9)

    # label-fraction curve on the same features (a good LR): monotone within noise
    fr = evaluate(
        [RunSpec(MODEL, cube, "frozen", fraction=f) for f in (0.25, 0.5, 1.0)],
        str(out),
        recipe.replace(lr=1e-2, epochs=6),
        client=client,
        progress=False,
        allow_random_weights=True,
    ).records
    m = {r["fraction"]: r["metrics"]["mIoU"] for r in fr}
    assert m[0.25] <= m[0.5] + 3 and m[0.5] <= m[1.0] + 3 and m[0.25] < m[1.0], m

    rep = build_report([str(out)], str(tmp_path / "report"), formats=["md", "html"])
    lb = rep.leaderboards["frozen-100pct"]
    names = sorted(r.name for r in lb.rows)
    assert names == ["S12-MoCo (random init)", "S12-MoCo (random init) (tuned)"], names
    studies = rep.tables["tune/studies"]
    assert studies.rows[0][studies.col("default")] == pytest.approx(base["metrics"]["mIoU"])
    assert studies.rows[0][studies.col("tuned")] == pytest.approx(best["metrics"]["mIoU"])
    assert "tune/importance" in rep.tables and "fractions/label_fraction" in rep.tables
    assert any("tune_history" in f.name for f in rep.figures) and any(
        "label_fraction" in f.name for f in rep.figures
    )


def test_pruned_trials_are_recorded_as_pruned(tmp_path, client, cube):
    """Median pruning in rounds: each trial first trains at a third of the epochs; a hopeless LR is
    pruned there.

    What it prunes on is fixed: the grid's order is seeded (2e-3 first, then 1e-8), the runs'
    threads are the workers' configured ones (never the load), and the hopeless LR is compared with
    a good one, far apart (two hopeless LRs, as this test once had, differ by noise: BatchNorm
    statistics move at any LR).
    """
    out = tmp_path / "pruned"
    rc = main(
        [
            "tune",
            "--cubes",
            cube,
            "--models",
            MODEL,
            "--allow-random-weights",
            "--space",
            "lr=3e-3,1e-2,2e-3,1e-8",
            "--sampler",
            "grid",
            "--trials",
            "4",
            "--batch",
            "1",
            "--pruner",
            "median",
            *[x for s in FAST for x in ("--set", s)],
            "--set",
            "epochs=6",
            "--set",
            "val_every=1",
            "--out",
            str(out),
            "--cluster",
            client.scheduler.address,
            "--quiet",
        ]
    )
    assert rc == 0
    study = _study(out)
    states = {t.number: t.state.name for t in study.trials}
    pruned = [n for n, s in states.items() if s == "PRUNED"]
    assert pruned and len(states) == 4, states
    latest = {}
    for r in _sweeps(out):
        if not r["sweep"].get("best"):
            latest[r["sweep"]["trial"]] = r
    for n in pruned:
        # its rung: 6 // 3
        assert latest[n]["sweep"]["state"] == "pruned" and latest[n]["config"]["epochs"] == 2
    assert [study.trials[n].params["lr"] for n in (0, 1)] == [2e-3, 1e-8] and 1 in pruned
    # a wide margin: the hopeless LR's best rung value is far below the good LR's at the same step
    bad, good = study.trials[1].intermediate_values, study.trials[0].intermediate_values
    assert max(bad.values()) < good[max(bad)] - 5, (bad, good)
    best = [r for r in _sweeps(out) if r["sweep"].get("best")][-1]
    assert best["sweep"]["trial"] not in pruned and best["config"]["epochs"] == 6


def test_a_killed_study_resumes_from_its_journal(tmp_path, client, cube, capfd):
    """SIGKILL the tune process (client, scheduler and workers) after some trials; the rerun, on
    another scheduler, keeps the finished trials, repeats none of them (neither their runs nor their
    params: the sampler's stream does not restart), asks only for the missing ones, and prints no
    scheduler traceback. The other scheduler's workers have other torch threads, which on a CPU make
    other runs (and so another study): the command pins them with --set threads=1."""
    out = tmp_path / "resume"
    args = [
        "tune",
        "--cubes",
        cube,
        "--models",
        MODEL,
        "--allow-random-weights",
        "--space",
        "lr=1e-3:3e-2:log",
        "--trials",
        "6",
        "--batch",
        "2",
        "--pruner",
        "none",
        *[x for s in FAST for x in ("--set", s)],
        "--out",
        str(out),
        "--quiet",
        "--set",
        "threads=1",
    ]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cryocube.cli",
            *args,
            "--workers",
            "1",
            "--threads-per-worker",
            "1",
        ],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    done_before: dict[int, float] = {}
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            if (out / JOURNAL).exists():
                try:
                    done_before = {
                        t.number: t.value for t in _study(out).trials if t.state.name == "COMPLETE"
                    }
                except ValueError:  # the study is not created yet
                    pass
                if len(done_before) >= 2:
                    break
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert 2 <= len(done_before) < 6, (done_before, proc.stderr.read().decode()[-2000:])
    lines_before = {
        r["sweep"]["trial"]: r["created"] for r in _sweeps(out) if r["sweep"]["state"] == "complete"
    }

    done_params = {t.number: t.params for t in _study(out).trials if t.number in done_before}
    capfd.readouterr()
    assert main([*args, "--cluster", client.scheduler.address]) == 0
    err = capfd.readouterr().err
    assert "DuplicatedStudyError" not in err and "Traceback" not in err, err[-2000:]
    study = _study(out)
    trials = study.trials
    new = [
        t
        for t in trials
        if t.number not in done_before and "retry_of" not in t.user_attrs and t.params
    ]
    assert new and not [t.number for t in new if t.params in done_params.values()], (
        done_params,
        [t.params for t in new],
    )
    complete = {t.number: t.value for t in trials if t.state.name == "COMPLETE"}
    assert len(complete) == 6
    # finished trials kept as they were
    assert all(complete[n] == v for n, v in done_before.items())
    # the ones killed while running: asked again
    failed = [t for t in trials if t.state.name == "FAIL"]
    # (a trial killed between ask and its suggest holds no params: it never ran, and the sampler
    # asks anew)
    started = [t for t in failed if t.params]
    retried = {t.user_attrs["retry_of"]: t for t in trials if "retry_of" in t.user_attrs}
    assert sorted(retried) == sorted(t.number for t in started)
    assert all(retried[t.number].params == t.params for t in started)
    assert len(trials) == 6 + len(failed)
    # no finished trial ran again: one "complete" line each, the one written before the kill
    recs = [
        r for r in _sweeps(out) if r["sweep"]["state"] == "complete" and not r["sweep"].get("best")
    ]
    for n in done_before:
        mine = [r for r in recs if r["sweep"]["trial"] == n]
        assert len(mine) == 1 and mine[0]["created"] == lines_before[n]
    assert json.loads((out / "results.jsonl").read_text().splitlines()[-1])["sweep"]["best"] is True


def test_trials_left_running_are_retried_only_when_they_had_started(tmp_path, client, cube):
    """The two states a kill can leave: a trial with its params (its run may have started: asked
    again with the same params) and one killed between ask and suggest (no params: never ran, not
    retried).
    """
    out = tmp_path / "left"
    args = [
        "tune",
        "--cubes",
        cube,
        "--models",
        MODEL,
        "--allow-random-weights",
        "--space",
        "lr=1e-3:3e-2:log",
        "--batch",
        "1",
        "--pruner",
        "none",
        *[x for s in FAST for x in ("--set", s)],
        "--out",
        str(out),
        "--quiet",
        "--cluster",
        client.scheduler.address,
    ]
    assert main([*args, "--trials", "1"]) == 0
    study = _study(out)
    with_params = study.ask()
    with_params.suggest_float("lr", 1e-3, 3e-2, log=True)
    bare = study.ask()
    assert main([*args, "--trials", "3"]) == 0
    trials = _study(out).trials
    assert {t.number: t.state.name for t in trials}[with_params.number] == "FAIL"
    assert {t.number: t.state.name for t in trials}[bare.number] == "FAIL"
    retried = [t for t in trials if t.user_attrs.get("retry_of") is not None]
    assert [t.user_attrs["retry_of"] for t in retried] == [with_params.number]
    assert retried[0].params == with_params.params and retried[0].state.name == "COMPLETE"
    assert sum(t.state.name == "COMPLETE" for t in trials) == 3


def test_report_keeps_trials_out_of_leaderboards_and_plots_fraction_curves(tmp_path):
    """Records only (no cluster): trials never reach a leaderboard; fractions plot frozen against
    fine-tuned."""
    from cryocube.pages import build_report

    def rec(i, protocol="frozen", fraction=1.0, miou=50.0, **kw):
        return {
            "run_id": f"r{i}",
            "model": "unet",
            "dataset": "glid",
            "protocol": protocol,
            "fraction": fraction,
            "seed": 0,
            "status": "ok",
            "metrics": {"mIoU": miou},
            "created": f"2026-01-01T00:00:{i:02d}+00:00",
            **kw,
        }

    sweep = {"study": "s1", "params": {"lr": 0.01}, "metric": "val_mIoU", "direction": "maximize"}
    lines = [rec(0, miou=40.0)]
    lines += [
        rec(1 + t, miou=90.0 + t, sweep=sweep | {"trial": t, "state": st, "value": 50.0 + t})
        for t, st in enumerate(["complete", "pruned", "complete"])
    ]
    lines.append(
        rec(
            9,
            miou=60.0,
            sweep=sweep
            | {
                "trial": 2,
                "state": "complete",
                "value": 52.0,
                "best": True,
                "baseline_run_id": "r0",
                "importance": {"lr": 1.0},
                "n_trials": {"complete": 2, "pruned": 1, "fail": 0},
            },
        )
    )
    lines += [
        rec(20 + i, protocol=p, fraction=f, miou=30 + 40 * f + (10 if p == "finetune" else 0))
        for i, (p, f) in enumerate(
            [("fewshot", 0.1), ("frozen", 0.5), ("finetune", 0.1), ("finetune", 1.0)]
        )
    ]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rep = build_report([str(tmp_path)], str(tmp_path / "rep"), formats=["md", "html"])
    lb = rep.leaderboards["frozen-100pct"]
    cells = {r.name: r.cells["glid"].mean for r in lb.rows}
    # the 90+ test scores of trials are nowhere
    assert cells == {"U-Net": 40.0, "U-Net (tuned)": 60.0}
    t = rep.tables["tune/studies"]
    assert t.rows[0][t.col("default")] == 40.0 and t.rows[0][t.col("gain")] == 20.0
    f = rep.tables["fractions/label_fraction"]
    assert sorted(set(f.column_values("encoder"))) == ["fine-tuned", "frozen"]
    # frozen 1.0: the default run, not trials
    assert sorted(f.column_values("fraction")) == [0.1, 0.1, 0.5, 1.0, 1.0]
    assert (tmp_path / "rep" / "figures" / "label_fraction_glid.png").exists()
    assert (tmp_path / "rep" / "figures" / "tune_history_0.png").exists()


@pytest.mark.parametrize(
    "protocol,words",
    [
        ("probe", "tune --protocol probe: a probe has no validation split"),
        ("frozen,probe", "tune --protocol probe: a probe has no validation split"),
        ("vqa", "tune --protocol vqa: a VQA run trains nothing and records no validation curve"),
    ],
)
def test_protocols_without_a_validation_curve_are_refused_before_any_cluster(
    tmp_path, capsys, protocol, words
):
    """Every trial of a probe study failed with "no trial completed" and no reason: a family whose
    runs record no validation curve is refused with the reason, before the cube is read (it does not
    exist) or a cluster starts (the address is unreachable)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = main(
        [
            "tune",
            "--cubes",
            str(tmp_path / "none.zarr"),
            "--models",
            "ssl4eo_moco",
            "--protocol",
            protocol,
            "--space",
            "lr=1e-4:1e-2:log",
            "--trials",
            "2",
            "--out",
            str(tmp_path / "o"),
            "--cluster",
            f"tcp://127.0.0.1:{port}",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and words in err, err
    assert "test score" in err or "trains nothing" in err
    assert not (tmp_path / "o").exists()
    with pytest.raises(Exception, match="no validation"):  # the library entry point says the same
        tune(
            [RunSpec("ssl4eo_moco", str(tmp_path / "none.zarr"), "probe")],
            (),
            str(tmp_path / "o"),
            load_recipe(None, []),
            trials=2,
        )


def test_the_default_recipe_is_the_first_trial_not_an_extra_run(tmp_path, client, cube, capsys):
    """A default inside the space is enqueued as trial 0: its run is the baseline's, so a study of
    3 trials trains 3 decoders (3 run ids in the results), and the output names the trial."""
    out = tmp_path / "dflt"
    rc = main(
        [
            "tune",
            "--cubes",
            cube,
            "--models",
            MODEL,
            "--allow-random-weights",
            "--space",
            "lr=1e-5:1e-3:log",
            "--trials",
            "3",
            "--pruner",
            "none",
            *[x for s in FAST for x in ("--set", s)],
            "--out",
            str(out),
            "--cluster",
            client.scheduler.address,
        ]
    )
    assert rc == 0
    study = _study(out)
    first = study.trials[0]
    assert first.params == {"lr": 1e-4} and first.user_attrs.get("default") is True
    recs = read_results(str(out))
    trial_ids = {r["sweep"]["trial"]: r["run_id"] for r in recs if r.get("sweep")}
    baseline = [r for r in recs if not r.get("sweep")]
    best = [r for r in recs if (r.get("sweep") or {}).get("best")][-1]
    assert best["sweep"]["baseline_trial"] == 0
    assert baseline and {r["run_id"] for r in baseline} == {trial_ids[0]}
    # no fourth decoder: every record in the folder is one of the 3 trials' runs
    assert {r["run_id"] for r in recs} == set(trial_ids.values()) and len(
        set(trial_ids.values())
    ) == 3
    assert "(trial 0)" in capsys.readouterr().out
