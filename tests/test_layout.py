"""The house keeps its walls: no import cycles, no import up the layers docs/architecture.md writes,
new datasets and ViT models are one YAML each, and a family from another package is one folder and
its entry points.
"""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "cryocube"


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> modules it imports, from every import statement (function-level ones too).

    Importing `a.b.c` also runs the `__init__` of `a.b`: that edge counts when the importer lives
    outside `a.b` (inside, the package is already being initialised)."""
    mods = {}
    for p in (root / "cryocube").rglob("*.py"):
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        package = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                if t not in mods:
                    continue
                parts = t.split(".")
                for k in range(1, len(parts) + 1):
                    anc = ".".join(parts[:k])
                    if anc in mods and anc != m and not (m == anc or m.startswith(anc + ".")):
                        graph[m].add(anc)
                if t != m:
                    graph[m].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 60 and "cryocube.families.segmentation.train" in graph
    assert cycles(graph) == []


def layers(doc: Path = ROOT / "docs" / "architecture.md") -> dict[str, int]:
    """The layer order docs/architecture.md writes (its ```layers block): module prefix -> layer
    number."""
    block = re.search(r"```layers\n(.*?)```", doc.read_text(), re.S)
    assert block, f"{doc}: no ```layers block"
    out: dict[str, int] = {}
    for line in block.group(1).splitlines():
        head, _, names = line.partition(":")
        for name in names.split():
            full = "cryocube" if name == "cryocube" else f"cryocube.{name}"
            assert full not in out, f"{doc}: {name} is in two layers"
            out[full] = int(head.split()[0])
    return out


def layer_of(module: str, order: dict[str, int]) -> int | None:
    """The layer of the longest listed prefix (`cryocube` alone only for the package's own
    __init__)."""
    best = max(
        (p for p in order if module == p or (p != "cryocube" and module.startswith(p + "."))),
        key=len,
        default=None,
    )
    return None if best is None else order[best]


def upward_imports(graph: dict[str, set[str]], order: dict[str, int]) -> list[tuple[str, str]]:
    return sorted(
        (m, d)
        for m, deps in graph.items()
        for d in deps
        if layer_of(d, order) is not None
        and layer_of(m, order) is not None
        and layer_of(d, order) > layer_of(m, order)
    )


def test_no_module_imports_up_the_layers_the_architecture_doc_writes():
    graph, order = import_graph(), layers()
    assert (
        order["cryocube.record"]
        == 1
        < order["cryocube.families"]
        < order["cryocube.engine"]
        < order["cryocube.cli"]
    )
    # every module has its layer in the doc
    assert [m for m in graph if layer_of(m, order) is None] == []
    assert upward_imports(graph, order) == []


def test_a_planted_upward_import_is_found(tmp_path):
    """The same check on a copy of the package with two imports planted up the layers: one at module
    level in the record (bottom layer), one inside a function of the families' base (below the
    engine)."""
    import shutil

    shutil.copytree(
        PKG, tmp_path / "cryocube", ignore=shutil.ignore_patterns("__pycache__", "data")
    )
    rec = tmp_path / "cryocube" / "record.py"
    rec.write_text(rec.read_text() + "\nfrom .engine.records import write_parquet\n")
    base = tmp_path / "cryocube" / "families" / "base.py"
    base.write_text(
        base.read_text() + "\n\ndef _report():\n    from ..pages.build import build_report\n"
    )
    assert upward_imports(import_graph(tmp_path), layers()) == [
        ("cryocube.families.base", "cryocube.pages"),
        ("cryocube.families.base", "cryocube.pages.build"),
        ("cryocube.record", "cryocube.engine"),
        ("cryocube.record", "cryocube.engine.records"),
    ]
    assert upward_imports(import_graph(), layers()) == []  # (the original is untouched)


def test_the_report_names_no_family():
    """The report (its parts in report/, its pages in pages/) reaches families only through the
    registry (`names`, `get(...).report_sections`): no report module imports a family's package, and
    none spells a family's name. The parts import nothing of the families at all (a layer below)."""
    from cryocube.families import names

    graph = import_graph()
    parts = [m for m in graph if m.startswith("cryocube.report")]
    pages = [m for m in graph if m.startswith("cryocube.pages")]
    assert len(parts) >= 10 and len(pages) >= 5
    for m in parts + pages:
        assert not {d for d in graph[m] if d.startswith("cryocube.families.")}, (m, graph[m])
    for m in parts:
        assert not {d for d in graph[m] if d.startswith(("cryocube.families", "cryocube.pages"))}
    fams = set(names())
    assert {"segmentation", "embedding", "vqa", "heads"} <= fams
    for p in [*(PKG / "report").glob("*.py"), *(PKG / "pages").glob("*.py")]:
        consts = {
            n.value for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Constant)
        }
        assert not consts & fams, (p.name, consts & fams)


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_convert_does_not_depend_on_the_engine():
    graph = import_graph()
    for m, deps in graph.items():
        if m.startswith("cryocube.convert"):
            assert not any(d.startswith(("cryocube.engine", "cryocube.families")) for d in deps), (
                m,
                deps,
            )


