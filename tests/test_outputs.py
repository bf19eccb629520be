"""The output contract (cryocube/outputs.py): every command with `--out` pointed at each kind of
existing thing is refused in one sentence, before any cluster starts, leaving the bytes as they
were; same-kind outputs resume; `--overwrite` replaces only one's own kind; per-run probe files; a
report killed midway leaves the previous one; a full disk is one sentence."""

from __future__ import annotations

import errno
import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cryocube import outputs
from cryocube.cli import main
from cryocube.convert.writer import convert
from cryocube.errors import UserError
from cryocube.pages import build_report
from cryocube.synthetic import make_raw

# nothing listens there: a command that got past its checks fails to connect
NO_CLUSTER = "tcp://127.0.0.1:9"


def tree_digest(path: Path) -> dict[str, str]:
    """sha256 of every file under `path` (or of `path` itself), by relative name."""
    path = Path(path)
    if path.is_file():
        return {".": hashlib.sha256(path.read_bytes()).hexdigest()}
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def things(tmp_path_factory, client):
    """One of each kind of thing an --out can meet, all real: raw data, a cube, an embedding store,
    a results folder of probe runs, a report, a study and a quickstart folder (as tune/quickstart
    mark them first), a folder of user files and a plain file."""
    root = tmp_path_factory.mktemp("outs")
    addr = client.scheduler.address
    m = make_raw("gld", root / "raw", n={"train": 24, "val": 4, "test": 4}, seed=2)
    cube = str(root / "gld.zarr")
    convert("gld", str(root / "raw"), cube, client=client, tile_size=m.tile_size, progress=False)
    emb = str(root / "emb.zarr")
    assert main(["embed", "mean", "--cube", cube, "--out", emb, "--cluster", addr, "--quiet"]) == 0
    res = root / "results"
    assert (
        main(
            [
                "probe",
                emb,
                "--tasks-from",
                cube,
                "--out",
                str(res),
                "--probe",
                "knn",
                "--k",
                "2",
                "--cluster",
                addr,
                "--quiet",
            ]
        )
        == 0
    )
    rep = root / "report"
    build_report([str(res)], str(rep), formats=["md", "html"])
    for kind in ("study", "quickstart"):
        outputs.claim(str(root / kind), kind, kind)
    user = root / "mine"
    (user / "data").mkdir(parents=True)
    (user / "notes.txt").write_text("my notes\n")
    (user / "data" / "x.csv").write_text("a,b\n1,2\n")
    plain = root / "plain.txt"
    plain.write_text("just a file\n")
    import shutil

    # copies: outputs that are not the commands' inputs
    for name in ("gld.zarr", "emb.zarr", "results"):
        shutil.copytree(root / name, root / "other" / name)
    return {
        "tile": str(m.tile_size),
        "cube_x": str(root / "other" / "gld.zarr"),
        "emb_x": str(root / "other" / "emb.zarr"),
        "results_x": str(root / "other" / "results"),
        "root": root,
        "addr": addr,
        "raw": str(root / "raw"),
        "cube": cube,
        "emb": emb,
        "results": str(res),
        "report": str(rep),
        "study": str(root / "study"),
        "quickstart": str(root / "quickstart"),
        "user": str(user),
        "file": str(plain),
    }


# each command, as a user types it, with its --out left open; cluster commands get an address nobody
# serves
COMMANDS = {
    "convert": (
        "cube",
        lambda t, o: [
            "convert",
            "gld",
            "--raw",
            t["raw"],
            "--out",
            o,
            "--cluster",
            NO_CLUSTER,
            "--quiet",
        ],
    ),
    "embed": (
        "embeddings",
        lambda t, o: [
            "embed",
            "mean",
            "--cube",
            t["cube"],
            "--out",
            o,
            "--cluster",
            NO_CLUSTER,
            "--quiet",
        ],
    ),
    "probe": (
        "results",
        lambda t, o: [
            "probe",
            t["emb"],
            "--tasks-from",
            t["cube"],
            "--out",
            o,
            "--probe",
            "knn",
            "--k",
            "2",
            "--cluster",
            NO_CLUSTER,
            "--quiet",
        ],
    ),
    "evaluate": (
        "results",
        lambda t, o: [
            "evaluate",
            "--cubes",
            t["cube"],
            "--models",
            "unet",
            "--out",
            o,
            "--cluster",
            NO_CLUSTER,
            "--quiet",
        ],
    ),
    "tune": (
        "study",
        lambda t, o: [
            "tune",
            "--cubes",
            t["cube"],
            "--models",
            "unet",
            "--space",
            "lr=1e-4:1e-2:log",
            "--trials",
            "1",
            "--out",
            o,
            "--cluster",
            NO_CLUSTER,
            "--quiet",
        ],
    ),
    "report": ("report", lambda t, o: ["report", t["results"], "--out", o]),
    "quickstart": (
        "quickstart",
        lambda t, o: ["quickstart", "--out", o, "--cluster", NO_CLUSTER, "--quiet"],
    ),
}
THINGS = {
    "user": "cryocube did not write",
    "file": "is a file",
    "cube_x": "cryocube cube",
    "emb_x": "embedding store",
    "results_x": "results folder",
    "report": "cryocube report",
    "study": "cryocube study",
    "quickstart": "quickstart folder",
}
KIND_OF = {
    "cube_x": "cube",
    "emb_x": "embeddings",
    "results_x": "results",
    "report": "report",
    "study": "study",
    "quickstart": "quickstart",
}
CASES = [(c, t) for c in COMMANDS for t in THINGS if KIND_OF.get(t) != COMMANDS[c][0]]


