"""Where Dask work runs: the cluster backends, and what tasks need to know about the workers.

Library functions take `client: Client | None` and resolve it with `get_client` (never starting a
cluster behind the user's back: in a hub notebook that would bypass the user's gateway cluster).
Only the CLI creates and owns clusters, through `open_cluster(spec)`, a context manager over one
registry of backends:

    local                  LocalCluster of worker processes (laptop, CI)
    cuda                   dask_cuda.LocalCUDACluster: one worker per GPU, resources {"GPU": 1}
    k8s[:MANIFEST]         dask-kubernetes operator KubeCluster from a DaskCluster manifest
    gateway[:OPTIONS]      dask-gateway cluster (Pangeo hubs); options from a YAML file
    tcp://host:port, ...   an existing scheduler (never shut down on exit)
    scheduler-file:PATH    an existing scheduler by its scheduler file (or any PATH.json)

Dask starts worker processes with OMP_NUM_THREADS=1, so torch would run single-threaded on CPU
workers; every cluster created here sets torch's threads deliberately (`TorchThreads`).
"""
from __future__ import annotations

import contextlib
import copy
import ctypes
import functools
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from distributed.diagnostics.plugin import WorkerPlugin

from ..catalog import packaged_dir
from ..errors import UserError

if TYPE_CHECKING:
    from distributed import Client

__all__ = [
    "BACKENDS", "ClusterError", "ManifestError", "TorchThreads", "cluster_info", "device_for_worker",
    "get_client", "gpu_resources", "k8s_cluster_spec", "load_k8s_cluster_spec", "open_cluster", "parse_cluster_spec",
    "prepare_torch_task", "tune_malloc",
    "read_gateway_options", "read_k8s_manifests", "validate_k8s_manifest",
]

DEFAULT_K8S_MANIFEST = packaged_dir("k8s", "deployments/k8s") / "daskcluster.yaml"
DEFAULT_IMAGE = "cryocube:0.1.0"  # built from deployments/docker/Dockerfile; push it and use its registry ref
STORAGE_SECRET = "cryocube-storage"  # optional k8s Secret with AWS_ACCESS_KEY_ID/... for s3:// cubes
GPU = "GPU"  # the abstract worker resource that GPU tasks request
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
CONNECT_TIMEOUT = "10s"  # to an existing scheduler
WORKER_WAIT_S = 600  # for the first worker of a remote cluster (image pulls, node scale-up)
MAX_LOCAL_WORKERS = 4  # beyond this, fewer processes with more torch threads each use memory better


class ClusterError(UserError):
    """A cluster could not be created or reached; the message says which and what to install/fix."""


class ManifestError(UserError):
    """A Kubernetes manifest does not match its schema; the message names the file and field paths."""


# --------------------------------------------------------------------------------------- clients


def get_client(client: "Client | None" = None) -> "Client":
    """The given client, else the default one (the Client a notebook or `open_cluster` holds)."""
    if client is not None:
        return client
    from distributed import default_client

    try:
        return default_client()
    except ValueError:
        raise UserError(
            "no Dask client: pass client=Client(...) (e.g. the one your notebook or hub created), "
            "or run through the `cryocube` CLI, which starts a cluster with --cluster local|cuda|k8s|gateway|tcp://..."
        ) from None


def gpu_resources(client: "Client") -> dict | None:
    """{"GPU": 1} to annotate tasks with when every worker advertises a GPU, else None.

    A task that requests a resource no worker offers waits in `no-worker` forever, so this asks the
    scheduler instead of guessing from the backend.
    """
    workers = client.scheduler_info(n_workers=-1)["workers"]
    if workers and all(w.get("resources", {}).get(GPU, 0) >= 1 for w in workers.values()):
        return {GPU: 1}
    return None


