"""Every recipe field of every family does something or says why not: changed alone, a field either
moves the run id and reaches the planned run's work (what the workers are handed), or its recipe
class declares it outside the identity with the reason (`EXECUTION_FIELDS`), and then the run id
stays. follow_reference is the exception both ways: where no encoder is built (vqa) it is refused in
one sentence (tests/test_identity.py follows it through every family and `cryocube embed`)."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pytest
from test_run_ids import SETS  # the fast recipe with fixed precision and threads

from cryocube.cube import cube_info
from cryocube.engine.plan import plan_runs
from cryocube.errors import RecipeError
from cryocube.families import BUILTIN, PlanContext, RunSpec, get
from cryocube.families.recipes import load_recipe
from cryocube.precision import DeviceInfo

RUNS = {  # family -> (protocol, model) of the run whose fields are changed one at a time
    "segmentation": ("frozen", "ssl4eo_dino"),
    "embedding": ("probe", "ssl4eo_dino"),
    "heads": ("heads", "ssl4eo_dino"),
    "vqa": ("vqa", "transformers"),
}
# another valid value of each field (a function of the default run where it depends on the cube)
CHANGED = {
    "precision": "bf16",
    "normalization": "published",
    "input_size": 16,
    "block_samples": 2,
    "threads": 2,
    "extract_batch": 3,
    "encoder_weights": {"another_model": "/nowhere/ckpt.pt"},  # not this run's model
    "follow_reference": True,
    "epochs": 3,
    "lr": 0.5,
    "weight_decay": 0.25,
    "betas": (0.5, 0.75),
    "batch_size": 2,
    "milestones": (0.5,),
    "gamma": 0.5,
    "val_every": 2,
    "decoder": "linear",
    "decoder_channels": 8,
    "few_shot_bins": 5,
    "crops_per_sample": 3,
    "feature_dtype": "float32",
    "memory_format": "contiguous",
    "max_val_samples": 1,
    "cache_in_memory_mb": 1.0,
    "decoders_per_task": 2,
    "gen_batch": 2,
    "max_new_tokens": 1,
    "blind": True,
    "vqa_tasks": lambda run: sorted(run.work["tasks"])[0],  # one of the tasks asked
}
# planned as for a GPU: there the threads change no bits (on CPU they do: the last test)
GPU = DeviceInfo("cuda", "test", (9, 0))
CASES = [
    (family, f.name) for family in sorted(RUNS) for f in dataclasses.fields(get(family).recipe)
]


@pytest.fixture(scope="module")
def cube(tile_cube):
    url = tile_cube("glid", train=8, val=2, test=3, seed=7)
    return url, cube_info(url)


def _plan(family, cube, tmp_path, values=None, device=GPU):
    url, info = cube
    protocol, model = RUNS[family]
    ctx = PlanContext(out=str(tmp_path), allow_random_weights=True, device=device)
    recipe = load_recipe(None, SETS)
    if values:
        recipe = recipe.replace(**values)
    (run,) = plan_runs([RunSpec(model, url, protocol)], recipe, ctx, {url: info})
    return run


def _digest(x, h=None):
    """A digest of everything a planned run's work holds (dataclasses, mappings, arrays, values):
    two works that differ anywhere digest apart."""
    h = h or hashlib.sha256()
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        for f in dataclasses.fields(x):
            h.update(f.name.encode())
            _digest(getattr(x, f.name), h)
    elif isinstance(x, dict):
        for k in sorted(x, key=str):
            h.update(str(k).encode())
            _digest(x[k], h)
    elif isinstance(x, (list, tuple, set, frozenset)):
        for v in sorted(x, key=repr) if isinstance(x, (set, frozenset)) else x:
            _digest(v, h)
    elif isinstance(x, np.ndarray):
        h.update(x.tobytes())
    else:
        h.update(repr(x).encode())
    return h.hexdigest()


def test_every_family_and_every_field_is_a_case():
    assert {m.rsplit(".", 1)[1] for m in BUILTIN} == set(RUNS)
    assert {name for _, name in CASES} <= set(CHANGED), "a new recipe field needs a changed value"


@pytest.mark.parametrize(("family", "name"), CASES)
def test_a_field_reaches_the_run_id_and_the_work_or_says_why_not(family, name, cube, tmp_path):
    base = _plan(family, cube, tmp_path)
    value = CHANGED[name](base) if callable(CHANGED[name]) else CHANGED[name]
    assert getattr(load_recipe(None, SETS), name) != value, "the change changes nothing"
    if name == "follow_reference" and family == "vqa":
        with pytest.raises(RecipeError, match="nothing to follow") as e:
            _plan(family, cube, tmp_path, {name: value})
        assert "\n" not in str(e.value)
        return
    run = _plan(family, cube, tmp_path, {name: value})
    declared = get(family).recipe.EXECUTION_FIELDS
    if name in declared:
        assert declared[name].strip(), f"{family}.{name}: declared without a reason"
        assert run.run_id == base.run_id, f"{family}.{name}: declared outside the identity"
    else:
        assert run.run_id != base.run_id, f"{family}.{name}: in no run id, declared nowhere"
        assert _digest(run.work) != _digest(base.work), f"{family}.{name}: reaches no work"


@pytest.mark.parametrize("family", sorted(RUNS))
def test_threads_are_in_the_run_id_where_they_change_the_bits(family, cube, tmp_path):
    cpu = DeviceInfo("cpu", "test")
    one = _plan(family, cube, tmp_path, device=cpu)
    two = _plan(family, cube, tmp_path, {"threads": 2}, device=cpu)
    assert one.run_id != two.run_id and _digest(one.work) != _digest(two.work)