def refused(argv: list[str], target: str, capsys, words: str) -> None:
    before = tree_digest(Path(target))
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert target in lines[0] and words in lines[0], lines[0]
    assert tree_digest(Path(target)) == before  # byte-identical afterwards


@pytest.mark.parametrize("command,thing", CASES)
def test_every_command_refuses_every_other_thing_at_its_out(things, capsys, command, thing):
    _, argv = COMMANDS[command]
    refused(argv(things, things[thing]), things[thing], capsys, THINGS[thing])


@pytest.mark.parametrize("command", ["convert", "embed"])
def test_overwrite_never_replaces_someone_elses_files(things, capsys, command):
    _, argv = COMMANDS[command]
    for thing in ("user", "file", "results_x"):
        refused(argv(things, things[thing]) + ["--overwrite"], things[thing], capsys, THINGS[thing])


@pytest.mark.parametrize(
    "argv,target,words",
    [
        (
            lambda t: [
                "convert",
                "gld",
                "--raw",
                t["raw"],
                "--out",
                t["raw"],
                "--cluster",
                NO_CLUSTER,
            ],
            "raw",
            "this command's input",
        ),
        (
            lambda t: [
                "convert",
                "gld",
                "--raw",
                t["raw"],
                "--out",
                t["raw"] + "/c.zarr",
                "--cluster",
                NO_CLUSTER,
            ],
            "raw",
            "inside this command's input",
        ),
        (
            lambda t: [
                "embed",
                "mean",
                "--cube",
                t["cube"],
                "--out",
                t["cube"],
                "--cluster",
                NO_CLUSTER,
            ],
            "cube",
            "this command's input",
        ),
        (
            lambda t: [
                "embed",
                "mean",
                "--cube",
                t["cube"],
                "--out",
                t["cube"] + "/e.zarr",
                "--cluster",
                NO_CLUSTER,
            ],
            "cube",
            "inside",
        ),
        (
            lambda t: [
                "probe",
                t["emb"],
                "--tasks-from",
                t["cube"],
                "--out",
                t["cube"],
                "--cluster",
                NO_CLUSTER,
            ],
            "cube",
            "input",
        ),
        (
            lambda t: [
                "probe",
                t["emb"],
                "--tasks-from",
                t["cube"],
                "--out",
                t["emb"],
                "--cluster",
                NO_CLUSTER,
            ],
            "emb",
            "input",
        ),
        (
            lambda t: [
                "evaluate",
                "--cubes",
                t["cube"],
                "--models",
                "unet",
                "--out",
                t["cube"],
                "--cluster",
                NO_CLUSTER,
            ],
            "cube",
            "input",
        ),
        (
            lambda t: [
                "evaluate",
                "--cubes",
                t["cube"],
                "--models",
                "unet",
                "--out",
                str(t["root"]),
                "--cluster",
                NO_CLUSTER,
            ],
            "cube",
            "lies inside --out",
        ),
        (
            lambda t: ["report", t["results"], "--out", t["results"]],
            "results",
            "this command's input",
        ),
        (
            lambda t: ["report", t["results"], "--out", str(t["root"])],
            "results",
            "lies inside --out",
        ),
    ],
)
def test_a_command_never_writes_into_its_own_input(things, capsys, argv, target, words):
    before = tree_digest(Path(things[target]))
    assert main(argv(things)) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and words in err and "Traceback" not in err, err
    assert tree_digest(Path(things[target])) == before


