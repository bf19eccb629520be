"""Same run, same bits: a run computes the same confusion matrix alone and beside CPU-heavy work,
because its threads, batch order and random streams are fixed by what defines it, never by the
machine's load.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from cryocube import load_recipe
from cryocube.engine.evaluate import evaluate
from cryocube.families import RunSpec

FAST = [
    "epochs=3",
    "decoder_channels=16",
    "input_size=32",
    "val_every=1",
    "crops_per_sample=2",
    "batch_size=4",
    "normalization=cube",
    "precision=fp32",
]


@pytest.fixture(scope="module")
def cube(tile_cube):
    return tile_cube("glid", train=8, val=2, test=2, seed=21)


def _ev(runs, out, sets, client):
    res = evaluate(
        runs,
        str(out),
        load_recipe(None, FAST + sets),
        client=client,
        progress=False,
        allow_random_weights=True,
    )
    assert all(r["status"] == "ok" for r in res.records), [r.get("error") for r in res.records]
    return {r["run_id"]: r for r in res.records}


@pytest.mark.parametrize(
    "threads", [[], ["threads=2"]], ids=["configured-threads", "recipe-threads-2"]
)
def test_a_run_gives_the_same_bits_alone_and_beside_busy_work(cube, tmp_path, client, threads):
    """Alone, then again elsewhere with another run training beside it on the other worker and a
    busy process on the host: the same run id, threads, validation curve and confusion matrix, bit
    for bit.
    """
    run = RunSpec("ssl4eo_moco", cube, "frozen", seed=3)
    (alone,) = _ev([run], tmp_path / "alone", threads, client).values()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])]
    try:
        beside = _ev(
            [run, RunSpec("ssl4eo_moco", cube, "frozen", seed=4)],
            tmp_path / "beside",
            threads,
            client,
        )
    finally:
        for p in busy:
            p.kill()
            p.wait()
    again = beside[alone["run_id"]]  # the same run id: nothing of the load went into it
    # the recipe's, else the workers' configured threads (Dask's nanny: 1)
    want = 2 if threads else 1
    assert (
        alone["torch_threads"] == again["torch_threads"] == want
        and alone["identity"]["threads"] == want
    )
    assert alone["threads"]["fit"] == again["threads"]["fit"] == [want]
    assert set(alone["threads"]["features"]) == set(again["threads"]["features"]) <= {want}
    assert [c["mIoU"] for c in alone["val_curve"]] == [c["mIoU"] for c in again["val_curve"]]
    assert alone["confusion_matrix"] == again["confusion_matrix"]


def test_threads_are_part_of_a_cpu_runs_identity(cube, tmp_path):
    """On a CPU the thread count orders the float reductions: another count is another run (and
    cache)."""
    from cryocube.engine.plan import plan_runs
    from cryocube.families import PlanContext
    from cryocube.precision import DeviceInfo

    cpu, gpu = DeviceInfo("cpu", "epyc"), DeviceInfo("cuda", "A100", (8, 0))

    def plan(device, sets, ctx_threads=None):
        ctx = PlanContext(
            out=str(tmp_path), allow_random_weights=True, device=device, threads=ctx_threads
        )
        return plan_runs([RunSpec("ssl4eo_moco", cube)], load_recipe(None, FAST + sets), ctx)[0]

    one, two = plan(cpu, ["threads=1"]), plan(cpu, ["threads=2"])
    assert one.run_id != two.run_id and one.work.cache.key != two.work.cache.key
    # the default: the cluster's configured threads
    assert plan(cpu, [], ctx_threads=2).run_id == two.run_id
    assert plan(cpu, [], ctx_threads=2).record.fields["torch_threads"] == 2
    # CUDA kernels do not follow torch's CPU threads: the run id stays what it was without them
    g1, g2 = plan(gpu, ["threads=1"]), plan(gpu, ["threads=2"])
    assert g1.run_id == g2.run_id and "threads" not in g1.identity


def test_the_results_table_is_rebuilt_from_the_run_records(cube, tmp_path, client, capsys):
    """A torn last line (a crash mid-write) loses no run: the rerun with one more seed says seed 0
    is cached and the table (so the report) holds both seeds; a run whose line is missing is read
    from its record.
    """
    import json

    from cryocube.cli import main
    from cryocube.record import read_results
    from cryocube.report.records import load_results

    out = tmp_path / "res"
    args = [
        "evaluate",
        "--cubes",
        cube,
        "--models",
        "ssl4eo_moco",
        "--allow-random-weights",
        "--out",
        str(out),
        "--cluster",
        client.scheduler.address,
        "--quiet",
        *[x for s in FAST for x in ("--set", s)],
    ]
    assert main(args + ["--seeds", "1"]) == 0
    table = out / "results.jsonl"
    text = table.read_text()
    table.write_text(text[: len(text) // 2])  # the one line, torn
    capsys.readouterr()
    with pytest.warns(UserWarning):
        assert main(args + ["--seeds", "2"]) == 0
    assert "1 runs already done (cached)" in capsys.readouterr().out
    recs = read_results(str(out))
    assert sorted(r["seed"] for r in recs) == [0, 1] and (out / "results.jsonl.torn").exists()
    assert sorted(r.seed for r in load_results([str(out)]).runs) == [0, 1]
    # a line missing altogether (not torn): the report reads the run from its record and says so
    lines = table.read_text().splitlines()
    table.write_text("\n".join(line for line in lines if json.loads(line)["seed"] != 0) + "\n")
    with pytest.warns(UserWarning, match="no line in the table"):
        assert sorted(r.seed for r in load_results([str(out)]).runs) == [0, 1]


def test_threaded_reads_give_the_windows_one_reader_gives(cube, tmp_path):
    """On a GPU extraction reads each chunk on several threads; the items, labels and bytes must be
    exactly what one reader gives, in the same order (and a CPU keeps one reader: its cores run the
    encoder).
    """
    import numpy as np
    import torch

    from cryocube.engine.plan import plan_runs
    from cryocube.families import PlanContext
    from cryocube.families.segmentation.data import crop_offsets
    from cryocube.families.segmentation.features import _windows, _windows_threaded, read_threads
    from cryocube.precision import DeviceInfo

    ctx = PlanContext(
        out=str(tmp_path), allow_random_weights=True, device=DeviceInfo("cpu", "epyc")
    )
    p = plan_runs([RunSpec("ssl4eo_moco", cube)], load_recipe(None, FAST), ctx)[0]
    cache, samples = p.work.cache, np.asarray(p.work.train_samples)
    per = 2
    offsets = crop_offsets(samples.size, per, cache.tile, cache.encoder.input_size, 0)
    x1, y1, b1, _ = _windows(cache, samples, offsets, per)
    for readers in (2, 3, 64):
        x, y, b, _ = _windows_threaded(cache, samples, offsets, per, readers)
        assert torch.equal(x, x1) and np.array_equal(y, y1) and b == b1
    assert (
        read_threads("cpu", 16) == 1
        and read_threads("cuda:0", 16) == 8
        and read_threads("cuda", 2) == 2
    )