def device_for_worker() -> str:
    """The torch device for the current task: "cuda" where this process sees a GPU, else "cpu"."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def prepare_torch_task(threads: int | None) -> str:
    """What every torch task does first on its worker: malloc tuning, torch threads; returns its device."""
    import torch

    tune_malloc()
    if threads:
        torch.set_num_threads(threads)
    return device_for_worker()


def cluster_info(client: "Client") -> dict:
    """What the run ran on, for result records: worker count, threads, memory, resources, dashboard."""
    info = client.scheduler_info(n_workers=-1)
    workers = list(info["workers"].values())
    resources: dict[str, float] = {}
    for w in workers:
        for k, v in (w.get("resources") or {}).items():
            resources[k] = resources.get(k, 0) + v
    return {
        "n_workers": len(workers),
        "threads": sum(w.get("nthreads", 0) for w in workers),
        "memory": int(sum(w.get("memory_limit") or 0 for w in workers)),
        "resources": resources,
        "gpu": gpu_resources(client) is not None,
        "scheduler": info.get("address"),
        "dashboard": _dashboard_link(client),
    }


def _dashboard_link(client: "Client") -> str | None:
    try:
        return client.dashboard_link
    except (KeyError, AttributeError):  # scheduler without a dashboard (no bokeh, or disabled)
        return None


MALLOC_MMAP_THRESHOLD = 32 * 2**20  # glibc's ceiling: per-sample arrays come from the reusable heap
MALLOC_TRIM_THRESHOLD = 256 * 2**20  # freed heap a worker may keep instead of faulting it in again


@functools.cache
def tune_malloc() -> bool:
    """Let glibc reuse freed memory for this worker's large, short-lived numpy/torch buffers.

    Dask starts workers with MALLOC_TRIM_THRESHOLD_=64KiB, which also freezes glibc's adaptive mmap
    threshold: every array over 128 KiB becomes a fresh mmap whose pages are faulted in and zeroed,
    then unmapped. Conversion blocks ran 2x slower for it (benchmarks/bench_convert.py). Called at
    the start of heavy tasks, so it also holds on clusters cryocube did not create. False off glibc.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(libc.mallopt(m_mmap_threshold, MALLOC_MMAP_THRESHOLD)) and bool(libc.mallopt(m_trim_threshold, MALLOC_TRIM_THRESHOLD))