def test_same_kind_resumes_and_overwrite_replaces_own_kind_only(things, tmp_path, client, capsys):
    addr = things["addr"]
    before = tree_digest(Path(things["cube"]))
    assert (
        main(
            [
                "convert",
                "gld",
                "--raw",
                things["raw"],
                "--out",
                things["cube"],
                "--tile",
                things["tile"],
                "--cluster",
                addr,
                "--quiet",
            ]
        )
        == 0
    )
    assert "already complete" in capsys.readouterr().out
    assert tree_digest(Path(things["cube"])) == before  # resumed: nothing rewritten
    emb = str(tmp_path / "e.zarr")
    assert (
        main(
            ["embed", "mean", "--cube", things["cube"], "--out", emb, "--cluster", addr, "--quiet"]
        )
        == 0
    )
    capsys.readouterr()
    # embeddings of other inputs: refused without --overwrite, replaced with it
    assert (
        main(
            [
                "embed",
                "random",
                "--cube",
                things["cube"],
                "--out",
                emb,
                "--cluster",
                addr,
                "--quiet",
            ]
        )
        == 2
    )
    assert "--overwrite" in capsys.readouterr().err
    assert (
        main(
            [
                "embed",
                "random",
                "--cube",
                things["cube"],
                "--out",
                emb,
                "--cluster",
                addr,
                "--quiet",
                "--overwrite",
            ]
        )
        == 0
    )
    attrs = json.loads((Path(emb) / "zarr.json").read_text())["attributes"]
    assert attrs["source"] == "random" and attrs[outputs.ZARR_MARKER]["kind"] == "embeddings"


def test_outputs_of_earlier_versions_are_recognised(things, tmp_path):
    """No marker file: a results folder by results.jsonl/runs, a report by report.html, a cube by
    its attrs."""
    import shutil

    for name in ("results", "report"):
        old = tmp_path / name
        shutil.copytree(things[name], old)
        (old / outputs.MARKER).unlink()
        assert outputs.identify(str(old)).kind == name
    attrs = json.loads((Path(things["cube"]) / "zarr.json").read_text())["attributes"]
    del attrs[outputs.ZARR_MARKER]
    assert outputs._zarr_kind(attrs) == "cube"


def test_two_probe_runs_into_one_out_keep_both_runs_files(things, capsys):
    out = Path(things["results"])
    assert (
        main(
            [
                "probe",
                things["emb"],
                "--tasks-from",
                things["cube"],
                "--out",
                str(out),
                "--probe",
                "knn",
                "--k",
                "3",
                "--cluster",
                things["addr"],
                "--quiet",
            ]
        )
        == 0
    )
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len({r["run_id"] for r in recs}) == 2
    for r in recs:  # each record's files are its own run's: k folds as recorded
        summary = json.loads(Path(r["summary_file"]).read_text())
        assert (
            summary["meta"]["run_id"] == r["run_id"]
            and Path(r["summary_file"]).parent.name == r["run_id"]
        )
        assert summary["overall_q_score"] == pytest.approx(r["metrics"]["Q"])
        assert {len(v) for v in summary["task_fold_scores"].values()} == {r["probe"]["k"]}
    assert r["summary_file"] in capsys.readouterr().out  # printed where it wrote


KILL_AFTER_FIRST_TABLE = textwrap.dedent("""
    import os, signal, sys
    import cryocube.pages.build as b
    first = b.write_table
    def write_then_die(*a, **k):
        files = first(*a, **k)
        os.kill(os.getpid(), signal.SIGKILL)
    b.write_table = write_then_die
    b.build_report([sys.argv[1]], sys.argv[2], formats=["md", "csv", "html"])
""")


def test_a_report_killed_midway_leaves_the_previous_report(things, tmp_path):
    import shutil

    rep = tmp_path / "report"
    shutil.copytree(things["report"], rep)
    before = tree_digest(rep)
    p = subprocess.run(
        [sys.executable, "-c", KILL_AFTER_FIRST_TABLE, things["results"], str(rep)],
        capture_output=True,
    )
    assert p.returncode == -9, p.stderr.decode()
    assert tree_digest(rep) == before  # nothing new beside the previous report.html
    half = list(tmp_path.glob(".report.building-*"))
    # the half-built one is aside, visibly not the report
    assert len(half) == 1 and any(half[0].rglob("*.csv"))
    # the next report replaces the folder whole: no file of the earlier one (no csv asked now)
    # survives
    r = build_report([things["results"]], str(rep), formats=["md"])
    assert (
        not list(tmp_path.glob(".report.*"))
        and (rep / "report.md").exists()
        and not (rep / "report.html").exists()
    )
    assert set(tree_digest(rep)) == {str(p.relative_to(rep)) for p in r.files} | {outputs.MARKER}
    # a file the user put into the report folder since: the whole-folder swap would lose it, so it
    # is refused
    (rep / "notes.txt").write_text("mine\n")
    before = tree_digest(rep)
    with pytest.raises(UserError, match="files it did not write \\(notes.txt\\)"):
        build_report([things["results"]], str(rep), formats=["md"])
    assert tree_digest(rep) == before


