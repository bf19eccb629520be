"""Run ids are content hashes of a run's identity, so renaming a word in the code must not move
them: these ids were written down before the encoder "family" became its "architecture" (issue 29,
item 5) and must stay as they are through any rename. The identity's "family" key is the EVALUATION
family (segmentation, embedding) and keeps its name; the encoder's architecture name never entered
an identity (its arguments do, under "arch"). A changed id here means every existing run of that
kind would be run again."""

from __future__ import annotations

import pytest

from cryocube.cube import cube_info
from cryocube.engine.plan import plan_runs
from cryocube.families import PlanContext, RunSpec
from cryocube.families.recipes import load_recipe

# fixed precision and threads: the ids then do not depend on the machine that plans them
SETS = [
    "epochs=2",
    "decoder_channels=16",
    "input_size=32",
    "val_every=1",
    "crops_per_sample=2",
    "batch_size=4",
    "normalization=cube",
    "precision=fp32",
    "threads=1",
]
CHECKSUM = "2619cdd2e0b2d9a822fbd4a39397d59546606c30f6e0b1a80e22790c8a06ba0f"
PINNED = {  # (model, protocol) -> run id, from plan_runs before the rename
    ("ssl4eo_moco", "frozen"): "64281d1f5de9464d2189",
    ("unet", "frozen"): "5bc87e713a7433eacdba",
    ("dofa", "finetune"): "ed3f09161636d60950b4",
    ("gfmswin", "fewshot"): "05d911720f42922f2c8d",
    ("croma_optical", "frozen"): "fd727bebef779b06cbc8",
    ("ssl4eo_dino", "probe"): "5ef77c77044c8137321d",
    ("prithvi", "probe"): "c61ba6abdf051518e987",
    ("ssl4eo_moco", "heads"): "95c127fca668fc40eba0",
}
IDENTITY_KEYS = {  # evaluation family -> the names an identity holds (a renamed key moves every id)
    "segmentation": [
        "arch",
        "band_rule",
        "cube",
        "family",
        "fraction",
        "input_size",
        "model",
        "precision",
        "protocol",
        "recipe",
        "seed",
        "threads",
        "v",
        "weights",
    ],
    "embedding": ["embedding", "family", "probe", "seed", "tasks", "v"],
    "heads": ["embedding", "family", "grid", "seed", "split", "tasks", "v"],
}


@pytest.fixture(scope="module")
def cube(tile_cube):
    return tile_cube("glid", train=8, val=2, test=3, seed=7)


def test_run_ids_of_existing_runs_do_not_change(cube, tmp_path):
    info = cube_info(cube)
    assert info.checksum == CHECKSUM, (
        "the synthetic cube's bits changed (generator or converter), not a rename"
    )
    ctx = PlanContext(
        out=str(tmp_path / "out"),
        weights_dir=str(tmp_path / "no-weights"),
        allow_random_weights=True,
    )
    got = {}
    for model, protocol in PINNED:
        (p,) = plan_runs(
            [RunSpec(model, cube, protocol)], load_recipe(None, SETS), ctx, {cube: info}
        )
        got[model, protocol] = p.run_id
        assert sorted(p.identity) == IDENTITY_KEYS[p.family], (model, protocol, sorted(p.identity))
        assert "architecture" not in p.identity and p.identity["family"] == p.family
    assert got == PINNED
