"""Run records already on disk keep loading: tests/data/records_v1 holds a results folder written by
the code before run records were typed (tests/data/records_v1.py made it), tests/data/records_v2 one
written by the typed records before the report read them as `RunRecord`s (the same generator, run at
fdf2356). The report reads every family's run from both and makes the report it made then, each
stored run id is still the hash of its identity, and planning the same runs again today gives the
same ids.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cryocube.families.base import content_hash

STORED = Path(__file__).parent / "data" / "records_v1"
TYPED = STORED.parent / "records_v2"


def _stored() -> list[dict]:
    return [json.loads(line) for line in (STORED / "results.jsonl").read_text().splitlines()]


def test_the_stored_folder_holds_every_family():
    recs = _stored()
    assert sorted(r["family"] for r in recs) == [
        "embedding",
        "embedding",
        "heads",
        "segmentation",
        "vqa",
    ]
    assert all(r["status"] == "ok" for r in recs)
    for r in recs:
        assert json.loads((STORED / "runs" / r["run_id"] / "record.json").read_text()) == r


def test_stored_run_ids_are_the_hash_of_their_identity():
    for r in _stored():
        assert content_hash(r["identity"]) == r["run_id"], r["family"]


def test_the_report_reads_records_written_before_they_were_typed(tmp_path):
    from cryocube.report.records import load_results

    res = load_results(STORED)
    assert not res.failures and [r.run_id for r in res.runs] == ["60eae79bbd20179bf465"]
    assert res.runs[0].miou is not None and res.runs[0].random_init
    assert sorted(r.run_id for r in res.of("embedding")) == [
        "3c0a867c1e8517d460ea",
        "c57b811c5380b52f6fdd",
    ]
    assert [r.run_id for r in res.of("vqa")] == ["dd7b040b91183bd7a995"]
    assert [r.run_id for r in res.of("heads")] == ["4a9b6059d66eaaa8269d"]
    _same_report(STORED, tmp_path)


def _same_report(stored: Path, tmp_path: Path) -> None:
    """`cryocube report` on a stored folder makes the report the code that wrote it made
    (<folder>_report.md), but for its run metadata, and the same files."""
    from cryocube.cli import main

    out = tmp_path / "report"
    (tmp_path / "none").mkdir()
    args = ["report", str(stored), "--out", str(out), "--format", "md"]
    # an empty folder: no measured profiles
    assert main([*args, "--profiles", str(tmp_path / "none")]) == 0
    md = (out / "report.md").read_text()
    assert (
        md[: md.index("## Run metadata")]
        == (stored.parent / f"{stored.name}_report.md").read_text()
    )
    files = sorted(f"./{p.relative_to(out).as_posix()}" for p in out.rglob("*") if p.is_file())
    assert files == (stored.parent / f"{stored.name}_report_files.txt").read_text().split()


def test_the_report_reads_typed_records_as_it_did_when_they_were_written(tmp_path):
    from cryocube.report.records import load_results

    res = load_results(TYPED)
    assert not res.failures and [r.run_id for r in res.runs] == ["60eae79bbd20179bf465"]
    assert sorted(r.family for rs in res.by_family.values() for r in rs) == [
        "embedding",
        "embedding",
        "heads",
        "vqa",
    ]
    _same_report(TYPED, tmp_path)


def test_a_record_missing_from_the_table_is_read_from_its_file(tmp_path):
    from cryocube.report.records import load_results

    out = tmp_path / "results"
    shutil.copytree(STORED, out)
    lines = (out / "results.jsonl").read_text().splitlines()
    # the segmentation run's line lost
    (out / "results.jsonl").write_text("\n".join(lines[1:]) + "\n")
    with pytest.warns(UserWarning, match="1 run"):
        res = load_results(out)
    assert [r.run_id for r in res.runs] == ["60eae79bbd20179bf465"]


def test_planning_the_stored_runs_again_gives_their_ids(tmp_path, client):
    """The cubes rebuilt from the generator's seeds have the stored checksums, and today's planning
    derives the stored run ids from them (on the device the records name: a CPU with bf16 matrix
    units), but for the interferogram cube's board split: issue 38 drew it anew (every answer class
    in test), so its heads and vqa runs are new runs, and the split digest is all that moved."""
    import sys

    from cryocube.engine.plan import plan_runs
    from cryocube.families import PlanContext
    from cryocube.families.recipes import load_recipe
    from cryocube.precision import DeviceInfo

    sys.path.insert(0, str(STORED.parent))
    try:
        import records_v1 as gen
    finally:
        sys.path.remove(str(STORED.parent))
    glid, insar = gen.make_cubes(tmp_path, client)
    # (not `cryocube probe`'s)
    records = {(r["family"], r["model"]): r for r in _stored() if "labels" not in r}
    stored = {k: r["run_id"] for k, r in records.items()}
    assert len(stored) == 4
    ctx = PlanContext(
        out=str(tmp_path / "out"),
        allow_random_weights=True,
        threads=1,
        device=DeviceInfo("cpu", "x86_64", cpu_bf16=True, cpu_amx=True),
    )
    got, moved = {}, {}
    for spec, sets in gen.specs(glid, insar):
        (p,) = plan_runs([spec], load_recipe(None, sets), ctx)
        key = (p.family, spec.model)
        got[key] = p.run_id
        if p.family in ("heads", "vqa"):  # on the interferogram cube: the old split's identity
            old = records[key]["identity"]
            assert set(p.identity) - set(old) <= {"split"}
            moved[p.family] = p.identity["split"]
            assert p.identity["split"] != records[key]["board_split"]["digest"]
            back = {k: v for k, v in p.identity.items() if k in old} | (
                {"split": old["split"]} if "split" in old else {}
            )
            got[key] = content_hash(back)
    assert got == stored
    assert moved["heads"] == moved["vqa"]  # one new split, every family's


def test_every_stored_record_reads_as_a_typed_record_of_the_current_version():
    from cryocube.record import RECORD_VERSION, RunRecord, load_record

    for d in _stored():
        assert "record_version" not in d  # written before records were typed: version 1
        r = RunRecord.from_dict(d, d["run_id"])
        assert (
            r.record_version == RECORD_VERSION == 2
            and r.run_id == d["run_id"]
            and r.family == d["family"]
        )
        assert (
            r.primary_metric == d["primary_metric"]
            and r.identity == d["identity"]
            and r.cube == d["cube"]
        )
        # the family's own fields ride along
        assert r.fields and not set(r.fields) & {"run_id", "model", "metrics"}
        back = r.to_dict()
        assert {k: back[k] for k in d} == d  # nothing lost or changed
        assert {k: back[k] for k in set(back) - set(d)} in (
            {"record_version": 2},
            {"record_version": 2, "overrides": None},
        )
        assert load_record(str(STORED), d["run_id"]).record_version == RECORD_VERSION


def test_a_version_1_record_gets_the_fields_it_left_implicit():
    from cryocube.record import RunRecord

    r = RunRecord.from_dict(
        {
            "model": "dofa",
            "dataset": "glid",
            "protocol": "frozen",
            "seed": "1",
            "status": "ok",
            "fraction": None,
            "metrics": {"mIoU": 1.0},
        },
        "old.jsonl:3",
    )
    assert (r.family, r.primary_metric, r.fraction, r.seed, r.run_id) == (
        "segmentation",
        "mIoU",
        1.0,
        1,
        "",
    )
    e = RunRecord.from_dict(
        {
            "model": "m",
            "dataset": "d",
            "protocol": "probe",
            "seed": 0,
            "status": "ok",
            "family": "embedding",
        },
        "x",
    )
    assert e.primary_metric == "Q"


@pytest.mark.parametrize(
    "record, words",
    [
        ([1, 2], "old.jsonl:3: a record must be a JSON object, got list"),
        ({"model": "m", "dataset": "d"}, "old.jsonl:3: record lacks protocol, seed, status"),
        (
            {"model": "m", "dataset": "d", "protocol": "p", "seed": "x", "status": "ok"},
            "old.jsonl:3: seed/fraction must be numbers",
        ),
        (
            {
                "model": "m",
                "dataset": "d",
                "protocol": "p",
                "seed": 0,
                "status": "ok",
                "record_version": 9,
            },
            "old.jsonl:3: record_version 9 was written by a newer cryocube",
        ),
        (
            {
                "model": "m",
                "dataset": "d",
                "protocol": "p",
                "seed": 0,
                "status": "ok",
                "record_version": "2",
            },
            "old.jsonl:3: record_version must be a positive integer",
        ),
        (
            {
                "model": "m",
                "dataset": "d",
                "protocol": "p",
                "seed": 0,
                "status": "ok",
                "cube": "glid.zarr",
            },
            "old.jsonl:3: field cube must be an object, got str",
        ),
    ],
)
def test_a_bad_record_is_one_sentence_naming_where(record, words):
    from cryocube.errors import UserError
    from cryocube.record import RunRecord

    with pytest.raises(UserError, match=words.replace(".", r"\.")):
        RunRecord.from_dict(record, "old.jsonl:3")


def test_every_family_starts_its_record_through_base_record():
    """One constructor path: no family module spells the common fields of a record itself."""
    import re

    pkg = Path(__file__).resolve().parents[1] / "cryocube" / "families"
    for p in pkg.rglob("*.py"):
        assert not re.search(r"""["']run_id["']\s*:\s*run_id,\s*["']family["']""", p.read_text()), p
    uses = [
        p.relative_to(pkg).as_posix() for p in pkg.rglob("*.py") if "base_record(" in p.read_text()
    ]
    assert sorted(uses) == ["base.py"]  # the template (`Family.planned`) starts every record
