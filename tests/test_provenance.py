"""Nothing silent: results say what made them, damaged input is caught, bad input is refused before
any work, a crash never corrupts the results, and progress shows while it runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
import zarr

from cryocube import store
from cryocube.cli import main
from cryocube.cube import DamagedCubeError, verify
from cryocube.engine.evaluate import evaluate
from cryocube.engine.plan import plan_runs
from cryocube.errors import UserError
from cryocube.families import PlanContext, RunSpec
from cryocube.families.recipes import RecipeError, load_recipe
from cryocube.models.weights import WeightsError
from cryocube.record import read_results, write_record

ROOT = Path(__file__).resolve().parents[1]
FAST = [
    "epochs=2",
    "decoder_channels=16",
    "input_size=32",
    "val_every=1",
    "crops_per_sample=2",
    "batch_size=4",
    "normalization=cube",
]


@pytest.fixture(scope="module")
def cube(tile_cube):
    return tile_cube("glid", train=8, val=2, test=3, seed=7)


def damaged_copy(src: str, dst: Path, var: str, sample: int, how: str) -> str:
    """A copy of the cube with one chunk of `var` deleted or truncated (chunk index = sample)."""
    import shutil

    shutil.copytree(src, dst)
    chunk = dst / var / "c" / str(sample) / "0" / "0"
    if var == "image":
        chunk = chunk / "0"
    assert chunk.is_file(), chunk
    if how == "delete":
        chunk.unlink()
    else:
        chunk.write_bytes(chunk.read_bytes()[: chunk.stat().st_size // 2])
    return str(dst)


# -- weights ---------------------------------------------------------------------------------------


@pytest.fixture()
def tiny_pretrained(tmp_path, monkeypatch):
    """A lab's tiny pretrained ViT (one YAML) and a checkpoint of it in the reference layout."""
    from cryocube.models import build_encoder
    from cryocube.models.registry import get_keymap

    cat = tmp_path / "cat" / "models"
    cat.mkdir(parents=True)
    d = yaml.safe_load((ROOT / "catalogs/models/ssl4eo_mae_optical.yaml").read_text())
    d.update(id="tiny_mae", display_name="Tiny MAE", output_layers=[0, 1], output_channels=[32, 32])
    d["arch"].update(embed_dim=32, depth=2, num_heads=2)
    d["weights"].update(url=None, filename="tiny_mae.pth", sha256=None)
    (cat / "tiny_mae.yaml").write_text(yaml.safe_dump(d))
    monkeypatch.setenv("CRYOCUBE_CATALOGS", str(cat.parent))
    monkeypatch.setenv("CRYOCUBE_WEIGHTS", str(tmp_path / "cache"))
    torch.manual_seed(123)
    enc = build_encoder("tiny_mae", in_chans=13, input_size=32)
    wdir = tmp_path / "weights"
    wdir.mkdir()
    torch.save(get_keymap("ssl4eo_mae").to_reference(enc.state_dict()), wdir / "tiny_mae.pth")
    return wdir


def test_pretrained_model_without_checkpoint_is_refused_naming_the_fetch(
    cube, tmp_path, monkeypatch
):
    monkeypatch.setenv("CRYOCUBE_WEIGHTS", str(tmp_path / "empty"))
    cfg = load_recipe(None, FAST)
    with pytest.raises(
        WeightsError, match=r"cryocube weights fetch ssl4eo_moco.*--allow-random-weights"
    ):
        plan_runs([RunSpec("ssl4eo_moco", cube)], cfg, PlanContext(out=str(tmp_path)))
    p = plan_runs(
        [RunSpec("ssl4eo_moco", cube)],
        cfg,
        PlanContext(out=str(tmp_path), allow_random_weights=True),
    )[0]
    assert p.record.weights == {
        "source": "random",
        "sha256": None,
        "random_init": True,
        "pretrained": True,
    }
    scratch = plan_runs([RunSpec("unet", cube)], cfg, PlanContext(out=str(tmp_path)))[0]
    assert (
        scratch.record.weights["source"] == "scratch" and not scratch.record.weights["pretrained"]
    )
    # the CLI refuses before a cluster: the address below does not exist
    assert (
        main(
            [
                "evaluate",
                "--cubes",
                cube,
                "--models",
                "ssl4eo_moco",
                "--out",
                str(tmp_path / "o"),
                "--cluster",
                "tcp://127.0.0.1:9",
                *sum((["--set", s] for s in FAST), []),
            ]
        )
        == 2
    )


