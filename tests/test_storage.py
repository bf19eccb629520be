"""The README's remote route on a real S3 endpoint (moto's server on loopback): convert to s3,
evaluate from s3 with results to s3, report from s3 — and the secret appears in no output, file,
object or record.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from cryocube.synthetic import make_raw

# moto accepts any credentials; this one must never be printed or stored
SECRET = "SECRET-cryo-5d1e9b"


@pytest.fixture()
def bucket_and_options(s3_server):
    import uuid

    name = f"remote-{uuid.uuid4().hex[:8]}"
    boto3.client(
        "s3",
        endpoint_url=s3_server,
        region_name="us-east-1",
        aws_access_key_id="AKIA-test",
        aws_secret_access_key=SECRET,
    ).create_bucket(Bucket=name)
    opts = {
        "key": "AKIA-test",
        "secret": SECRET,
        "client_kwargs": {"endpoint_url": s3_server, "region_name": "us-east-1"},
    }
    return name, opts


def _drop_aws_env() -> None:
    for k in [k for k in os.environ if k.startswith("AWS_")]:
        del os.environ[k]


def _has_aws_env() -> bool:
    return any(k.startswith("AWS_") for k in os.environ)


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    # only --storage-options may authenticate
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["PYTHONWARNINGS"] = "ignore"
    return subprocess.run(
        [sys.executable, "-m", "cryocube.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=900,
    )


def test_remote_route_end_to_end_without_leaking_credentials(
    tmp_path, client, bucket_and_options, s3_server
):
    bucket, opts = bucket_and_options
    so = json.dumps(opts)
    m = make_raw("glid", tmp_path / "raw", n={"train": 6, "val": 2, "test": 2}, seed=9)
    cube, out = f"s3://{bucket}/cubes/glid.zarr", f"s3://{bucket}/results"
    cluster = ["--cluster", client.scheduler.address]
    # the workers get credentials only the way cryocube hands them over (a worker plugin)
    client.run(_drop_aws_env)
    assert not any(client.run(_has_aws_env).values())
    runs = [
        [
            "convert",
            "glid",
            "--raw",
            str(tmp_path / "raw"),
            "--out",
            cube,
            "--tile",
            str(m.tile_size),
            "--storage-options",
            so,
            *cluster,
        ],
        ["inspect", cube, "--storage-options", so],
        [
            "evaluate",
            "--cubes",
            cube,
            "--models",
            "unet,ssl4eo_moco",
            "--out",
            out,
            "--storage-options",
            so,
            "--allow-random-weights",
            "--set",
            "epochs=1",
            "--set",
            "decoder_channels=16",
            "--set",
            "input_size=32",
            "--set",
            "normalization=cube",
            *cluster,
        ],
        ["report", out, "--out", str(tmp_path / "report"), "--cube", cube, "--storage-options", so],
    ]
    streams = []
    for argv in runs:
        p = _cli(argv, tmp_path)
        assert p.returncode == 0, (argv[0], p.stderr[-3000:])
        streams += [p.stdout, p.stderr]
    assert "glid" in streams[2] and "complete" in streams[2]  # inspect's summary
    assert "mIoU" in streams[4]
    # what landed in the bucket: the cube, the records, the caches, the predictions, the Parquet
    # copy
    s3 = boto3.client(
        "s3",
        endpoint_url=s3_server,
        region_name="us-east-1",
        aws_access_key_id="AKIA-test",
        aws_secret_access_key=SECRET,
    )
    keys = [
        o["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        for o in page.get("Contents", [])
    ]
    assert "results/results.jsonl" in keys and "results/results.parquet" in keys
    assert any(k.startswith("results/features/") for k in keys) and any(
        k.endswith("predictions.zarr/zarr.json") for k in keys
    )
    records = [
        json.loads(line)
        for line in (
            s3.get_object(Bucket=bucket, Key="results/results.jsonl")["Body"]
            .read()
            .decode()
            .splitlines()
        )
    ]
    assert (
        len(records) == 2
        and all(r["status"] == "ok" for r in records)
        and records[0]["cube"]["url"] == cube
    )
    assert (tmp_path / "report" / "report.html").is_file()
    # the secret is nowhere: not in any stream, local file or stored object
    for s in streams:
        assert SECRET not in s
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert SECRET.encode() not in f.read_bytes(), f
    for k in keys:
        assert SECRET.encode() not in s3.get_object(Bucket=bucket, Key=k)["Body"].read(), k
    # and an error from a remote store names no secret either
    p = _cli(["inspect", f"s3://{bucket}/nothing.zarr", "--storage-options", so], tmp_path)
    assert p.returncode == 2 and "no cube here" in p.stderr and SECRET not in p.stderr + p.stdout
