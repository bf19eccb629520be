"""Generator of tests/data/records_v1/: a results folder written by cryocube 0.x BEFORE run records
were typed (issue 29), kept so that records already on disk are tested to keep loading, migrating on
read, with unchanged run ids. Run it only to see how the folder was made: rerunning it with newer
code writes newer records.

    PYTHONPATH=. python tests/data/records_v1.py tests/data/records_v1

Every family writes one run: segmentation (frozen) on a GLID tile cube, embedding (probe, `evaluate`
and `cryocube probe`), vqa and heads on an interferogram cube. The cubes are rebuilt from the seeds
below, so a test can plan the same runs again and compare their ids. Only the records and
results.jsonl are kept.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

SEG_SETS = [
    "epochs=1",
    "input_size=32",
    "decoder_channels=16",
    "batch_size=4",
    "crops_per_sample=1",
    "val_every=1",
]
PROBE = (("k", 3),)
VLM_SETS = ["block_samples=20", "gen_batch=10", "max_new_tokens=6"]
HEAD_SETS = ["input_size=32", "normalization=cube"]


def make_cubes(root: Path, client) -> tuple[str, str]:
    """The GLID tile cube and the interferogram cube the stored runs read (same seeds, same
    checksums)."""
    from cryocube.convert.writer import convert
    from cryocube.insar_synthetic import make_interferograms
    from cryocube.synthetic import make_raw

    m = make_raw("glid", root / "raw_glid", n={"train": 16, "val": 4, "test": 4}, seed=7)
    glid = str(root / "glid.zarr")
    convert(
        "glid", str(root / "raw_glid"), glid, client=client, tile_size=m.tile_size, progress=False
    )
    make_interferograms(root / "raw_insar", n=20, size=32, seed=0)
    insar = str(root / "insar.zarr")
    convert("insar", str(root / "raw_insar"), insar, client=client, progress=False)
    return glid, insar


def specs(glid: str, insar: str):
    """(RunSpec, recipe --set values) of every stored run made by `evaluate`."""
    from cryocube.families import RunSpec

    return [
        (RunSpec("ssl4eo_moco", glid, "frozen"), SEG_SETS),
        (RunSpec("mean", glid, "probe", overrides=PROBE), SEG_SETS),
        (RunSpec("transformers", insar, "vqa"), VLM_SETS),
        (RunSpec("vit_scratch", insar, "heads"), HEAD_SETS),
    ]


def main(dest: str) -> None:
    from dask.distributed import Client, LocalCluster

    from cryocube.cli import main as cli
    from cryocube.engine.evaluate import evaluate
    from cryocube.families.recipes import load_recipe

    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True) as lc,
        Client(lc) as client,
    ):
        root = Path(tmp)
        glid, insar = make_cubes(root, client)
        out = root / "results"
        for spec, sets in specs(glid, insar):
            (rec,) = evaluate(
                [spec],
                str(out),
                load_recipe(None, sets),
                client=client,
                progress=False,
                allow_random_weights=True,
            ).records
            assert rec["status"] == "ok", rec.get("error")
        emb = root / "mean.zarr"
        assert (
            cli(
                [
                    "embed",
                    "mean",
                    "--cube",
                    glid,
                    "--out",
                    str(emb),
                    "--quiet",
                    "--cluster",
                    client.scheduler.address,
                ]
            )
            == 0
        )
        assert (
            cli(
                [
                    "probe",
                    str(emb),
                    "--tasks-from",
                    glid,
                    "--out",
                    str(out),
                    "--k",
                    "3",
                    "--quiet",
                    "--cluster",
                    client.scheduler.address,
                ]
            )
            == 0
        )
        target = Path(dest)
        shutil.rmtree(target, ignore_errors=True)
        (target / "runs").mkdir(parents=True)
        shutil.copy(out / "results.jsonl", target / "results.jsonl")
        for rec in sorted((out / "runs").glob("*/record.json")):
            (target / "runs" / rec.parent.name).mkdir()
            shutil.copy(rec, target / "runs" / rec.parent.name / "record.json")


if __name__ == "__main__":
    main(sys.argv[1])