def test_fetched_checkpoints_are_found_loaded_and_recorded(
    cube, tmp_path, tiny_pretrained, client, capsys
):
    from cryocube.fetch import file_digest
    from cryocube.pages import build_report

    cfg = load_recipe(None, FAST)
    out = str(tmp_path / "out")
    real = evaluate(
        [RunSpec("tiny_mae", cube)],
        out,
        cfg,
        client=client,
        progress=False,
        weights_dir=str(tiny_pretrained),
    )
    rnd = evaluate(
        [RunSpec("tiny_mae", cube)],
        out,
        cfg,
        client=client,
        progress=False,
        allow_random_weights=True,
    )
    (a,), (b,) = real.records, rnd.records
    assert a["status"] == b["status"] == "ok"
    assert a["weights"] == {
        "source": str((tiny_pretrained / "tiny_mae.pth").resolve()),
        "sha256": file_digest(tiny_pretrained / "tiny_mae.pth"),
        "random_init": False,
        "pretrained": True,
    }
    # different weights, different runs
    assert b["weights"]["random_init"] and a["run_id"] != b["run_id"]
    assert a["identity"]["weights"] == a["weights"]["sha256"]
    # the checkpoint was loaded: its cached features differ from the random encoder's
    caches = sorted(Path(out, "features").iterdir())
    assert len(caches) == 2
    f0 = [np.asarray(zarr.open_group(str(c), mode="r")["test"]["f0"][0]) for c in caches]
    assert not np.allclose(f0[0], f0[1])
    # every table marks the random-init row
    rep = build_report([out], str(tmp_path / "rep"), formats=["md"])
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "Tiny MAE (random init)" in text and "| Tiny MAE |" in text
    assert "without its checkpoint" in text.lower() or "WITHOUT its checkpoint" in text
    assert rep.leaderboards["frozen"].row("Tiny MAE (random init)") is not None


# -- integrity -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "var,how",
    [("image", "delete"), ("image", "truncate"), ("label", "delete"), ("label", "truncate")],
)
def test_damaged_chunks_are_errors_naming_the_sample(cube, tmp_path, var, how):
    from cryocube.cube import cube_info, read_samples

    test = cube_info(cube).samples("test")
    url = damaged_copy(cube, tmp_path / "bad.zarr", var, int(test[1]), how)
    with pytest.raises(DamagedCubeError, match=rf"sample {test[1]} \(source"):
        read_samples(url, test)
    rep = verify(url, progress=False)
    assert not rep.ok and [d["sample"] for d in rep.damaged] == [int(test[1])]
    assert main(["inspect", url, "--verify", "--quiet"]) == 1
    assert verify(cube, progress=False).ok and main(["inspect", cube, "--verify", "--quiet"]) == 0