def test_the_engine_knows_no_family():
    """engine/ reaches families only through the registry, the Family contract and the shared
    recipe, so a new family is a package in families/ and nothing in the engine changes."""
    graph = import_graph()
    shared = {"cryocube.families", "cryocube.families.base", "cryocube.families.recipes"}
    families = {m for m in graph if m.startswith("cryocube.families.")} - shared
    engine = [m for m in graph if m.startswith("cryocube.engine")]
    assert len(engine) >= 5 and families >= {
        "cryocube.families.segmentation.recipe",
        "cryocube.families.embedding",
    }
    for m in engine:
        assert not graph[m] & families, (m, sorted(graph[m] & families))
    for m in shared:  # nor does what the engine reads of families
        assert not graph[m] & families, (m, sorted(graph[m] & families))


def test_families_are_siblings():
    """No family package imports another (function-level imports included): what two families
    share is a service below them (`questions/`, `embeddings/`, `families/base|encoders|split`),
    so a family can be read, changed or removed on its own."""
    from cryocube.families import FAMILIES

    graph = import_graph()
    packages = {f"cryocube.families.{n}" for n in ("segmentation", "embedding", "vqa", "heads")}
    assert packages <= {m for m in graph if m.count(".") == 2}
    assert set(FAMILIES) >= {p.rsplit(".", 1)[1] for p in packages}

    def family(m):
        return next((p for p in packages if m == p or m.startswith(p + ".")), None)

    crossing = sorted(
        (m, d)
        for m, deps in graph.items()
        for d in deps
        if family(m) and family(d) and family(m) != family(d)
    )
    assert crossing == [], crossing


def test_every_module_a_family_warms_exists():
    """A local cluster's workers import each family's `warm_modules` while the client plans: a name
    left behind by a move would fail the run on its first worker, not here."""
    import importlib

    from cryocube.families import get, names

    modules = [m for n in names() for m in get(n).warm_modules]
    assert len(modules) >= 8
    for m in modules:
        importlib.import_module(m)


def test_each_family_declares_its_recipe():
    """Shared fields once (cryocube/recipe.py), each family's own on its recipe class; a field no
    family declares is refused, and each family's part holds only its fields."""
    from cryocube.families import get, names
    from cryocube.families.recipes import load_recipe
    from cryocube.recipe import BaseRecipe, RecipeError

    shared = set(BaseRecipe.field_names())
    assert {"precision", "threads", "block_samples", "encoder_weights"} <= shared
    for n in names():
        assert issubclass(get(n).recipe, BaseRecipe) and shared <= set(get(n).recipe.field_names())
    r = load_recipe(None, ["epochs=3", "threads=2"])
    seg, emb = r.of("segmentation"), r.of("embedding")
    assert seg.epochs == 3 and r.epochs == 3 and seg.threads == emb.threads == 2
    assert not hasattr(emb, "epochs") and set(emb.as_dict()) == shared
    with pytest.raises(RecipeError, match="epochs: not used by the embedding family"):
        load_recipe(None, ["epochs=3"], families=("embedding",))
    with pytest.raises(RecipeError, match="unknown recipe fields"):
        load_recipe(None, ["no_such_field=3"], families=("embedding",))


