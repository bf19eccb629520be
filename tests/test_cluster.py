"""Cluster backends on real parts: LocalCluster worker processes, an existing scheduler reached by
address and by scheduler file, a real dask-gateway server on loopback, dask-cuda on this machine,
and the dask-kubernetes operator up to the Kubernetes API."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest
import yaml

from cryocube.cluster import (
    ClusterError,
    ManifestError,
    cluster_info,
    device_for_worker,
    get_client,
    gpu_resources,
    k8s_cluster_spec,
    load_k8s_cluster_spec,
    open_cluster,
    parse_cluster_spec,
    validate_k8s_manifest,
)
from cryocube.errors import UserError


def _torch_probe() -> tuple[int, str | None, str]:
    """Inside a task: torch's intra-op threads, OMP_NUM_THREADS, and the device the engine would
    use."""
    import os

    import torch

    return torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS"), device_for_worker()


def _pid() -> int:
    import os

    return os.getpid()


def _inc(x: int) -> int:
    return x + 1


def _scheduler_alive(address: str) -> bool:
    from distributed import Client

    host, port = address.split("://")[1].rsplit(":", 1)
    try:  # a closed scheduler refuses at once; Dask's Client would retry until its timeout
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError:
        return False
    try:
        with Client(address, timeout="3s", set_as_default=False) as c:
            return c.scheduler_info()["address"] == address
    except OSError:
        return False


# ------------------------------------------------------------------------------------------ local


def test_local_cluster_has_worker_processes_cpu_device_and_torch_threads():
    import os

    from dask.system import CPU_COUNT

    # torch_threads=2: Dask's default would be 1 (OMP_NUM_THREADS=1), so this shows the setting
    # works
    with open_cluster("local", n_workers=2, dashboard=False, torch_threads=2) as client:
        assert get_client() is client  # open_cluster's client is the default for library calls
        info = cluster_info(client)
        assert (info["n_workers"], info["threads"], info["resources"], info["gpu"]) == (
            2,
            2,
            {},
            False,
        )
        assert info["memory"] > 0
        pids = set(client.run(_pid).values())
        assert len(pids) == 2 and os.getpid() not in pids  # processes, not threads
        assert client.submit(_torch_probe, pure=False).result() == (min(2, CPU_COUNT), "2", "cpu")
        assert gpu_resources(client) is None
        # why gpu_resources matters: a task asking for a resource nobody offers never starts
        stuck = client.submit(_inc, 1, resources={"GPU": 1})
        with pytest.raises(TimeoutError):
            stuck.result(timeout=1)
        address = client.scheduler.address
    assert client.status == "closed"
    assert not _scheduler_alive(address)  # we created it, so we closed it
    assert device_for_worker() == "cpu"


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_local_sizing_follows_the_plan_and_the_cores_never_the_load():
    """Fewer runs than cores: fewer workers, more torch threads each (a single run uses every core);
    the answer depends on the plan and the machine only: the same under load as idle."""
    from cryocube.cluster import planned_threads
    from cryocube.cluster.local import MAX_LOCAL_WORKERS, local_sizing

    assert local_sizing(None, None, None, parallel=1, cores=2) == (1, 1, 2)
    assert local_sizing(None, None, None, parallel=2, cores=2) == (2, 1, 1)
    assert local_sizing(None, None, None, parallel=8, cores=2) == (2, 1, 1)
    assert local_sizing(None, None, None, parallel=3, cores=16) == (3, 1, 5)
    # unknown plan: as before
    assert local_sizing(None, None, None, parallel=None, cores=16) == (MAX_LOCAL_WORKERS, 1, 4)
    assert local_sizing(2, None, None, parallel=1, cores=2) == (2, 1, 1)  # --workers wins
    # so do fixed torch threads
    assert local_sizing(None, None, 3, parallel=1, cores=2) == (1, 1, 3)
    idle = [planned_threads("local", parallel=p) for p in (1, 2, 5)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<4: pass"]
        )
        for _ in range(3)
    ]
    try:
        _busy(0.5)
        loaded = [planned_threads("local", parallel=p) for p in (1, 2, 5)]
    finally:
        for p in procs:
            p.wait()
    assert loaded == idle
    # remote workers: their own share, read when they start
    assert planned_threads("k8s", parallel=1) is None


def test_single_run_plan_gets_one_worker_with_every_core():
    from dask.system import CPU_COUNT

    from cryocube.cluster import configured_threads, planned_threads

    with open_cluster("local", dashboard=False, quiet=True, parallel=1) as client:
        assert cluster_info(client)["n_workers"] == 1
        threads = list(client.run(configured_threads).values())
        assert threads == [planned_threads("local", parallel=1)] == [max(1, int(CPU_COUNT))]
        assert client.submit(_torch_probe, pure=False).result()[:2] == (
            max(1, int(CPU_COUNT)),
            str(max(1, int(CPU_COUNT))),
        )


def test_a_fast_exit_skips_finalization_and_the_handlers_before_it_but_flushes_output(tmp_path):
    """FastExit's handler runs first at exit and ends the process: handlers registered before it
    (here one that writes a file) never run, what was printed still arrives, the exit code is 0."""
    marker = tmp_path / "ran"
    code = textwrap.dedent(
        f"""
        import atexit, pathlib, sys
        from cryocube.cluster.runtime import FastExit
        atexit.register(lambda: pathlib.Path({str(marker)!r}).write_text("ran"))
        FastExit().setup(None)
        sys.stdout.write("printed before exit")  # no newline: only a flush delivers it
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout) == (0, "printed before exit"), r.stderr
    assert not marker.exists()