def test_a_damaged_coordinate_is_an_error_naming_it_when_the_cube_opens(cube, tmp_path):
    """The labels `open_cube` reads at once (scenes, splits, strata): a truncated chunk is one
    sentence naming the variable, never a codec's traceback from a later `.values`."""
    import shutil

    from cryocube.cube import open_cube

    url = tmp_path / "bad.zarr"
    shutil.copytree(cube, url)
    (chunk,) = (url / "source" / "c").iterdir()
    chunk.write_bytes(chunk.read_bytes()[: chunk.stat().st_size // 2])
    with pytest.raises(DamagedCubeError, match=r"bad.zarr: variable 'source' cannot be read"):
        open_cube(str(url))
    assert main(["inspect", str(url), "--quiet"]) == 2
    assert open_cube(cube)["source"].size == 13


def test_a_damaged_cube_fails_the_run_instead_of_scoring_fill_values(cube, tmp_path, client):
    from cryocube.cube import cube_info

    test = cube_info(cube).samples("test")
    url = damaged_copy(cube, tmp_path / "bad.zarr", "image", int(test[0]), "delete")
    # frozen: the extraction reads it
    with pytest.raises(DamagedCubeError, match=rf"sample {test[0]}"):
        evaluate(
            [RunSpec("ssl4eo_moco", url)],
            str(tmp_path / "a"),
            load_recipe(None, FAST),
            client=client,
            progress=False,
            allow_random_weights=True,
        )
    res = evaluate(
        [RunSpec("unet", url)],
        str(tmp_path / "b"),
        load_recipe(None, FAST),
        client=client,
        progress=False,
    )
    # fine-tuning reads it in its test task: the run is an error, with the sample named
    (r,) = res.records
    assert r["status"] == "error" and f"sample {test[0]}" in r["error"]


def test_damaged_feature_cache_is_refused(cube, tmp_path, client):
    out = tmp_path / "o"
    cfg = load_recipe(None, FAST)
    evaluate(
        [RunSpec("ssl4eo_moco", cube)],
        str(out),
        cfg,
        client=client,
        progress=False,
        allow_random_weights=True,
    )
    (cache,) = (out / "features").iterdir()
    chunk = next((cache / "train" / "f0" / "c").rglob("*"))
    while chunk.is_dir():
        chunk = next(chunk.iterdir())
    chunk.unlink()
    res = evaluate(
        [RunSpec("ssl4eo_moco", cube, seed=1)],
        str(out),
        cfg,
        client=client,
        progress=False,
        allow_random_weights=True,
    )
    (r,) = res.records
    assert r["status"] == "error" and "never written or are damaged" in r["error"]


# -- validation before work
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field,value,msg",
    [
        ("epochs", "-1", "epochs must be an integer >= 1"),
        ("epochs", "0", "epochs must be an integer >= 1"),
        ("input_size", "0", "input_size must be an integer >= 1"),
        ("batch_size", "0", "batch_size must be an integer >= 1"),
        ("lr", "abc", "lr must be a number"),
        ("precision", "fp8", "precision must be one of"),
        ("milestones", "[0.9, 0.6]", "milestones must be increasing"),
        ("wings", "2", "unknown recipe fields"),
    ],
)
def test_recipe_values_are_refused_before_a_cluster(field, value, msg, cube, tmp_path, capsys):
    with pytest.raises(RecipeError, match=msg):
        load_recipe(None, [f"{field}={value}"])
    rc = main(
        [
            "evaluate",
            "--cubes",
            cube,
            "--models",
            "unet",
            "--out",
            str(tmp_path),
            "--set",
            f"{field}={value}",
            # no scheduler there: the recipe error must come first
            "--cluster",
            "tcp://127.0.0.1:9",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and "Traceback" not in err


def test_cli_numbers_and_options_are_refused_clearly(cube, tmp_path, capsys):
    secret = "SECRET-do-not-print-7f3a"
    cases = [
        (
            [
                "evaluate",
                "--cubes",
                cube,
                "--models",
                "unet",
                "--out",
                str(tmp_path),
                "--epochs",
                "0",
                "--cluster",
                "tcp://127.0.0.1:9",
            ],
            "epochs must be an integer >= 1",
        ),
        (
            [
                "convert",
                "glid",
                "--raw",
                str(tmp_path),
                "--out",
                str(tmp_path / "c.zarr"),
                "--tile",
                "0",
            ],
            "--tile must be a positive",
        ),
        (
            [
                "evaluate",
                "--cubes",
                cube,
                "--models",
                "unet",
                "--out",
                str(tmp_path),
                "--memory-limit",
                "lots",
                "--set",
                "epochs=1",
            ],
            "--memory-limit 'lots' is not a size",
        ),
        (
            [
                "evaluate",
                "--cubes",
                cube,
                "--models",
                "unet",
                "--out",
                str(tmp_path),
                "--seeds",
                "0",
            ],
            "--seeds must be >= 1",
        ),
    ]
    for argv, msg in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err, (argv, err)
    with pytest.raises(SystemExit):
        main(
            [
                "evaluate",
                "--cubes",
                cube,
                "--models",
                "unet",
                "--out",
                str(tmp_path),
                "--storage-options",
                '{"secret": "' + secret + '", oops}',
            ]
        )
    err = capsys.readouterr().err
    assert "not valid JSON" in err and secret not in err


def test_empty_test_split_and_unlabelled_subsets_are_refused(cube, tmp_path):
    g = store.open_group(cube, "r")
    cf = np.asarray(g["class_fraction"][:])
    import shutil

    url = tmp_path / "unlabelled.zarr"
    shutil.copytree(cube, url)
    split = np.array([str(s) for s in g["split"][:]])
    cf[split == "test"] = 0  # as if every test label were ignore
    zarr.open_group(str(url), mode="r+")["class_fraction"][:] = cf
    zarr.consolidate_metadata(str(url))
    with pytest.raises(UserError, match="split 'test' has no labelled pixel"):
        plan_runs(
            [RunSpec("unet", str(url))], load_recipe(None, FAST), PlanContext(out=str(tmp_path))
        )


def test_fewshot_subset_of_one_tile_trains(cube, tmp_path, client):
    """A stratum of one tile gives a batch of one: BatchNorm gets the tile twice (two crops) instead
    of crashing."""
    cfg = load_recipe(None, FAST + ["batch_size=8"])
    res = evaluate(
        [
            RunSpec("ssl4eo_moco", cube, "fewshot", fraction=0.01),
            RunSpec("unet", cube, "fewshot", fraction=0.01),
        ],
        str(tmp_path),
        cfg,
        client=client,
        progress=False,
        allow_random_weights=True,
    )
    assert all(r["status"] == "ok" for r in res.records), [r.get("error") for r in res.records]
    assert {len(r["subset"]) for r in res.records} <= {1, 2, 3}


# -- results files
# -------------------------------------------------------------------------------------


def test_torn_results_line_is_moved_aside_and_the_run_is_not_cached(tmp_path):
    out = str(tmp_path)
    write_record(out, {"run_id": "a", "status": "ok"})
    with open(tmp_path / "results.jsonl", "a") as f:
        f.write('{"run_id": "b", "status": "o')  # killed mid-append
    with pytest.warns(UserWarning, match="torn"):
        assert [r["run_id"] for r in read_results(out)] == ["a"]
    with pytest.warns(UserWarning, match="moved to"):
        write_record(out, {"run_id": "c", "status": "ok"})
    assert [r["run_id"] for r in read_results(out)] == ["a", "c"]
    assert (tmp_path / "results.jsonl.torn").read_text().startswith('{"run_id": "b"')
    # a record file that does not parse is not a cached run
    from cryocube.record import load_record

    rd = tmp_path / "runs" / "d"
    rd.mkdir(parents=True)
    (rd / "record.json").write_text('{"run_id": "d", "sta')
    with pytest.warns(UserWarning, match="counts as not done"):
        assert load_record(out, "d") is None


# -- what a user sees
# -------------------------------------------------------------------------------------


def test_piped_progress_lines_and_one_line_failures(cube, tmp_path, client):
    out = tmp_path / "o"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    base = [
        sys.executable,
        "-m",
        "cryocube.cli",
        "evaluate",
        "--cubes",
        cube,
        "--out",
        str(out),
        "--cluster",
        client.scheduler.address,
        "--allow-random-weights",
        *sum((["--set", s] for s in FAST + ["epochs=3"]), []),
    ]
    p = subprocess.run(
        base + ["--models", "ssl4eo_moco,unet"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr
    assert "extract features: 100%" in p.stderr
    assert "epoch 1/3" in p.stderr and "epoch 3/3" in p.stderr and "done: mIoU" in p.stderr
    assert "random init" in p.stdout and "RANDOM weights" in p.stderr
    # a diverging run: one line on the console, the traceback in the log
    p = subprocess.run(
        base + ["--models", "ssl4eo_moco", "--set", "lr=1e30", "--seeds", "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert p.returncode == 1
    assert (
        p.stderr.count("FAILED NonFiniteLoss") == 2
        and "Traceback" not in p.stderr
        and "Compute Failed" not in p.stderr
    )
    log = (out / "logs" / "errors.log").read_text()
    assert "Traceback" in log and "non-finite loss" in log
    q = subprocess.run(
        base + ["--models", "unet", "--quiet"], capture_output=True, text=True, env=env, timeout=600
    )
    assert q.returncode == 0 and q.stderr.strip() == "", q.stderr
    d = subprocess.run(
        base + ["--models", "unet,ssl4eo_moco", "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert (
        d.returncode == 0 and "2 runs:" in d.stdout and "cached" in d.stdout and "steps" in d.stdout
    )


def test_inspect_into_a_closed_pipe_is_quiet(cube):
    p = subprocess.run(
        f"{sys.executable} -m cryocube.cli inspect {cube} | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        p.stdout.startswith("cube ")
        and "BrokenPipeError" not in p.stderr
        and "Traceback" not in p.stderr
    )


def test_dry_run_names_runs_cached_under_other_torch_threads(cube, tmp_path, capsys):
    """Threads are part of a run id: a plan with other --workers finds the runs under other ids, and
    the dry-run says how many are cached with other threads and which --workers made them."""
    from cryocube.cli import main
    from cryocube.cluster.runtime import host_cores

    assert host_cores() >= 2  # --workers 1 and 2 then give other torch threads per worker
    out = str(tmp_path / "o")
    base = [
        "evaluate",
        "--cubes",
        cube,
        "--models",
        "unet",
        "--out",
        out,
        *sum((["--set", s] for s in FAST), []),
    ]
    assert main([*base, "--workers", "1", "--quiet"]) == 0
    capsys.readouterr()
    assert main([*base, "--workers", "1", "--dry-run"]) == 0
    same = capsys.readouterr().out
    assert "1 runs: 0 to run, 1 cached" in same and "other torch threads" not in same
    assert main([*base, "--workers", "2", "--dry-run"]) == 0
    other = capsys.readouterr().out
    assert "1 runs: 1 to run, 0 cached" in other
    assert "1 runs are cached with other torch threads (--workers 1)" in other, other
