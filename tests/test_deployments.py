"""The deployments/ files, checked offline against what would run them: the DaskCluster CRD shipped
in the dask-kubernetes wheel, the Kubernetes PodSpec schema, the real `dask worker`/`dask
scheduler`/ `cryocube` argument parsers, pyproject/Makefile for the Docker image, and cryocube's API
for the notebook.
"""

from __future__ import annotations

import ast
import copy
import importlib
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from cryocube.cluster import (
    ManifestError,
    k8s_cluster_spec,
    parse_cluster_spec,
    read_gateway_options,
    read_k8s_manifests,
    validate_k8s_manifest,
)

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deployments"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _one(path: Path) -> dict:
    docs = read_k8s_manifests(path)
    assert len(docs) == 1, path
    return docs[0]


def _container(pod_spec: dict, name: str) -> dict:
    return next(c for c in pod_spec["containers"] if c["name"] == name)


# ------------------------------------------------------------------------------------------ k8s


def test_daskcluster_manifest_matches_crd_and_the_built_spec():
    doc = _one(DEPLOY / "k8s" / "daskcluster.yaml")
    validate_k8s_manifest(doc, "daskcluster.yaml")
    worker = _container(doc["spec"]["worker"]["spec"], "worker")
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    scheduler = _container(doc["spec"]["scheduler"]["spec"], "scheduler")
    assert "nvidia.com/gpu" not in scheduler["resources"].get("limits", {})
    # the file is what cryocube's builder produces (one definition, two renderings)
    assert doc == k8s_cluster_spec(name=doc["metadata"]["name"], image=worker["image"])


def test_daskcluster_container_args_parse_with_the_real_dask_cli():
    from distributed.cli.dask_scheduler import main as dask_scheduler
    from distributed.cli.dask_worker import main as dask_worker

    doc = _one(DEPLOY / "k8s" / "daskcluster.yaml")
    wargs = _container(doc["spec"]["worker"]["spec"], "worker")["args"]
    sargs = _container(doc["spec"]["scheduler"]["spec"], "scheduler")["args"]
    assert wargs[:2] == ["dask", "worker"] and sargs[:2] == ["dask", "scheduler"]
    params = dask_worker.make_context("dask worker", list(wargs[2:])).params
    assert params["resources"] == "GPU=1" and params["nthreads"] == 1
    assert params["scheduler"] is None  # the operator sets DASK_SCHEDULER_ADDRESS
    assert (
        dask_scheduler.make_context("dask scheduler", list(sargs[2:])).params["host"] == "0.0.0.0"
    )


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (
            lambda d: d["spec"]["worker"].__setitem__("replicas", "two"),
            "spec.worker.replicas: 'two' is not of type 'integer'",
        ),
        (
            lambda d: d["spec"]["worker"]["spec"]["containers"][0]["resources"][
                "limits"
            ].__setitem__("nvidia.com/gpu", 1),
            "nvidia.com/gpu: 1 is not of type 'string'",
        ),
        (
            lambda d: d["spec"]["worker"]["spec"].__setitem__("nodeSelecter", {"gpu": "a100"}),
            "'nodeSelecter' was unexpected",
        ),
        (
            lambda d: d.__setitem__("apiVersion", "kubernetes.dask.org/v2"),
            "apiVersion: 'kubernetes.dask.org/v1' was expected",
        ),
        (
            lambda d: d["metadata"].__setitem__("name", "Cryo_Cube"),
            "metadata.name: 'Cryo_Cube' does not match",
        ),
        (lambda d: d["spec"].pop("scheduler"), "'scheduler' is a required property"),
    ],
)
def test_validator_rejects_what_the_api_server_would(mutate, expected):
    doc = copy.deepcopy(_one(DEPLOY / "k8s" / "daskcluster.yaml"))
    mutate(doc)
    with pytest.raises(ManifestError) as err:
        validate_k8s_manifest(doc, "mutated.yaml")
    assert expected in str(err.value) and str(err.value).startswith("mutated.yaml: DaskCluster")