@pytest.fixture()
def lab_catalog(tmp_path, monkeypatch):
    """A lab's own catalog folder, searched before the shipped catalogs."""
    root = tmp_path / "labcat"
    (root / "datasets").mkdir(parents=True)
    (root / "models").mkdir()
    monkeypatch.setenv("CRYOCUBE_CATALOGS", str(root))
    return root


def test_a_dataset_on_a_known_layout_is_one_yaml(lab_catalog, tmp_path, client):
    from cryocube.catalog import dataset_ids, load_dataset
    from cryocube.cli import main
    from cryocube.cube import open_cube
    from cryocube.synthetic import make_raw

    d = yaml.safe_load((ROOT / "catalogs/datasets/glid.yaml").read_text())
    d.update(id="mylakes", name="My lakes", short_name="MYL")
    (lab_catalog / "datasets" / "mylakes.yaml").write_text(yaml.safe_dump(d))
    assert "mylakes" in dataset_ids() and load_dataset("mylakes").short_name == "MYL"
    m = make_raw("glid", tmp_path / "raw", n={"train": 3, "val": 1, "test": 1}, seed=2)
    out = tmp_path / "mylakes.zarr"
    assert (
        main(
            [
                "convert",
                "mylakes",
                "--raw",
                str(tmp_path / "raw"),
                "--out",
                str(out),
                "--tile",
                str(m.tile_size),
                "--cluster",
                client.scheduler.address,
                "--quiet",
            ]
        )
        == 0
    )
    ds = open_cube(str(out))
    assert ds.attrs["dataset"] == "mylakes" and ds.sizes["sample"] == 5
    np.testing.assert_array_equal(ds["image"].values[0], m.items[0].image)


def test_a_vit_model_is_one_yaml(lab_catalog, tmp_path, client):
    from cryocube.convert.writer import convert
    from cryocube.engine.evaluate import evaluate
    from cryocube.families import RunSpec
    from cryocube.families.recipes import load_recipe
    from cryocube.models import build_encoder, list_models
    from cryocube.synthetic import make_raw

    d = yaml.safe_load((ROOT / "catalogs/models/ssl4eo_moco.yaml").read_text())
    d.update(id="tiny_vit", display_name="Tiny ViT", output_channels=[192] * 4)
    d["arch"].update(embed_dim=192, num_heads=3)
    (lab_catalog / "models" / "tiny_vit.yaml").write_text(yaml.safe_dump(d))
    assert "tiny_vit" in list_models()
    enc = build_encoder("tiny_vit", in_chans=13, input_size=32)
    assert enc.vit.embed_dim == 192 and enc.vit.blocks[0].attn.num_heads == 3
    m = make_raw("glid", tmp_path / "raw", n={"train": 4, "val": 2, "test": 2}, seed=3)
    cube = str(tmp_path / "glid.zarr")
    convert(
        "glid", str(tmp_path / "raw"), cube, client=client, tile_size=m.tile_size, progress=False
    )
    cfg = load_recipe(
        None,
        ["epochs=1", "decoder_channels=16", "input_size=32", "crops_per_sample=1", "batch_size=2"],
    )
    # the workers never saw the lab's catalog folder: the model's spec travels with the tasks
    res = evaluate(
        [RunSpec("tiny_vit", cube, "frozen")],
        str(tmp_path / "out"),
        cfg,
        client=client,
        progress=False,
        allow_random_weights=True,
    )
    (rec,) = res.records
    assert rec["status"] == "ok", rec.get("error")
    assert rec["model_name"] == "Tiny ViT" and rec["params"]["encoder"] == sum(
        p.numel() for p in enc.parameters()
    )


def test_every_registry_entry_is_listed():
    """`cryocube list` shows every dataset, model, protocol, reader and family from the
    registries."""
    from cryocube.cli import main

    for what in ("datasets", "models", "protocols", "readers", "families", "benchmarks"):
        assert main(["list", what]) == 0


# a distribution: the package and its dist-info (entry points)
TOY = Path(__file__).parent / "data" / "toyfam"