def _tmpfs(d: Path, size: str) -> None:
    d.mkdir()
    p = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)],
        capture_output=True,
        text=True,
    )
    if p.returncode != 0:
        pytest.fail(
            f"cannot mount a tmpfs to test a full disk ({p.stderr.strip()}); run this test as root"
        )


@pytest.fixture()
def small_disk(tmp_path):
    """A real 48 KiB tmpfs: room for a store's metadata, not for its first block of vectors."""
    d = tmp_path / "small"
    _tmpfs(d, "48k")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


@pytest.fixture()
def full_disk(tmp_path):
    """A real 256 KiB tmpfs filled to the last byte (this test needs root to mount; it says so if it
    cannot)."""
    d = tmp_path / "full"
    _tmpfs(d, "256k")
    try:
        with open(d / "filler", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError as e:
                assert e.errno == errno.ENOSPC
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_a_full_disk_is_one_sentence_naming_the_path(things, full_disk, capsys):
    for argv, out in (
        (
            ["embed", "mean", "--cube", things["cube"], "--cluster", things["addr"], "--quiet"],
            full_disk / "e.zarr",
        ),
        (["report", things["results"]], full_disk / "rep"),
        (
            ["convert", "gld", "--raw", things["raw"], "--cluster", things["addr"], "--quiet"],
            full_disk / "c.zarr",
        ),
    ):
        assert main(argv + ["--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert (
            err.count("\n") == 0
            and "no space left on device writing" in err
            and str(full_disk) in err
        ), err
        assert "Traceback" not in err


def test_embed_csv_lands_beside_the_store_as_the_readme_says(things, tmp_path, capsys):
    out = tmp_path / "emb" / "mean.zarr"
    assert (
        main(
            [
                "embed",
                "mean",
                "--cube",
                things["cube"],
                "--out",
                str(out),
                "--format",
                "csv",
                "--cluster",
                things["addr"],
                "--quiet",
            ]
        )
        == 0
    )
    csv = tmp_path / "emb" / "mean.csv"
    assert csv.read_text().startswith("id,0,") and str(csv) in capsys.readouterr().out
    assert not (tmp_path / "emb" / "mean.zarr.csv").exists()
    # a CSV that is not a submission is never replaced, --overwrite or not
    (tmp_path / "emb" / "other.csv").write_text("name,score\nx,1\n")
    refused(
        [
            "embed",
            "mean",
            "--cube",
            things["cube"],
            "--out",
            str(tmp_path / "emb" / "other.zarr"),
            "--format",
            "csv",
            "--cluster",
            NO_CLUSTER,
            "--overwrite",
        ],
        str(tmp_path / "emb" / "other.csv"),
        capsys,
        "file",
    )


def test_claims_on_object_storage(s3_bucket):
    """The same rules on s3:// through fsspec: a prefix of foreign objects is refused, a new one
    claimed."""
    import fsspec

    name, opts = s3_bucket
    fsspec.filesystem("s3", **opts).pipe(f"{name}/theirs/a.txt", b"theirs")
    with pytest.raises(UserError, match="cryocube did not write"):
        outputs.claim(f"s3://{name}/theirs", "results", "evaluate", storage_options=opts)
    assert (
        outputs.claim(f"s3://{name}/mine", "results", "evaluate", storage_options=opts).state
        == "absent"
    )
    assert outputs.identify(f"s3://{name}/mine", opts).kind == "results"
    with pytest.raises(UserError, match="cryocube results folder"):
        outputs.claim(f"s3://{name}/mine", "report", "report", storage_options=opts)


def test_a_disk_that_fills_while_workers_write_is_one_sentence(things, small_disk, capsys):
    """The store's metadata fits; the first block of vectors, written by a worker process, does
    not."""
    out = small_disk / "e.zarr"
    assert (
        main(
            [
                "embed",
                "mean",
                "--cube",
                things["cube"],
                "--out",
                str(out),
                "--cluster",
                things["addr"],
                "--quiet",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no space left on device writing" in err and str(out) in err, (
        err
    )
    # the partial store stays, marked, for a rerun with space to resume
    assert (out / "zarr.json").exists()