def test_evaluate_job_runs_cryocube_against_the_daskcluster():
    from cryocube.cli import build_parser

    cluster = _one(DEPLOY / "k8s" / "daskcluster.yaml")
    job = _one(DEPLOY / "k8s" / "evaluate-job.yaml")
    validate_k8s_manifest(job, "evaluate-job.yaml")
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == _container(cluster["spec"]["worker"]["spec"], "worker")["image"]
    args = container.get("command", []) + container["args"]
    assert args[:2] == ["cryocube", "evaluate"]
    parsed = build_parser().parse_args(args[1:])  # every flag exists in the real CLI
    assert parsed.command == "evaluate"
    backend, address = parse_cluster_spec(parsed.cluster)
    assert backend == "address"
    # the Service the operator creates for the DaskCluster: <name>-scheduler, port tcp-comm 8786
    assert address == f"tcp://{cluster['metadata']['name']}-scheduler:8786"
    ports = {p["name"]: p["port"] for p in cluster["spec"]["scheduler"]["service"]["ports"]}
    assert ports["tcp-comm"] == 8786
    # the workers read the same cubes as the job: both take the same storage secret
    assert (
        container["envFrom"] == _container(cluster["spec"]["worker"]["spec"], "worker")["envFrom"]
    )

    bad = copy.deepcopy(job)
    bad["spec"]["template"]["spec"]["restartPolicy"] = "Always"  # not allowed for a Job
    bad["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = 1
    with pytest.raises(ManifestError) as err:
        validate_k8s_manifest(bad, "job.yaml")
    assert "'Always' is not one of ['Never', 'OnFailure']" in str(err.value)
    assert "requests.cpu: 1 is not of type 'string'" in str(err.value)


# --------------------------------------------------------------------------------------- docker


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) with comments dropped and continuation lines joined."""
    text = re.sub(
        r"\\\n",
        " ",
        "\n".join(
            line
            for line in (DEPLOY / "docker" / "Dockerfile").read_text().splitlines()
            if not line.lstrip().startswith("#")
        ),
    )
    return [
        (m.group(1).upper(), m.group(2).strip()) for m in re.finditer(r"^(\w+)\s+(.*)$", text, re.M)
    ]


def test_dockerfile_builds_from_this_repository():
    steps = _dockerfile()
    (base,) = [a for i, a in steps if i == "FROM"]
    py = re.match(r"python:(\d+)\.(\d+)", base)
    assert py and f">={py.group(1)}.{py.group(2)}" == PYPROJECT["project"]["requires-python"]
    for i, a in steps:
        if i == "COPY":
            *sources, _ = shlex.split(a)
            for s in sources:
                assert (ROOT / s).exists(), (
                    f"COPY {s}: not in the repository (build context is the repo root)"
                )
    # the torch pin is the one the tests run with
    make_pin = (
        re.search(r"^TORCH_PIN \?= (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1).strip()
    )
    (arg,) = [a for i, a in steps if i == "ARG" and a.startswith("TORCH_PIN=")]
    assert arg.split("=", 1)[1].strip('"') == make_pin
    # the extras it installs exist in pyproject
    installs = " ".join(a for i, a in steps if i == "RUN" and "pip install -e" in a)
    extras = re.search(r"\.\[([\w,-]+)\]", installs).group(1).split(",")
    assert set(extras) <= set(PYPROJECT["project"]["optional-dependencies"]), extras
    assert {"cuda", "k8s", "gateway"} <= set(extras)
    entry = json.loads(next(a for i, a in steps if i == "ENTRYPOINT"))
    cmd = json.loads(next(a for i, a in steps if i == "CMD"))
    assert entry[0] == "tini" and cmd[0] in PYPROJECT["project"]["scripts"]


def test_manifests_use_the_image_tag_of_this_version():
    from cryocube import __version__

    tag = f"cryocube:{__version__}"
    assert f"-t {tag} ." in (DEPLOY / "docker" / "Dockerfile").read_text()
    for name in ("daskcluster.yaml", "evaluate-job.yaml"):
        doc = _one(DEPLOY / "k8s" / name)
        images = re.findall(r"'image': '([^']+)'", repr(doc))
        assert images and set(images) == {tag}, (name, images)


# --------------------------------------------------------------------------------------- pangeo


def test_gateway_options_file_is_valid_and_leaves_hub_settings_alone():
    opts = read_gateway_options(DEPLOY / "pangeo" / "gateway-options.yaml")
    # the hub's dask config provides them
    assert {"address", "auth", "proxy_address"}.isdisjoint(opts)
    # hubs run workers on the notebook's image
    assert "image" not in opts.get("cluster_options", {})
    assert opts["adapt"]["minimum"] >= 1 and opts["adapt"]["maximum"] >= opts["adapt"]["minimum"]
    assert all(isinstance(v, (int, float)) for v in opts["cluster_options"].values())


def test_notebook_uses_the_existing_client_and_real_cryocube_names():
    nb = json.loads((DEPLOY / "pangeo" / "cryocube-gateway.ipynb").read_text())
    assert nb["nbformat"] == 4 and nb["metadata"]["kernelspec"]["language"] == "python"
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    # stored clean
    assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code")
    trees = [ast.parse(src) for src in code]
    imported = 0
    calls = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module.startswith("cryocube"):
                mod = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(mod, alias.name), f"{node.module}.{alias.name} does not exist"
                    imported += 1
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", None))
                calls.setdefault(name, []).append(node)
    assert imported >= 4
    # cryocube gets the notebook's client; nothing in the notebook starts a cluster of its own
    (evaluate,) = calls["evaluate"]
    assert any(
        k.arg == "client" and getattr(k.value, "id", None) == "client" for k in evaluate.keywords
    )
    assert {"open_cluster", "LocalCluster", "LocalCUDACluster", "KubeCluster"}.isdisjoint(calls)
    assert "new_cluster" in calls and "get_client" in calls
    # it ends with the results as data (tests/test_notebooks.py runs it on a real gateway)
    (opened,) = calls["open_results"]
    assert [getattr(a, "id", None) for a in opened.args] == ["OUT"]
    # runs_from_grid's keywords are its real parameters
    import inspect

    from cryocube.engine.plan import runs_from_grid

    (grid,) = calls["runs_from_grid"]
    assert {k.arg for k in grid.keywords} <= set(inspect.signature(runs_from_grid).parameters)