def test_a_family_from_another_package_is_planned_run_and_reported(tmp_path, client):
    """A toy family installed through real entry points only (`cryocube.families` for its module,
    `cryocube.catalogs` for its protocol): `list` shows it, `evaluate --protocol brightness` plans
    and runs it on worker processes that import it from the same path, and `report` carries its own
    section. Nothing in cryocube names it: the distribution's folder is all it took."""
    import shutil
    import subprocess
    import sys

    from cryocube.convert.writer import convert
    from cryocube.cube import as_text, open_cube
    from cryocube.synthetic import make_raw

    assert sorted(p.name for p in TOY.iterdir() if p.name != "__pycache__") == [
        "toyfam",
        "toyfam-0.1.dist-info",
    ]
    for p in (
        list(PKG.rglob("*.py"))
        + list((ROOT / "catalogs").rglob("*.yaml"))
        + [ROOT / "pyproject.toml"]
    ):
        assert "toyfam" not in p.read_text(), p
    site = tmp_path / "site"
    shutil.copytree(TOY, site, ignore=shutil.ignore_patterns("__pycache__"))
    m = make_raw("glid", tmp_path / "raw", n={"train": 3, "val": 1, "test": 6}, seed=5)
    cube = str(tmp_path / "glid.zarr")
    convert(
        "glid", str(tmp_path / "raw"), cube, client=client, tile_size=m.tile_size, progress=False
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "PYTHONWARNINGS": "ignore",
    }

    def cli(*args):
        p = subprocess.run(
            [sys.executable, "-m", "cryocube.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        assert p.returncode == 0, p.stderr
        return p.stdout

    assert re.search(r"^toyfam\s+brightness$", cli("list", "families"), re.M)
    assert re.search(r"^brightness\s+toyfam\s", cli("list", "protocols"), re.M)
    out = tmp_path / "out"
    grid = [
        "--cubes",
        cube,
        "--models",
        "mean",
        "--protocol",
        "brightness",
        "--out",
        str(out),
        "--quiet",
    ]
    assert "mean/glid.zarr/brightness/seed0" in cli("evaluate", *grid, "--dry-run")  # planned
    # run, on a local cluster of its own
    cli("evaluate", *grid, "--workers", "1", "--threads-per-worker", "1")
    (rec,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    ds = open_cube(cube)
    test = np.flatnonzero(as_text(ds["split"].values) == "test")
    x = np.asarray(ds["image"].values[test], dtype=np.float64)
    assert rec["family"] == "toyfam" and rec["status"] == "ok" and rec["record_version"] == 2
    assert (
        rec["metrics"]["brightness"] == pytest.approx(x.mean(), rel=1e-12)
        and rec["metrics"]["blocks"] == 2
    )
    cli("report", str(out), "--out", str(tmp_path / "report"), "--format", "md")
    md = (tmp_path / "report" / "report.md").read_text()
    assert (
        "## Toy family: test-split brightness" in md
        and f"| toy mean | glid | {x.mean():.4f} | {x.size} |" in md
    )
    # and the board the report lays out from the cell it contributed
    assert "## toyfam on glid" in md and "| Model | brightness mean (DN) |" in md
    assert f"| toy mean | {x.mean():.2f} n={x.size} |" in md


def test_every_file_and_name_the_architecture_doc_points_to_exists():
    """The map stays true: each `path.py` or `path.py:Name` docs/architecture.md cites is a file
    of the repo (under cryocube/ or from the root; a bare file name, as a table row cites its
    package's modules, anywhere under cryocube/), and the name is defined there."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    cited = set(re.findall(r"`([\w/]+\.py)(?::(\w+))?`", text))
    assert len(cited) > 15, cited
    missing = []
    for path, name in sorted(cited):
        files = [p for p in (ROOT / path, ROOT / "cryocube" / path) if p.is_file()]
        if "/" not in path:
            files += list(PKG.rglob(path))
        if not files:
            missing.append(path)
        elif name and not any(
            re.search(rf"^\s*(class|def)\s+{name}\b|^{name}\s*[:=]", f.read_text(), re.M)
            for f in files
        ):
            missing.append(f"{path}:{name}")
    assert not missing, f"docs/architecture.md cites what is not there: {missing}"
