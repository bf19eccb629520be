"""User errors as one sentence, wherever they happen: in a worker task, on the network, on a Ctrl-C
to the process group, in `inspect`; options that would be accepted and ignored are refused. Real
LocalClusters, real subprocesses and signals, a real HTTP server and real S3 endpoints on
loopback."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cryocube.cli import main
from cryocube.convert.writer import convert
from cryocube.synthetic import make_raw, make_samples

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


@pytest.fixture(scope="module")
def ssl(tmp_path_factory, client):
    root = tmp_path_factory.mktemp("errs")
    make_samples("ssl4eo-downstream", root / "raw", n=24, size=8, seed=5)
    convert(
        "ssl4eo-downstream",
        str(root / "raw"),
        str(root / "cube.zarr"),
        client=client,
        progress=False,
    )
    return root


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def test_a_user_error_raised_in_a_worker_task_reaches_the_user_as_its_sentence(tmp_path):
    """A UserError raised inside a task on a LocalCluster of worker processes: the client gets the
    sentence and the workers print nothing; a foreign task's failure (not cryocube's, not a user
    error) is still logged.
    """
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent("""
        import sys
        from cryocube.cluster import open_cluster
        from cryocube.families.embedding.probes import ProbeError

        def check(i):
            raise ProbeError(f"task 'x__cls': sample {i} has label 7; binary F1 needs two classes.")

        def foreign(i):
            raise ValueError("a bug of theirs")

        if __name__ == "__main__":
            with open_cluster("local", n_workers=1, quiet=True, dashboard=False) as client:
                futs = client.map(check, range(3), key=[f"cryocube-check-{i}" for i in range(3)])
                try:
                    client.gather(futs)
                except ProbeError as e:
                    print("SENTENCE", e)
                try:
                    client.submit(foreign, 0, key="theirs-0").result()
                except ValueError:
                    print("FOREIGN raised")
                import time; time.sleep(1)  # let the worker's log reach stderr
    """)
    )
    p = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=ENV, timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "SENTENCE task 'x__cls': sample" in p.stdout and "FOREIGN raised" in p.stdout
    cryocube_part = p.stderr.split("theirs-0")[0]
    assert "ProbeError" not in p.stderr and "cryocube-check" not in p.stderr, p.stderr
    # the filter is not a blanket
    assert "Compute Failed" in p.stderr and "a bug of theirs" in p.stderr
    assert "Traceback" not in cryocube_part


def test_probe_label_errors_are_refused_before_a_cluster_starts(ssl, tmp_path, client, capfd):
    root = ssl
    emb = str(tmp_path / "mean.zarr")
    assert (
        main(
            [
                "embed",
                "mean",
                "--cube",
                str(root / "cube.zarr"),
                "--out",
                emb,
                "--quiet",
                "--cluster",
                client.scheduler.address,
            ]
        )
        == 0
    )
    labels = tmp_path / "labels"
    labels.mkdir()
    rows = (root / "raw" / "labels" / "cloudy__cls.csv").read_text().splitlines()
    rows[2] = rows[2].split(",")[0] + ",2"  # a third class in a binary task
    (labels / "cloudy__cls.csv").write_text("\n".join(rows) + "\n")
    capfd.readouterr()
    # --cluster local: would start a LocalCluster (and print its line) if the check came after it
    assert (
        main(["probe", emb, "--labels", str(labels), "--out", str(tmp_path / "p"), "--k", "3"]) == 2
    )
    err = capfd.readouterr().err
    # the label check of load_probe_inputs (check_tasks), before any cluster
    assert len(_lines(err)) == 1, err
    assert _lines(err)[0].startswith(
        "cryocube probe: error: classification task cloudy__cls has 3 distinct labels"
    ), err


def test_ctrl_c_to_the_process_group_is_one_line_and_exit_130(ssl, tmp_path, client):
    """SIGINT to the whole process group (what a terminal sends): client, nannies and workers all
    get it."""
    root = ssl
    emb = str(tmp_path / "mean.zarr")
    assert (
        main(
            [
                "embed",
                "mean",
                "--cube",
                str(root / "cube.zarr"),
                "--out",
                emb,
                "--quiet",
                "--cluster",
                client.scheduler.address,
            ]
        )
        == 0
    )
    argv = [
        "probe",
        emb,
        "--labels",
        str(root / "raw" / "labels"),
        "--out",
        str(tmp_path / "p"),
        "--k",
        "10",
        "--set",
        "epochs=1000000",
        "--workers",
        "2",
    ]
    # "started": the probe tasks run on the workers
    _interrupt_and_check(argv, tmp_path / "stderr", "started", 2.0)


def _interrupt_and_check(argv: list[str], err_file, after: str, wait: float) -> None:
    """Run `cryocube ARGV` in its own process group, send the group SIGINT `wait` s after `after`
    shows on stderr, and check what a terminal's Ctrl-C must give: exit 130 and one sentence, no
    traceback or Dask noise.
    """
    # a terminal's foreground job: a suite started as a background job of a non-interactive shell
    # ignores SIGINT, and an ignored signal stays ignored across exec (a handled one does not)
    sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    with open(err_file, "w") as err:
        try:
            p = subprocess.Popen(
                [sys.executable, "-m", "cryocube.cli", *argv],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=ENV,
                start_new_session=True,
            )
        finally:
            signal.signal(signal.SIGINT, sigint)
        try:
            deadline = time.time() + 240
            while after not in err_file.read_text() and p.poll() is None and time.time() < deadline:
                time.sleep(0.1)
            assert p.poll() is None, err_file.read_text()
            time.sleep(wait)
            os.killpg(p.pid, signal.SIGINT)
            p.wait(120)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    err = err_file.read_text()
    assert p.returncode == 130, err
    assert (
        _lines(err)[-1] == f"cryocube {argv[0]}: interrupted; rerunning the same command resumes"
    ), err
    for noise in (
        "Traceback",
        "KeyboardInterrupt",
        "still alive",
        "CancelledError",
        "distributed.",
    ):
        assert noise not in err, err


def test_an_unreachable_s3_endpoint_is_one_sentence_naming_it(tmp_path, s3_bucket, capsys):
    bucket, opts = s3_bucket
    port = _unused_port()
    bad = {
        **opts,
        "client_kwargs": {**opts["client_kwargs"], "endpoint_url": f"http://127.0.0.1:{port}"},
        "config_kwargs": {"retries": {"max_attempts": 1}},
    }
    for argv in (
        ["inspect", f"s3://{bucket}/gld.zarr"],
        [
            "evaluate",
            "--cubes",
            f"s3://{bucket}/gld.zarr",
            "--models",
            "unet",
            "--out",
            str(tmp_path),
            "--dry-run",
        ],
    ):
        assert main([*argv, "--storage-options", json.dumps(bad)]) == 2
        err = capsys.readouterr().err
        assert len(_lines(err)) == 1, err
        assert (
            f"cannot reach http://127.0.0.1:{port}/{bucket}/gld.zarr" in err
            and "connection refused" in err
        ), err
    # the right endpoint and no cube there: not a network problem, and said so
    assert main(["inspect", f"s3://{bucket}/gld.zarr", "--storage-options", json.dumps(opts)]) == 2
    err = capsys.readouterr().err
    assert "no cube here (no such file or folder)" in err and "cannot reach" not in err


def test_inspect_says_what_is_there_instead_of_a_cube(ssl, tmp_path, client, capsys):
    root = ssl
    emb = str(tmp_path / "mean.zarr")
    assert (
        main(
            [
                "embed",
                "mean",
                "--cube",
                str(root / "cube.zarr"),
                "--out",
                emb,
                "--quiet",
                "--cluster",
                client.scheduler.address,
            ]
        )
        == 0
    )
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "results.jsonl").write_text("")
    capsys.readouterr()
    for path, words in (
        (emb, "it is an embedding store"),
        (str(tmp_path / "results"), "it is a results folder"),
        (str(tmp_path / "nothing"), "no such file or folder"),
    ):
        assert main(["inspect", path]) == 2
        err = capsys.readouterr().err
        assert len(_lines(err)) == 1 and words in err and path in err, err
    assert main(["inspect", str(root / "cube.zarr")]) == 0  # a sample cube has a summary too
    assert "task cloudy (cls): 24 labelled" in capsys.readouterr().out


def test_an_offline_download_is_not_reported_as_missing(tmp_path, http_dir):
    from cryocube.fetch import DownloadError, fetch

    with pytest.raises(
        DownloadError, match=r"could not be reached \(connection refused\).*check the network"
    ):
        fetch(f"http://127.0.0.1:{_unused_port()}/ck.pth", tmp_path / "ck.pth", progress=False)
    _, base = http_dir
    with pytest.raises(DownloadError, match="not found"):
        fetch(f"{base}/missing.pth", tmp_path / "ck.pth", progress=False)
    assert not list(tmp_path.glob("ck.pth*"))


def test_options_that_would_be_ignored_are_refused(ssl, tmp_path, client, capsys):
    root = ssl
    cube = str(root / "cube.zarr")
    assert (
        main(
            [
                "embed",
                "mean",
                "--cube",
                cube,
                "--out",
                str(tmp_path / "e.zarr"),
                "--set",
                "epochs=500",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert (
        "--set epochs: not used by the embedding family" in err
        and not (tmp_path / "e.zarr").exists()
    )
    gld = tmp_path / "gld.zarr"
    make_raw("gld", tmp_path / "raw", n={"train": 4, "val": 2, "test": 2}, seed=1)
    convert("gld", str(tmp_path / "raw"), str(gld), client=client, tile_size=32, progress=False)
    base = [
        "evaluate",
        "--cubes",
        str(gld),
        "--models",
        "ssl4eo_moco",
        "--allow-random-weights",
        "--out",
        str(tmp_path / "res"),
        "--dry-run",
    ]
    assert main([*base, "--protocol", "probe", "--fraction", "0.1"]) == 2
    assert "--fraction 0.1 does not apply" in capsys.readouterr().err
    assert main([*base, "--protocol", "probe", "--set", "epochs=3"]) == 2
    assert "--set epochs: not used by the embedding family" in capsys.readouterr().err
    # frozen reads epochs
    assert main([*base, "--protocol", "probe,frozen", "--set", "epochs=3"]) == 0
    capsys.readouterr()
    for bad in (",", "0.1,", "0", "nan"):
        with pytest.raises(SystemExit) as e:
            main([*base, "--protocol", "frozen", "--fraction", bad])
        assert (
            e.value.code == 2
            and "--fraction takes comma-separated numbers in (0, 1]" in capsys.readouterr().err
        )


def test_inspect_and_verify_say_what_is_there_in_one_sentence(ssl, tmp_path, client, capsys):
    """Every inspect mode on a path that holds no cube: one sentence naming it, no traceback (was
    FileNotFoundError for `--verify`)."""
    emb = str(tmp_path / "mean.zarr")
    assert (
        main(
            [
                "embed",
                "mean",
                "--cube",
                str(ssl / "cube.zarr"),
                "--out",
                emb,
                "--quiet",
                "--cluster",
                client.scheduler.address,
            ]
        )
        == 0
    )
    (tmp_path / "plain.zarr").write_text("not a store")
    (tmp_path / "empty.zarr").mkdir()
    capsys.readouterr()
    for path, words in (
        (str(tmp_path / "nothere.zarr"), "no such file or folder"),
        (emb, "it is an embedding store"),
        (str(tmp_path / "plain.zarr"), "no cube here"),
        (str(tmp_path / "empty.zarr"), "no cube here"),
    ):
        for extra in ([], ["--verify"]):
            assert main(["inspect", path, *extra, "--quiet"]) == 2, (path, extra)
            err = capsys.readouterr().err
            assert len(_lines(err)) == 1 and words in err and path in err, (extra, err)
    assert main(["inspect", str(ssl / "cube.zarr"), "--verify", "--quiet"]) == 0


@pytest.mark.parametrize(
    "flag,value", [("--trials", "0"), ("--batch", "0"), ("--epochs", "0"), ("--trials", "-2")]
)
def test_tune_counts_are_refused_before_any_cube_or_cluster(tmp_path, capsys, flag, value):
    """A count a study cannot run with is named first: the cube does not exist and the cluster is
    unreachable, and neither is what the sentence is about."""
    argv = [
        "tune",
        "--cubes",
        str(tmp_path / "nothere.zarr"),
        "--models",
        "unet",
        "--trials",
        "2",
        "--out",
        str(tmp_path / "study"),
        "--space",
        "lr=1e-4:1e-2:log",
        "--cluster",
        f"tcp://127.0.0.1:{_unused_port()}",
    ]
    argv[argv.index("--trials") + 1 if flag == "--trials" else len(argv) :] = (
        [value, *argv[argv.index("--trials") + 2 :]] if flag == "--trials" else [flag, value]
    )
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(_lines(err)) == 1 and f"{flag} must be >= 1, got {value}" in err, err
    assert not (tmp_path / "study").exists()


@pytest.mark.parametrize("after,wait", [("local cluster", 0.5), ("started", 2.0)])
def test_ctrl_c_during_embed_is_one_line_at_any_moment(ssl, tmp_path, after, wait):
    """SIGINT to the process group while `embed` starts its cluster or runs its blocks: exit 130 and
    one sentence (a worker process interrupted while it started printed two tracebacks; it now
    leaves Ctrl-C to the client).
    """
    argv = [
        "embed",
        "ssl4eo_moco",
        "--cube",
        str(ssl / "cube.zarr"),
        "--out",
        str(tmp_path / "e.zarr"),
        "--allow-random-weights",
        "--workers",
        "2",
    ]
    _interrupt_and_check(argv, tmp_path / "stderr", after, wait)
