"""`--cluster k8s`: a DaskCluster through the dask-kubernetes operator, its manifests validated
against the CRDs of the installed dask-kubernetes (what the API server enforces) first."""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import os
from pathlib import Path
from typing import Any, Callable

import yaml
from distributed import Client

from .. import __version__
from ..catalog import CATALOG_DIR, packaged_dir, read_yaml
from ..errors import ManifestError, yaml_problem
from .registry import ClusterError, ClusterRequest, backend, own_client, require, wait_first_worker
from .runtime import GPU, thread_env

DEFAULT_K8S_MANIFEST = packaged_dir("k8s", "deployments/k8s") / "daskcluster.yaml"
# built from deployments/docker/Dockerfile; push it and use its registry ref
DEFAULT_IMAGE = f"cryocube:{__version__}"
# optional k8s Secret with AWS_ACCESS_KEY_ID/... for s3:// cubes
STORAGE_SECRET = "cryocube-storage"


def k8s_cluster_spec(
    name: str = "cryocube",
    image: str = DEFAULT_IMAGE,
    n_workers: int = 2,
    gpu: bool = True,
    threads_per_worker: int = 1,
    worker_cpu: int = 4,
    worker_memory: str = "24Gi",
    env: dict[str, str] | None = None,
    storage_secret: str | None = STORAGE_SECRET,
) -> dict:
    """A DaskCluster whose workers request a GPU each, on the worker container only (the scheduler
    would get `make_cluster_spec`'s `resources` too), as strings and without nulls (the CRD's)."""
    kube = require("dask_kubernetes.operator", "k8s", "k8s")
    torch_threads = max(1, worker_cpu // threads_per_worker)
    command = f"dask worker --nthreads {threads_per_worker} --memory-limit auto"
    if gpu:
        command += f" --resources {GPU}=1"
    spec = kube.make_cluster_spec(
        name=name,
        image=image,
        n_workers=n_workers,
        worker_command=command,
        env={**thread_env(torch_threads), **(env or {})},
    )
    worker = spec["spec"]["worker"]["spec"]
    quantities = {"cpu": str(worker_cpu), "memory": worker_memory}
    worker["containers"][0]["resources"] = {
        "requests": dict(quantities),
        "limits": {**quantities, **({"nvidia.com/gpu": "1"} if gpu else {})},
    }
    if storage_secret:
        worker["containers"][0]["envFrom"] = [
            {"secretRef": {"name": storage_secret, "optional": True}}
        ]
    if gpu:  # GPU node pools are commonly tainted nvidia.com/gpu=present:NoSchedule
        worker["tolerations"] = [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
    scheduler = spec["spec"]["scheduler"]["spec"]["containers"][0]
    # distributed has no `dask-scheduler` script any more
    scheduler["args"] = ["dask", "scheduler", "--host", "0.0.0.0"]
    scheduler["resources"] = {
        "requests": {"cpu": "1", "memory": "2Gi"},
        "limits": {"memory": "4Gi"},
    }
    scheduler["env"] = []
    return _drop_nulls(spec)


def _drop_nulls(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _drop_nulls(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_drop_nulls(v) for v in x]
    return x


def read_k8s_manifests(path: str | os.PathLike) -> list[dict]:
    """The YAML documents of a manifest file (empty documents dropped)."""
    p = Path(path)
    if not p.is_file():
        raise ManifestError(f"Kubernetes manifest {p} does not exist")
    try:
        return [d for d in yaml.safe_load_all(p.read_text()) if d is not None]
    except yaml.YAMLError as e:
        raise ManifestError(f"{p}: not valid YAML ({yaml_problem(e)})") from e


_CRD_KINDS = ("DaskCluster", "DaskWorkerGroup", "DaskJob", "DaskAutoscaler")  # crds/<kind>.yaml


@functools.lru_cache(maxsize=None)
def _crd(kind: str) -> dict:
    """The CRD the installed dask-kubernetes ships for `kind` (fully expanded openAPIV3Schema)."""
    if importlib.util.find_spec("dask_kubernetes") is None:
        raise ClusterError(
            "validating Dask operator manifests needs dask-kubernetes: pip install 'cryocube[k8s]'"
        )
    # no import: kopf/kubernetes are slow
    root = Path(importlib.util.find_spec("dask_kubernetes").origin).parent
    path = root / "operator/deployment/helm/dask-kubernetes-operator/crds" / f"{kind.lower()}.yaml"
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(path.read_text(), Loader=loader)


def _strict(schema: Any) -> Any:
    """Reject unknown fields, as `kubectl apply` does with strict field validation (its default)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.lru_cache(maxsize=None)
def _own_schemas() -> dict:
    """catalogs/k8s-schemas.yaml: object metadata and batch/v1 Job."""
    return read_yaml(CATALOG_DIR / "k8s-schemas.yaml")


@functools.lru_cache(maxsize=None)
def _crd_schema(kind: str) -> dict:
    crd = _crd(kind)["spec"]
    version = next(v for v in crd["versions"] if v.get("served", True))
    schema = _strict(version["schema"]["openAPIV3Schema"])
    schema["properties"] = {
        "apiVersion": {"const": f"{crd['group']}/{version['name']}"},
        "kind": {"const": crd["names"]["kind"]},
        "metadata": _own_schemas()["object_meta"],
        **schema["properties"],
    }
    schema["required"] = ["apiVersion", "kind", "metadata", *schema.get("required", ["spec"])]
    return schema


@functools.lru_cache(maxsize=None)
def _job_schema() -> dict:
    """batch/v1 Job, its pod spec checked against the PodSpec of the DaskCluster CRD."""
    job = copy.deepcopy(_own_schemas()["job"])
    worker = _crd_schema("DaskCluster")["properties"]["spec"]["properties"]["worker"]
    pod = job["properties"]["spec"]["properties"]["template"]["properties"]["spec"]
    pod["allOf"].insert(0, worker["properties"]["spec"])
    return job


MANIFEST_SCHEMAS: dict[str, Callable[[], dict]] = {
    **{kind: functools.partial(_crd_schema, kind) for kind in _CRD_KINDS},
    "Job": _job_schema,
}


def validate_k8s_manifest(doc: dict, source: str = "<manifest>") -> None:
    """Raise ManifestError listing every field of `doc` its schema rejects, unknown ones too."""
    import jsonschema

    kind = doc.get("kind") if isinstance(doc, dict) else None
    if kind not in MANIFEST_SCHEMAS:
        raise ManifestError(f"{source}: kind {kind!r} is not one of {', '.join(MANIFEST_SCHEMAS)}")
    errors = sorted(
        jsonschema.Draft7Validator(MANIFEST_SCHEMAS[kind]()).iter_errors(doc),
        key=lambda e: [str(p) for p in e.absolute_path],
    )
    if errors:
        lines = [
            f"  {'.'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message[:200]}"
            + ("..." if len(e.message) > 200 else "")
            for e in errors
        ]
        raise ManifestError(
            f"{source}: {kind} {doc.get('metadata', {}).get('name', '?')!r} does not match its "
            f"schema ({len(errors)} problems):\n" + "\n".join(lines)
        )


def _set_flag(args: list[str], flag: str, value: str) -> list[str]:
    """args with `flag value` replaced (or appended)."""
    out = list(args)
    if flag in out:
        i = out.index(flag)
        out[i + 1 : i + 2] = [value]
    else:
        out += [flag, value]
    return out


def load_k8s_cluster_spec(
    path: str | os.PathLike | None = None,
    n_workers: int | None = None,
    threads_per_worker: int | None = None,
    memory_limit: str | None = None,
) -> dict:
    """The DaskCluster `--cluster k8s` creates (`path`, else DEFAULT_K8S_MANIFEST, else
    `k8s_cluster_spec()`), the CLI's sizes applied, validated."""
    if path is None and DEFAULT_K8S_MANIFEST.is_file():
        path = DEFAULT_K8S_MANIFEST
    if path is None:
        doc, source = k8s_cluster_spec(), "k8s_cluster_spec()"
    else:
        docs = [
            d
            for d in read_k8s_manifests(path)
            if isinstance(d, dict) and d.get("kind") == "DaskCluster"
        ]
        if len(docs) != 1:
            raise ManifestError(
                f"{path}: expected exactly one DaskCluster document, found {len(docs)}"
            )
        doc, source = copy.deepcopy(docs[0]), str(path)
    worker = doc.get("spec", {}).get("worker", {})
    if n_workers:
        worker["replicas"] = n_workers
    container = (worker.get("spec", {}).get("containers") or [{}])[0]
    for flag, value in (("--nthreads", threads_per_worker), ("--memory-limit", memory_limit)):
        if value and "args" in container:
            container["args"] = _set_flag(container["args"], flag, str(value))
    validate_k8s_manifest(doc, source)
    return doc


@backend("k8s")
def k8s(req: ClusterRequest, stack: contextlib.ExitStack) -> Client:
    """Create the DaskCluster through the operator; it is deleted when the context exits."""
    source = req.target or req.k8s_spec or None
    doc = load_k8s_cluster_spec(source, req.n_workers, req.threads_per_worker, req.memory_limit)
    source = source or "the default DaskCluster spec"
    kube = require("dask_kubernetes.operator", "k8s", "k8s")
    name = doc["metadata"]["name"]
    try:
        cluster = kube.KubeCluster(
            custom_cluster_spec=doc,
            namespace=doc["metadata"].get("namespace"),
            shutdown_on_close=True,
            quiet=True,
        )
    except Exception as e:  # kr8s/kopf raise ValueError, ConnectionError, ServerError, ...
        raise ClusterError(
            f"cannot create DaskCluster {name!r} from {source}: {type(e).__name__}: {e}. It needs a"
            " kubeconfig (KUBECONFIG) or an in-cluster service account allowed to manage"
            " daskclusters.kubernetes.dask.org, and the dask-kubernetes operator installed in the"
            " cluster"
        ) from e
    stack.callback(cluster.close)
    client = own_client(stack, cluster, req.torch_threads)
    wait_first_worker(client, f"DaskCluster {name!r}")
    return client