def test_a_local_cluster_registers_the_fast_exit_and_warms_its_workers():
    """evaluate's warm-up: one task per worker imports the families' modules and names the device;
    the cluster evaluate opens ends its processes through FastExit."""
    from cryocube.cluster.runtime import FastExit
    from cryocube.engine.evaluate import wait_warm, warm_workers
    from cryocube.families import get
    from cryocube.precision import this_device

    mods = get("vqa").warm_modules
    with open_cluster("local", n_workers=2, dashboard=False, quiet=True) as client:
        plugins = client.run(lambda dask_worker: sorted(dask_worker.plugins))
        assert all(FastExit.name in p for p in plugins.values()), plugins

        def loaded():
            return [m in sys.modules for m in mods]

        assert all(not any(v) for v in client.run(loaded).values())  # fresh workers
        warm = warm_workers(client, ["vqa"])
        assert len(warm) == 2 and wait_warm(client, warm) == this_device()
        assert all(all(v) for v in client.run(loaded).values())


def test_on_a_local_cluster_a_planning_error_is_one_sentence_and_writes_nothing(tmp_path):
    """evaluate starts a local cluster's workers while it plans: a run that cannot be planned (no
    cube there) still ends in one sentence naming it, exit 2, no cluster line, nothing at --out."""
    out, cube = tmp_path / "results", tmp_path / "no-cube.zarr"
    r = subprocess.run(
        [sys.executable, "-m", "cryocube.cli", "evaluate", "--cubes", str(cube), "--models"]
        + ["unet", "--out", str(out), "--cluster", "local", "--workers", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert str(cube) in lines[0] and "dashboard" not in r.stderr  # no cluster line
    assert not out.exists()


def test_get_client_returns_given_client_and_refuses_to_start_one(client):
    assert get_client(client) is client
    code = textwrap.dedent("""
        from cryocube.cluster import get_client
        from cryocube.errors import UserError
        try:
            get_client()
        except UserError as e:
            print("USERERROR", e)
        import distributed
        print("CLIENTS", len(distributed.client._global_clients))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "USERERROR no Dask client: pass client=" in out.stdout, out.stderr
    assert "CLIENTS 0" in out.stdout  # nothing was started behind the caller's back


# ------------------------------------------------------------------------ existing schedulers, GPU


@pytest.fixture(scope="module")
def gpu_annotated_cluster(tmp_path_factory):
    """A real LocalCluster whose worker advertises GPU=1 and writes a scheduler file."""
    from distributed import LocalCluster

    sched_file = tmp_path_factory.mktemp("sched") / "scheduler.json"
    with LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=True,
        resources={"GPU": 1},
        dashboard_address=None,
        scheduler_kwargs={"scheduler_file": str(sched_file), "dashboard_address": ":0"},
    ) as cluster:
        yield cluster, sched_file


def test_connect_by_address_detects_gpu_workers_and_leaves_scheduler_running(gpu_annotated_cluster):
    cluster, _ = gpu_annotated_cluster
    address = cluster.scheduler_address
    with open_cluster(address, dashboard=False) as client:
        assert client.scheduler.address == address
        assert gpu_resources(client) == {"GPU": 1}
        assert cluster_info(client)["resources"] == {"GPU": 1}
        # the annotated task runs (a worker offers GPU); the device comes from the worker's torch
        assert (
            client.submit(device_for_worker, resources=gpu_resources(client), pure=False).result(
                timeout=60
            )
            == "cpu"
        )
    assert client.status == "closed"
    assert _scheduler_alive(address)
    assert len(cluster.scheduler_info["workers"]) == 1


def test_connect_by_scheduler_file(gpu_annotated_cluster):
    cluster, sched_file = gpu_annotated_cluster
    for spec in (f"scheduler-file:{sched_file}", str(sched_file)):
        with open_cluster(spec, dashboard=False) as client:
            assert client.submit(_inc, 1).result(timeout=60) == 2
            assert client.scheduler.address == cluster.scheduler_address
    assert _scheduler_alive(cluster.scheduler_address)
    with pytest.raises(ClusterError, match="does not exist"):
        with open_cluster(f"scheduler-file:{sched_file.parent / 'missing.json'}"):
            pass


def test_unreachable_scheduler_and_unknown_specs_are_user_errors(monkeypatch):
    from cryocube.cluster import remote

    # Dask retries a refused connection until then
    monkeypatch.setattr(remote, "CONNECT_TIMEOUT", "2s")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(
        ClusterError, match=f"no Dask scheduler answers at tcp://127.0.0.1:{port} within 2s"
    ):
        with open_cluster(f"tcp://127.0.0.1:{port}"):
            pass
    with pytest.raises(ClusterError, match="unknown protocol 'foo'"):
        with open_cluster("foo://host:1"):
            pass
    with pytest.raises(ClusterError, match="unknown cluster 'slurm'"):
        parse_cluster_spec("slurm")
    assert parse_cluster_spec("local") == ("local", "")
    assert parse_cluster_spec("k8s:deployments/k8s/daskcluster.yaml") == (
        "k8s",
        "deployments/k8s/daskcluster.yaml",
    )
    assert parse_cluster_spec("gateway") == ("gateway", "")
    assert parse_cluster_spec("tls://10.0.0.1:8786") == ("address", "tls://10.0.0.1:8786")
    assert parse_cluster_spec("/tmp/s.json") == ("scheduler-file", "/tmp/s.json")
    with pytest.raises(ClusterError, match="n_workers must be >= 1"):
        with open_cluster("local", n_workers=0):
            pass


# ----------------------------------------------------------------------------------------- cuda


def test_cuda_spec_uses_local_cuda_cluster_or_says_why_not():
    """On a GPU box: one worker per GPU tagged GPU=1, tasks see cuda. Here: a clear UserError."""
    import importlib.util

    import torch

    if torch.cuda.is_available() and importlib.util.find_spec("dask_cuda"):
        with open_cluster("cuda", n_workers=1, dashboard=False) as client:
            assert gpu_resources(client) == {"GPU": 1}
            assert (
                client.submit(device_for_worker, resources={"GPU": 1}, pure=False).result()
                == "cuda"
            )
        return
    with pytest.raises(UserError) as err:
        with open_cluster("cuda", dashboard=False):
            pass
    msg = str(err.value)
    if importlib.util.find_spec("dask_cuda") is None:
        assert "needs the dask_cuda package: pip install 'cryocube[cuda]'" in msg
        assert isinstance(err.value.__cause__, ImportError)
    else:  # dask-cuda installed, no GPU: NVML finds no library/driver/device
        assert "LocalCUDACluster finds no GPU" in msg and "use --cluster local" in msg
        assert err.value.__cause__ is not None and "NVML" in type(err.value.__cause__).__name__


@pytest.mark.parametrize("value", ["", " , ", "-1", "-1,0"])
def test_cuda_refuses_a_visibility_that_hides_every_gpu(monkeypatch, value):
    """dask-cuda counts entries: "" would start one worker on no GPU, "-1" one on device -1."""
    from cryocube.cluster.local import hidden_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    with pytest.raises(UserError, match="hides every GPU: unset it, name GPUs"):
        with open_cluster("cuda", dashboard=False):
            pass
    for shown in ("0", "1,0", "GPU-8d3c", "MIG-1a2b"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", shown)
        assert hidden_gpus() is None


def test_a_backend_package_that_is_installed_but_broken_is_not_called_missing(
    tmp_path, monkeypatch
):
    """dask-cuda against an older cuda-core fails inside its own imports: the message must say
    so."""
    from cryocube.cluster.registry import require

    (tmp_path / "halfcuda").mkdir()
    (tmp_path / "halfcuda" / "__init__.py").write_text("from json import no_such_name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError) as err:
        require("halfcuda", "cuda", "cuda")
    msg = str(err.value)
    assert (
        "halfcuda is installed but does not import" in msg
        and "no_such_name" in msg
        and "needs the" not in msg
    )
    with pytest.raises(
        UserError, match="needs the nosuchpkg package: pip install 'cryocube\\[cuda\\]'"
    ):
        require("nosuchpkg", "cuda", "cuda")


# ------------------------------------------------------------------------------------------ k8s


def test_k8s_spec_requests_gpus_on_workers_only_as_strings():
    spec = k8s_cluster_spec(
        name="cc", image="img:1", n_workers=3, worker_cpu=8, worker_memory="30Gi"
    )
    validate_k8s_manifest(spec, "built")  # the CRD shipped in the dask-kubernetes wheel
    worker = spec["spec"]["worker"]
    res = worker["spec"]["containers"][0]["resources"]
    assert res["limits"]["nvidia.com/gpu"] == "1" and isinstance(res["limits"]["cpu"], str)
    assert worker["replicas"] == 3
    assert "GPU=1" in worker["spec"]["containers"][0]["args"]
    assert {"name": "OMP_NUM_THREADS", "value": "8"} in worker["spec"]["containers"][0]["env"]
    sched = spec["spec"]["scheduler"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in sched["resources"]["limits"]
    assert sched["args"][:2] == ["dask", "scheduler"]
    cpu = k8s_cluster_spec(gpu=False)
    validate_k8s_manifest(cpu, "cpu")
    assert (
        "nvidia.com/gpu"
        not in cpu["spec"]["worker"]["spec"]["containers"][0]["resources"]["limits"]
    )
    assert "GPU=1" not in cpu["spec"]["worker"]["spec"]["containers"][0]["args"]

    spec["spec"]["worker"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 1
    with pytest.raises(ManifestError, match=r"nvidia.com/gpu: 1 is not of type 'string'"):
        validate_k8s_manifest(spec, "built")


def test_k8s_overrides_apply_to_the_manifest(tmp_path):
    # the repo's manifest
    doc = load_k8s_cluster_spec(n_workers=5, threads_per_worker=2, memory_limit="8GB")
    c = doc["spec"]["worker"]["spec"]["containers"][0]
    assert doc["spec"]["worker"]["replicas"] == 5
    assert c["args"][c["args"].index("--nthreads") + 1] == "2"
    assert c["args"][c["args"].index("--memory-limit") + 1] == "8GB"
    bad = tmp_path / "bad.yaml"
    doc["spec"]["worker"]["replicas"] = "two"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(
        ManifestError, match=r"(?s)bad.yaml: DaskCluster 'cryocube'.*spec.worker.replicas: 'two'"
    ):
        load_k8s_cluster_spec(bad)


def test_k8s_backend_reaches_kubecluster_and_explains_missing_cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(
        ClusterError, match="(?s)cannot create DaskCluster 'cryocube'.*needs a kubeconfig"
    ):
        with open_cluster("k8s", dashboard=False):
            pass


# -------------------------------------------------------------------------------------- gateway


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="module")
def gateway_server(tmp_path_factory):
    """A real dask-gateway-server (UnsafeLocalBackend, SimpleAuthenticator) on loopback."""
    d = tmp_path_factory.mktemp("gateway")
    port = _free_port()
    (d / "config.py").write_text(
        textwrap.dedent(f"""
        import sys
        from dask_gateway_server.options import Float, Integer, Options

        c.DaskGateway.backend_class = "dask_gateway_server.backends.local.UnsafeLocalBackend"
        c.DaskGateway.authenticator_class = "dask_gateway_server.auth.SimpleAuthenticator"
        c.DaskGateway.log_level = "WARN"
        c.SimpleAuthenticator.password = "cryo"
        c.Proxy.address = "127.0.0.1:{port}"
        c.LocalBackend.clusters_directory = {str(d / "clusters")!r}
        # distributed no longer installs dask-scheduler/dask-worker scripts
        c.ClusterConfig.scheduler_cmd = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
        c.ClusterConfig.worker_cmd = [sys.executable, "-m", "distributed.cli.dask_worker"]
        c.ClusterConfig.scheduler_memory = "1 G"
        c.LocalBackend.sigint_timeout = 1  # stop test clusters quickly
        c.LocalBackend.sigterm_timeout = 1

        def handler(options):
            return {{"worker_cores": options.worker_cores,
                    "worker_memory": int(options.worker_memory * 2**30)}}

        c.Backend.cluster_options = Options(
            Integer("worker_cores", default=1, min=1, max=2),
            Float("worker_memory", default=1, min=0.25, max=2),
            handler=handler,
        )
    """)
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "dask_gateway_server", "-f", str(d / "config.py")],
        cwd=d,
        stdout=open(d / "server.log", "w"),
        stderr=subprocess.STDOUT,
    )
    address = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{address}/api/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (
                d / "server.log"
            ).read_text()
            time.sleep(0.3)
        yield {
            "address": address,
            "auth": {"type": "basic", "username": "tester", "password": "cryo"},
        }
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _live_gateway_clusters(address: str) -> list[str]:
    """Names of the test user's pending/running clusters, from the gateway's REST API."""
    req = urllib.request.Request(
        f"{address}/api/v1/clusters/?status=PENDING,RUNNING",
        headers={"Authorization": "Basic " + base64.b64encode(b"tester:cryo").decode()},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return list(json.loads(r.read()))


def test_gateway_cluster_from_options_file_runs_tasks_and_shuts_down(gateway_server, tmp_path):
    opts = tmp_path / "gateway-options.yaml"
    opts.write_text(
        yaml.safe_dump(
            {
                **gateway_server,
                "cluster_options": {"worker_cores": 1, "worker_memory": 1},
                "workers": 1,
                "worker_timeout": 120,
            }
        )
    )
    with open_cluster(f"gateway:{opts}", dashboard=False) as client:
        info = cluster_info(client)
        assert info["n_workers"] == 1 and info["memory"] == 2**30  # the option reached the worker
        assert gpu_resources(client) is None
        assert client.submit(device_for_worker, pure=False).result(timeout=60) == "cpu"
        import torch
        from dask.system import CPU_COUNT

        # the gateway's nanny starts workers with OMP_NUM_THREADS=1; the plugin gave torch the CPU
        # share
        assert client.submit(torch.get_num_threads, pure=False).result(timeout=60) == CPU_COUNT
        assert get_client() is client
        assert len(_live_gateway_clusters(gateway_server["address"])) == 1
    assert _live_gateway_clusters(gateway_server["address"]) == []


def test_gateway_rejects_bad_options_before_creating_a_cluster(gateway_server):
    with pytest.raises(
        ClusterError, match="worker_cores=9 rejected.*offers: worker_cores, worker_memory"
    ):
        with open_cluster(
            "gateway", gateway_options={**gateway_server, "cluster_options": {"worker_cores": 9}}
        ):
            pass
    with pytest.raises(ClusterError, match="worker_gpus=1 rejected"):
        with open_cluster(
            "gateway", gateway_options={**gateway_server, "cluster_options": {"worker_gpus": 1}}
        ):
            pass
    with pytest.raises(ClusterError, match="unknown gateway keys \\['image'\\]"):
        with open_cluster("gateway", gateway_options={**gateway_server, "image": "x"}):
            pass
    with pytest.raises(ClusterError, match="cannot reach the gateway"):
        with open_cluster(
            "gateway", gateway_options={"address": f"http://127.0.0.1:{_free_port()}"}
        ):
            pass