class TorchThreads(WorkerPlugin):
    """Give torch `threads` intra-op threads on each worker, without importing torch where no task
    needs it (conversion workers): the OMP/MKL variables are set before torch's first import.

    threads=None: the worker's CPU share, i.e. its container's CPUs (cgroup-aware) / its Dask
    threads; right on Kubernetes/gateway pods where one worker owns its pod.
    """

    name = "cryocube-torch-threads"

    def __init__(self, threads: int | None = None):
        self.threads = threads

    def setup(self, worker) -> None:
        from dask.system import CPU_COUNT

        n = self.threads or max(1, CPU_COUNT // max(1, worker.state.nthreads))
        os.environ.update({v: str(n) for v in THREAD_VARS})  # read by torch/OpenMP when first imported
        if "torch" in sys.modules:  # already imported (e.g. dask-cuda's pre_import): set it directly
            sys.modules["torch"].set_num_threads(n)


# --------------------------------------------------------------------------------------- backends


@dataclass(frozen=True)
class ClusterRequest:
    """What `open_cluster` was asked for; `target` is what follows "NAME:" in the spec (or the address)."""

    backend: str
    target: str
    n_workers: int | None
    threads_per_worker: int | None
    memory_limit: str | None
    gateway_options: dict | None
    k8s_spec: str | None
    dashboard: bool
    torch_threads: int | None


Backend = Callable[[ClusterRequest, contextlib.ExitStack], "Client"]
BACKENDS: dict[str, Backend] = {}


def backend(name: str) -> Callable[[Backend], Backend]:
    def register(fn: Backend) -> Backend:
        BACKENDS[name] = fn
        return fn

    return register


def parse_cluster_spec(spec: str) -> tuple[str, str]:
    """(backend name, target) for a --cluster value."""
    spec = spec.strip()
    if "://" in spec:
        return "address", spec
    name, _, target = spec.partition(":")
    if name in BACKENDS and name != "address":
        return name, target
    if spec.endswith(".json"):
        return "scheduler-file", spec
    raise ClusterError(
        f"unknown cluster {spec!r}: use one of local, cuda, k8s[:MANIFEST.yaml], gateway[:OPTIONS.yaml], "
        "tcp://HOST:PORT (or tls://...), scheduler-file:PATH"
    )


@contextlib.contextmanager
def open_cluster(
    spec: str = "local",
    n_workers: int | None = None,
    threads_per_worker: int | None = None,
    memory_limit: str | None = None,
    gateway_options: dict | None = None,
    k8s_spec: str | None = None,
    dashboard: bool = True,
    torch_threads: int | None = None,
) -> Iterator["Client"]:
    """Yield a Client on the cluster named by `spec`; on exit close only what was created here.

    n_workers/threads_per_worker/memory_limit size local and cuda clusters and override the
    manifest/options of k8s and gateway clusters. torch_threads: intra-op threads per worker
    (default: the worker's share of the CPUs).
    """
    for label, v in (("n_workers", n_workers), ("threads_per_worker", threads_per_worker), ("torch_threads", torch_threads)):
        if v is not None and v < 1:
            raise ClusterError(f"{label} must be >= 1, got {v}")
    name, target = parse_cluster_spec(spec)
    req = ClusterRequest(name, target, n_workers, threads_per_worker, memory_limit, gateway_options, k8s_spec,
                         dashboard, torch_threads)
    with contextlib.ExitStack() as stack:
        client = BACKENDS[name](req, stack)
        if dashboard:
            n = len(client.scheduler_info(n_workers=-1)["workers"])
            print(f"cryocube: {name} cluster, {n} workers, dashboard {_dashboard_link(client) or '(none)'}",
                  file=sys.stderr)
        yield client


def _require(module: str, extra: str, what: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ClusterError(f"--cluster {what} needs the {module.split('.')[0]} package: "
                           f"pip install 'cryocube[{extra}]'") from e


def _thread_env(threads: int) -> dict[str, str]:
    return {v: str(threads) for v in THREAD_VARS}


def _dashboard_kwargs(dashboard: bool) -> dict:
    """Dashboard on the usual port (Dask moves it if taken), or none, with the scheduler's HTTP
    endpoints on a free port (else every extra cluster warns that 8787 is taken)."""
    if dashboard:
        return {"dashboard_address": ":8787"}
    return {"dashboard_address": None, "scheduler_kwargs": {"dashboard_address": ":0"}}


def _own_client(stack: contextlib.ExitStack, cluster, torch_threads: int | None) -> "Client":
    from distributed import Client

    client = stack.enter_context(Client(cluster))
    client.register_plugin(TorchThreads(torch_threads), name=TorchThreads.name)
    return client


def _wait_first_worker(client: "Client", what: str, timeout: float = WORKER_WAIT_S) -> None:
    try:
        client.wait_for_workers(1, timeout=timeout)
    except TimeoutError:
        raise ClusterError(f"{what}: no worker joined within {timeout:.0f} s (image pull, quota or "
                           "scheduling problem? see the dashboard / kubectl describe)") from None


@backend("local")
def _local(req: ClusterRequest, stack: contextlib.ExitStack) -> "Client":
    """Worker processes (not threads): torch and the GIL, and crash isolation per worker."""
    from dask.system import CPU_COUNT
    from distributed import LocalCluster

    tpw = req.threads_per_worker or 1
    n = req.n_workers or max(1, min(CPU_COUNT // tpw, MAX_LOCAL_WORKERS))
    threads = req.torch_threads or max(1, CPU_COUNT // (n * tpw))
    cluster = stack.enter_context(LocalCluster(
        n_workers=n, threads_per_worker=tpw, processes=True, memory_limit=req.memory_limit or "auto",
        env=_thread_env(threads), **_dashboard_kwargs(req.dashboard)))
    return _own_client(stack, cluster, threads)


@backend("cuda")
def _cuda(req: ClusterRequest, stack: contextlib.ExitStack) -> "Client":
    """One worker process per visible GPU, each advertising {"GPU": 1} for the engine's annotations."""
    from dask.system import CPU_COUNT

    dask_cuda = _require("dask_cuda", "cuda", "cuda")
    from dask_cuda.utils import get_n_gpus

    try:
        n_gpus = get_n_gpus()
    except Exception as e:  # pynvml raises NVMLError_LibraryNotFound/DriverNotLoaded/... without a GPU
        raise ClusterError(f"--cluster cuda: LocalCUDACluster finds no GPU ({type(e).__name__}: {e}); "
                           "this machine has no visible NVIDIA GPU/driver: use --cluster local") from e
    if n_gpus < 1:
        raise ClusterError("--cluster cuda: LocalCUDACluster finds no GPU (CUDA_VISIBLE_DEVICES is empty); "
                           "use --cluster local")
    n = req.n_workers or n_gpus
    if n > n_gpus:
        raise ClusterError(f"--cluster cuda: {n} workers asked but {n_gpus} GPUs visible (one worker per GPU)")
    tpw = req.threads_per_worker or 1
    threads = req.torch_threads or max(1, CPU_COUNT // (n * tpw))
    cluster = stack.enter_context(dask_cuda.LocalCUDACluster(
        n_workers=n, threads_per_worker=tpw, memory_limit=req.memory_limit or "auto",
        resources={GPU: 1}, pre_import=["torch"], **_dashboard_kwargs(req.dashboard)))
    return _own_client(stack, cluster, threads)


@backend("address")
def _address(req: ClusterRequest, stack: contextlib.ExitStack) -> "Client":
    """An existing scheduler: the Client is ours to close, the scheduler and workers are not."""
    from distributed import Client
    from distributed.comm.registry import backends as comm_backends

    scheme = req.target.split("://", 1)[0]
    if scheme not in comm_backends:
        raise ClusterError(f"--cluster {req.target}: unknown protocol {scheme!r} (known: {', '.join(sorted(comm_backends))})")
    try:
        client = Client(req.target, timeout=CONNECT_TIMEOUT)
    except (OSError, TimeoutError) as e:
        raise ClusterError(f"no Dask scheduler answers at {req.target} within {CONNECT_TIMEOUT} ({e})") from e
    stack.callback(client.close)
    if req.torch_threads:  # someone else's workers: only when asked
        client.register_plugin(TorchThreads(req.torch_threads), name=TorchThreads.name)
    return client


@backend("scheduler-file")
def _scheduler_file(req: ClusterRequest, stack: contextlib.ExitStack) -> "Client":
    from distributed import Client

    path = Path(req.target).expanduser()
    if not path.is_file():
        raise ClusterError(f"scheduler file {path} does not exist (written by `dask scheduler --scheduler-file`)")
    try:
        client = Client(scheduler_file=str(path), timeout=CONNECT_TIMEOUT)
    except (OSError, TimeoutError) as e:
        raise ClusterError(f"the scheduler named in {path} does not answer within {CONNECT_TIMEOUT} ({e})") from e
    stack.callback(client.close)
    if req.torch_threads:
        client.register_plugin(TorchThreads(req.torch_threads), name=TorchThreads.name)
    return client


# ------------------------------------------------------------------------------------ kubernetes


def k8s_cluster_spec(name: str = "cryocube", image: str = DEFAULT_IMAGE, n_workers: int = 2, gpu: bool = True,
                     threads_per_worker: int = 1, worker_cpu: int = 4, worker_memory: str = "24Gi",
                     env: dict[str, str] | None = None, storage_secret: str | None = STORAGE_SECRET) -> dict:
    """A DaskCluster resource (operator CRD) whose worker group requests one GPU per worker.

    Built with `make_cluster_spec`, then edited: its `resources` would apply to the scheduler too,
    so GPU/CPU/memory go on the worker container only, as strings (the CRD types quantities as
    strings), and None fields are dropped (the CRD rejects nulls). Workers read the cubes, so they
    take object-store credentials (AWS_* keys) from the optional Secret `storage_secret`.
    """
    kube = _require("dask_kubernetes.operator", "k8s", "k8s")
    torch_threads = max(1, worker_cpu // threads_per_worker)
    command = f"dask worker --nthreads {threads_per_worker} --memory-limit auto"
    if gpu:
        command += f" --resources {GPU}=1"
    spec = kube.make_cluster_spec(name=name, image=image, n_workers=n_workers, worker_command=command,
                                  env={**_thread_env(torch_threads), **(env or {})})
    worker = spec["spec"]["worker"]["spec"]
    quantities = {"cpu": str(worker_cpu), "memory": worker_memory}
    worker["containers"][0]["resources"] = {
        "requests": dict(quantities), "limits": {**quantities, **({"nvidia.com/gpu": "1"} if gpu else {})}}
    if storage_secret:
        worker["containers"][0]["envFrom"] = [{"secretRef": {"name": storage_secret, "optional": True}}]
    if gpu:  # GPU node pools are commonly tainted nvidia.com/gpu=present:NoSchedule
        worker["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    scheduler = spec["spec"]["scheduler"]["spec"]["containers"][0]
    scheduler["args"] = ["dask", "scheduler", "--host", "0.0.0.0"]  # distributed has no `dask-scheduler` script any more
    scheduler["resources"] = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}
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
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ManifestError(f"Kubernetes manifest {p} does not exist")
    try:
        return [d for d in yaml.safe_load_all(p.read_text()) if d is not None]
    except yaml.YAMLError as e:
        raise ManifestError(f"{p}: not valid YAML ({e})") from e


_CRD_FILES = {"DaskCluster": "daskcluster.yaml", "DaskWorkerGroup": "daskworkergroup.yaml",
              "DaskJob": "daskjob.yaml", "DaskAutoscaler": "daskautoscaler.yaml"}
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_OBJECT_META = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string", "pattern": _DNS_LABEL}, "namespace": {"type": "string", "pattern": _DNS_LABEL},
    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
    "annotations": {"type": "object", "additionalProperties": {"type": "string"}}}}


@functools.lru_cache(maxsize=None)
def _crd(kind: str) -> dict:
    """The CRD the installed dask-kubernetes ships for `kind` (fully expanded openAPIV3Schema)."""
    import yaml

    if importlib.util.find_spec("dask_kubernetes") is None:
        raise ClusterError("validating Dask operator manifests needs dask-kubernetes: pip install 'cryocube[k8s]'")
    root = Path(importlib.util.find_spec("dask_kubernetes").origin).parent  # no import: kopf/kubernetes are slow
    path = root / "operator/deployment/helm/dask-kubernetes-operator/crds" / _CRD_FILES[kind]
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(path.read_text(), Loader=loader)


def _strict(schema: Any) -> Any:
    """Reject unknown fields, as `kubectl apply` does with strict field validation (its default)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@functools.lru_cache(maxsize=None)
def _crd_schema(kind: str) -> dict:
    crd = _crd(kind)["spec"]
    version = next(v for v in crd["versions"] if v.get("served", True))
    schema = _strict(version["schema"]["openAPIV3Schema"])
    schema["properties"] = {"apiVersion": {"const": f"{crd['group']}/{version['name']}"},
                            "kind": {"const": crd["names"]["kind"]}, "metadata": _OBJECT_META,
                            **schema["properties"]}
    schema["required"] = ["apiVersion", "kind", "metadata", *schema.get("required", ["spec"])]
    return schema


@functools.lru_cache(maxsize=None)
def _job_schema() -> dict:
    """batch/v1 Job; its pod spec is checked against the PodSpec schema expanded in the DaskCluster CRD."""
    pod = _crd_schema("DaskCluster")["properties"]["spec"]["properties"]["worker"]["properties"]["spec"]
    integer = {"type": "integer", "minimum": 0}
    job_fields = {k: integer for k in ("activeDeadlineSeconds", "backoffLimit", "backoffLimitPerIndex", "completions",
                                       "maxFailedIndexes", "parallelism", "ttlSecondsAfterFinished")}
    job_fields |= {k: {"type": "string"} for k in ("completionMode", "podReplacementPolicy", "managedBy")}
    job_fields |= {k: {"type": "object"} for k in ("podFailurePolicy", "selector", "successPolicy")}
    job_fields |= {"suspend": {"type": "boolean"}, "manualSelector": {"type": "boolean"}}
    restart = {"required": ["restartPolicy"], "properties": {"restartPolicy": {"enum": ["Never", "OnFailure"]}}}
    template = {"type": "object", "required": ["spec"], "additionalProperties": False, "properties": {
        "metadata": {"type": "object"}, "spec": {"allOf": [pod, restart]}}}
    return {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
            "properties": {"apiVersion": {"const": "batch/v1"}, "kind": {"const": "Job"}, "metadata": _OBJECT_META,
                           "spec": {"type": "object", "required": ["template"], "additionalProperties": False,
                                    "properties": {**job_fields, "template": template}}}}


MANIFEST_SCHEMAS: dict[str, Callable[[], dict]] = {
    **{kind: functools.partial(_crd_schema, kind) for kind in _CRD_FILES}, "Job": _job_schema}


def validate_k8s_manifest(doc: dict, source: str = "<manifest>") -> None:
    """Raise ManifestError listing every field of `doc` that the cluster's schema would reject.

    Dask operator resources are checked against the CRDs shipped in the installed dask-kubernetes
    wheel (the schema the API server enforces), with unknown fields rejected; a batch/v1 Job is
    checked against a Job skeleton around the same expanded PodSpec schema.
    """
    import jsonschema

    kind = doc.get("kind") if isinstance(doc, dict) else None
    if kind not in MANIFEST_SCHEMAS:
        raise ManifestError(f"{source}: kind {kind!r} is not one of {', '.join(MANIFEST_SCHEMAS)}")
    errors = sorted(jsonschema.Draft7Validator(MANIFEST_SCHEMAS[kind]()).iter_errors(doc),
                    key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        lines = [f"  {'.'.join(str(p) for p in e.absolute_path) or '(top)'}: {_short(e.message)}" for e in errors]
        raise ManifestError(f"{source}: {kind} {doc.get('metadata', {}).get('name', '?')!r} does not match its "
                            f"schema ({len(errors)} problems):\n" + "\n".join(lines))


def _short(message: str, limit: int = 200) -> str:
    return message if len(message) <= limit else message[:limit] + "..."


def _set_flag(args: list[str], flag: str, value: str) -> list[str]:
    """args with `flag value` replaced (or appended)."""
    out = list(args)
    if flag in out:
        i = out.index(flag)
        out[i + 1:i + 2] = [value]
    else:
        out += [flag, value]
    return out


def load_k8s_cluster_spec(path: str | os.PathLike | None = None, n_workers: int | None = None,
                          threads_per_worker: int | None = None, memory_limit: str | None = None) -> dict:
    """The DaskCluster `--cluster k8s` creates: from `path`, else deployments/k8s/daskcluster.yaml
    (in a checkout or the image), else `k8s_cluster_spec()`; with the CLI's sizes applied, validated."""
    if path is None and DEFAULT_K8S_MANIFEST.is_file():
        path = DEFAULT_K8S_MANIFEST
    if path is None:
        doc, source = k8s_cluster_spec(), "k8s_cluster_spec()"
    else:
        docs = [d for d in read_k8s_manifests(path) if isinstance(d, dict) and d.get("kind") == "DaskCluster"]
        if len(docs) != 1:
            raise ManifestError(f"{path}: expected exactly one DaskCluster document, found {len(docs)}")
        doc, source = copy.deepcopy(docs[0]), str(path)
    worker = doc.get("spec", {}).get("worker", {})
    if n_workers:
        worker["replicas"] = n_workers
    container = (worker.get("spec", {}).get("containers") or [{}])[0]
    if threads_per_worker and "args" in container:
        container["args"] = _set_flag(container["args"], "--nthreads", str(threads_per_worker))
    if memory_limit and "args" in container:
        container["args"] = _set_flag(container["args"], "--memory-limit", memory_limit)
    validate_k8s_manifest(doc, source)
    return doc


@backend("k8s")
def _k8s(req: ClusterRequest, stack: contextlib.ExitStack) -> "Client":
    """Create the DaskCluster through the operator; it is deleted when the context exits."""
    source = req.target or req.k8s_spec or None
    doc = load_k8s_cluster_spec(source, req.n_workers, req.threads_per_worker, req.memory_limit)
    source = source or "the default DaskCluster spec"
    kube = _require("dask_kubernetes.operator", "k8s", "k8s")
    name = doc["metadata"]["name"]
    try:
        cluster = kube.KubeCluster(custom_cluster_spec=doc, namespace=doc["metadata"].get("namespace"),
                                   shutdown_on_close=True, quiet=True)
    except Exception as e:  # kr8s/kopf raise ValueError, ConnectionError, ServerError, ...
        raise ClusterError(
            f"cannot create DaskCluster {name!r} from {source}: {type(e).__name__}: {e}. It needs a kubeconfig "
            "(KUBECONFIG) or an in-cluster service account allowed to manage daskclusters.kubernetes.dask.org, "
            "and the dask-kubernetes operator installed in the cluster") from e
    stack.callback(cluster.close)
    client = _own_client(stack, cluster, req.torch_threads)
    _wait_first_worker(client, f"DaskCluster {name!r}")
    return client


# --------------------------------------------------------------------------------------- gateway

GATEWAY_KEYS = {"address", "proxy_address", "public_address", "auth", "cluster_options", "workers", "adapt",
                "worker_timeout"}


def read_gateway_options(path: str | os.PathLike) -> dict:
    """The gateway options YAML (see deployments/pangeo/gateway-options.yaml), checked for unknown keys."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ClusterError(f"gateway options file {p} does not exist")
    doc = yaml.safe_load(p.read_text()) or {}
    if not isinstance(doc, dict):
        raise ClusterError(f"{p}: expected a mapping of gateway options")
    _check_gateway_keys(doc, str(p))
    return doc


def _check_gateway_keys(doc: dict, source: str) -> None:
    unknown = set(doc) - GATEWAY_KEYS
    if unknown:
        raise ClusterError(f"{source}: unknown gateway keys {sorted(unknown)} (known: {sorted(GATEWAY_KEYS)}; "
                           "server-defined cluster options go under cluster_options)")
    if "workers" in doc and "adapt" in doc:
        raise ClusterError(f"{source}: give either workers (fixed size) or adapt (minimum/maximum), not both")


def _gateway_auth(dask_gateway, auth):
    """None/str → dask-gateway resolves it from config; {"type": ..., **kwargs} → that auth with kwargs."""
    if not isinstance(auth, dict):
        return auth
    import dask

    kwargs = {k: v for k, v in auth.items() if k != "type"}
    with dask.config.set({"gateway.auth.kwargs": kwargs}):
        return dask_gateway.auth.get_auth(auth.get("type", "basic"))


def _close_gateway(gateway) -> None:
    """Close a dask_gateway.Gateway once: its __del__ would close it again and, since distributed
    raises on a stopped LoopRunner's loop, print a RuntimeError at garbage collection."""
    gateway.close()
    gateway.__dict__.pop("_loop_runner", None)  # what __del__ checks before closing


def _shutdown_gateway_cluster(cluster) -> None:
    cluster.shutdown()
    gw = getattr(cluster, "gateway", None)
    if gw is not None:  # shutdown closed it; keep its __del__ from closing it again
        gw.__dict__.pop("_loop_runner", None)


@backend("gateway")
def _gateway(req: ClusterRequest, stack: contextlib.ExitStack) -> "Client":
    """A new cluster on the hub's dask-gateway (address and auth come from the hub's dask config)."""
    dask_gateway = _require("dask_gateway", "gateway", "gateway")
    opts = read_gateway_options(req.target) if req.target else {}
    _check_gateway_keys(req.gateway_options or {}, "gateway_options")
    opts = {**opts, **(req.gateway_options or {})}
    try:
        gateway = dask_gateway.Gateway(address=opts.get("address"), proxy_address=opts.get("proxy_address"),
                                       public_address=opts.get("public_address"),
                                       auth=_gateway_auth(dask_gateway, opts.get("auth")))
    except ValueError as e:  # "No dask-gateway address provided or found in configuration"
        raise ClusterError(f"--cluster gateway: {e} (hubs set gateway.address in dask config; else give address:)") from e
    try:  # this Gateway only validates options and submits; the cluster keeps its own connection
        try:
            options = gateway.cluster_options()
        except Exception as e:  # aiohttp ClientConnectorError, GatewayServerError, 401
            raise ClusterError(f"--cluster gateway: cannot reach the gateway at {gateway.address}: "
                               f"{type(e).__name__}: {e}") from e
        for key, value in (opts.get("cluster_options") or {}).items():
            try:
                options[key] = value
            except (KeyError, AttributeError, TypeError, ValueError) as e:
                raise ClusterError(f"gateway cluster option {key}={value!r} rejected: {e} "
                                   f"(this gateway offers: {', '.join(options)})") from e
        cluster = gateway.new_cluster(options, shutdown_on_close=True)
    finally:
        _close_gateway(gateway)  # before the cluster's: they share one event loop, stopped by the last close
    stack.callback(_shutdown_gateway_cluster, cluster)
    if req.n_workers or "adapt" not in opts:
        first = req.n_workers or opts.get("workers", 2)
        cluster.scale(first)
    else:
        first = opts["adapt"].get("minimum", 0)
        cluster.adapt(**opts["adapt"])
    client = stack.enter_context(cluster.get_client(set_as_default=True))
    client.register_plugin(TorchThreads(req.torch_threads), name=TorchThreads.name)
    if first:  # an adaptive cluster with minimum 0 gets workers only once tasks arrive
        _wait_first_worker(client, f"gateway cluster {cluster.name}", opts.get("worker_timeout", WORKER_WAIT_S))
    return client
