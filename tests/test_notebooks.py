"""The notebooks run top to bottom in a real Jupyter kernel (nbclient): the hub notebook against a
real dask-gateway-server on loopback with its cubes and results on moto's S3 server, the laptop
notebook on a LocalCluster. Parameters go into the in-memory copy as a cell after the one tagged
`parameters` (what papermill does); the hub's gateway address and auth come from dask config in the
kernel's environment, as a hub sets them. The code that runs is the repository's, unchanged, and
the results each notebook ends with are the report's numbers.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from pathlib import Path

import pytest
from test_cluster import _live_gateway_clusters, gateway_server  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parents[1]
HUB = ROOT / "deployments" / "pangeo" / "cryocube-gateway.ipynb"
LAPTOP = ROOT / "deployments" / "laptop" / "cryocube-quickstart.ipynb"
NOTEBOOKS = [HUB, LAPTOP]


def _read(path: Path):
    import nbformat

    return nbformat.read(path, as_version=4)


def _with_parameters(nb, params: dict):
    """A copy with `params` assigned in a cell right after the one tagged `parameters`."""
    import nbformat

    nb = copy.deepcopy(nb)
    (i,) = [k for k, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    src = "\n".join(f"{k} = {v!r}" for k, v in params.items())
    injected = nbformat.v4.new_code_cell(src, metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(i + 1, injected)
    return nb


def _execute(nb, cwd: Path, env: dict[str, str]):
    from nbclient import NotebookClient

    env = {k: v for k, v in {**os.environ, **env}.items() if k != "MPLBACKEND"}  # inline plots
    client = NotebookClient(
        nb, timeout=420, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    )
    client.execute(env=env)
    return nb


def _texts(cell) -> list[str]:
    """Every text a code cell showed: streams, and the plain text of its displays (final state)."""
    out = []
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream":
            out.append(o["text"])
        elif "data" in o:
            out.append(o["data"].get("text/plain", ""))
    return out


def _code_of(nb) -> list[str]:
    return [
        c.source
        for c in nb.cells
        if c.cell_type == "code" and "injected-parameters" not in c.metadata.get("tags", [])
    ]


def _check_progress_and_plot(nb, min_bars: int) -> None:
    """evaluate's cell: the dashboard link once, a bar and a run table that end complete (updated in
    place: one output each), no timestamped log lines; the last cells: a table and one plot."""
    texts = [t for c in nb.cells if c.cell_type == "code" for t in _texts(c)]
    assert sum(t.count("Dask dashboard: http") for t in texts) == 1, texts
    (ev,) = [c for c in nb.cells if c.cell_type == "code" and "evaluate(" in c.source]
    board = [t for t in _texts(ev) if t.startswith("train + test:")]
    assert len(board) == 1 and "runs finished" in board[0], _texts(ev)
    n = board[0].split("train + test: ", 1)[1].split(" runs finished")[0]
    done, total = map(int, n.split("/"))
    assert done == total > 0, board[0]
    assert all(line.split()[-1] == "done" for line in board[0].splitlines()[2:]), board[0]
    # each bar is one display, shown in its final state; no plain mode's timestamped lines
    bars = [t for t in texts if re.match(r"[^\n]+: \d+% \(", t)]
    assert len(bars) >= min_bars and all(": 100% (" in t for t in bars), bars
    assert not any(re.match(r"\[\d\d:\d\d:\d\d\] ", t) for t in texts), texts
    plots = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if "image/png" in o.get("data", {})
    ]
    assert len(plots) == 1
    (table,) = [c for c in nb.cells if c.cell_type == "code" and "open_results(" in c.source]
    assert "text/html" in table.outputs[-1]["data"]  # a DataFrame shown as a table


def _equal_to_the_report(ds, board: dict, protocol: str) -> int:
    mean = ds["mIoU"].mean("seed")
    n = 0
    for row in board["rows"]:
        for col, want in row.items():
            if col in ds["dataset"].values and want is not None:
                got = float(mean.sel(model=row["model"], dataset=col, protocol=protocol))
                assert got == pytest.approx(want, abs=1e-9), (row["model"], col)
                n += 1
    return n


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_are_stored_clean(path):
    """No outputs or execution counts in the repository: what runs is the code, not old results."""
    nb = json.loads(path.read_text())
    assert nb["nbformat"] == 4 and nb["metadata"]["kernelspec"]["name"] == "python3"
    for c in nb["cells"]:
        if c["cell_type"] == "code":
            assert c["outputs"] == [] and c["execution_count"] is None, c["id"]
    tagged = [c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", [])]
    assert len(tagged) == 1 and tagged[0]["cell_type"] == "code"


@pytest.mark.slow
def test_hub_notebook_runs_on_a_real_gateway_with_cubes_on_s3(
    gateway_server,  # noqa: F811
    s3_bucket,
    tile_cube,
    tmp_path,
):
    import s3fs

    from cryocube import open_results
    from cryocube.pages import build_report

    bucket, opts = s3_bucket
    cube = tile_cube("glid", train=8, val=2, test=2, seed=13)
    s3fs.S3FileSystem(**opts).put(cube, f"{bucket}/cubes/glid.zarr", recursive=True)
    before = HUB.read_bytes()
    nb = _with_parameters(
        _read(HUB),
        {
            "DATA_ROOT": f"s3://{bucket}/cubes",
            "OUT": f"s3://{bucket}/results",
            "WEIGHTS_DIR": None,
            "CUBES": ["glid.zarr"],
            "MODELS": ["unet"],
            "EPOCHS": 1,
            "RECIPE_OVERRIDES": ["input_size=64", "batch_size=8", "decoder_channels=64"],
            "STORAGE_OPTIONS": opts,
            "WORKER_CORES": 1,
            "WORKER_MEMORY": 2,
            "MAX_WORKERS": 1,
        },
    )
    auth = gateway_server["auth"]
    env = {  # what a hub's image sets: dask config of the gateway, no code
        "DASK_GATEWAY__ADDRESS": gateway_server["address"],
        "DASK_GATEWAY__AUTH__TYPE": auth["type"],
        "DASK_GATEWAY__AUTH__KWARGS__USERNAME": auth["username"],
        "DASK_GATEWAY__AUTH__KWARGS__PASSWORD": auth["password"],
    }
    done = _execute(nb, tmp_path, env)
    assert HUB.read_bytes() == before
    assert _code_of(done) == _code_of(_read(HUB))  # the repository's code, unchanged
    _check_progress_and_plot(done, min_bars=0)  # the cubes exist: no convert
    # the notebook shut its cluster down
    assert _live_gateway_clusters(gateway_server["address"]) == []

    out = f"s3://{bucket}/results"
    df = open_results(out, storage_options=opts)
    assert len(df) == 1 and df["status"].tolist() == ["ok"] and df["model"].tolist() == ["unet"]
    rep = build_report([out], tmp_path / "report", formats=["json"])
    assert rep.tables
    board = json.loads((tmp_path / "report" / "frozen" / "leaderboard.json").read_text())
    assert _equal_to_the_report(df.cryocube.to_xarray(), board, "frozen") == 1


@pytest.mark.slow
def test_laptop_notebook_runs_the_quickstart_on_a_local_cluster(tmp_path):
    from cryocube import open_results

    work = tmp_path / "qs"
    nb = _with_parameters(
        _read(LAPTOP),
        {
            "WORKDIR": str(work),
            "DATASETS": ["glid"],
            "MODELS": ["unet", "vit_scratch"],
            "EPOCHS": 1,
        },
    )
    done = _execute(nb, tmp_path, {})
    assert _code_of(done) == _code_of(_read(LAPTOP))
    _check_progress_and_plot(done, min_bars=1)  # convert's

    df = open_results(work / "results")
    assert len(df) == 2 and (df["status"] == "ok").all()
    assert set(df["model"]) == {"unet", "vit_scratch"}
    ds = df.cryocube.to_xarray()
    assert all(math.isfinite(v) for v in ds["mIoU"].values.ravel())
    # the report the notebook built holds the same numbers
    board = json.loads((work / "report" / "frozen" / "leaderboard.json").read_text())
    assert _equal_to_the_report(ds, board, "frozen") == 2


def test_outside_a_kernel_progress_keeps_its_terminal_and_log_modes(capsys):
    """Only a Jupyter kernel gets the in-place displays: this process (pytest, stderr captured) is
    no kernel, so a bar prints the piped mode's lines and no dashboard link."""
    from cryocube import progress

    assert not progress.in_notebook()
    assert progress.mode() == "plain" and progress.mode(False) == "quiet"
    with progress.progress_bar("phase", 4) as bar:
        for _ in range(4):
            bar.advance()
    err = capsys.readouterr().err
    assert "phase: started (4)" in err and "phase: 100% (4/4)" in err
