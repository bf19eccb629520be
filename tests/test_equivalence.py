"""Every encoder equals the Cryo-Bench reference's own encoder, from stored reference features.

tools/verify_encoders.py ran the reference (github Sk-2103/Cryo-Bench at the commit in the manifest)
on a checkpoint in the published layout and stored its features (a seeded sample of values and the
per-channel means of every level) under tests/data/equivalence/. Here cryocube alone regenerates the
same seeded state dict, checkpoint file and input at the published model size, loads the file
through the catalog's key map and must give the reference's features.
"""

from __future__ import annotations

import importlib.util
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from cryocube.models import list_models, model_spec

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "equivalence"
MANIFEST = json.loads((DATA / "manifest.json").read_text())
ATOL, RTOL = 5e-5, 1e-4  # fp32, different op order (fused qkv, timm blocks) on the same arithmetic

_spec = importlib.util.spec_from_file_location(
    "verify_encoders", ROOT / "tools" / "verify_encoders.py"
)
verify = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(verify)


def stored(model_id: str) -> dict:
    with np.load(DATA / f"{model_id}.npz") as z:
        return {k: z[k] for k in z.files}


def mismatch(feats, ref: dict) -> list[str]:
    """What differs between cryocube's features and the stored reference ones (empty: equal)."""
    ours = verify.summarise([f.numpy() for f in feats])
    n = len([k for k in ref if k.endswith("_shape")])
    bad = [] if len(feats) == n else [f"{len(feats)} levels, reference {n}"]
    for i in range(min(n, len(feats))):
        if not np.array_equal(ours[f"l{i}_shape"], ref[f"l{i}_shape"]):
            bad.append(f"level {i}: shape {ours[f'l{i}_shape']} vs reference {ref[f'l{i}_shape']}")
            continue
        for part in ("values", "chanmean"):
            a, b = ours[f"l{i}_{part}"], ref[f"l{i}_{part}"]
            if not np.allclose(a, b, atol=ATOL, rtol=RTOL):
                bad.append(f"level {i} {part}: max abs diff {np.abs(a - b).max():.3g}")
    return bad


#: tensors the reference's loader reported missing although the features are equal: Prithvi's T=1
# position
#: embedding is computed by both (the released 3-frame one is not used); data2vec's mask token is
# never used
#: by the encoder's forward pass, and the released file's key map sets it aside
REFERENCE_MISSING_OK = {"prithvi": ["pos_embed"], "ssl4eo_data2vec": ["mask_token"]}


def test_every_config_has_a_reference_result_at_one_commit():
    assert set(MANIFEST) == set(list_models())
    commits = {m["commit"] for m in MANIFEST.values()}
    assert len(commits) == 1 and re.fullmatch(r"[0-9a-f]{40}", commits.pop())
    for mid, m in MANIFEST.items():
        assert sorted(m["band_order"]["cryocube"]) == sorted(m["band_order"]["reference"]), mid
        assert all(lv["max_abs"] is not None and lv["max_abs"] <= ATOL * 4 for lv in m["levels"]), (
            mid,
            m["levels"],
        )
        for w in m["warnings"]:
            assert w["missing"] == REFERENCE_MISSING_OK.get(mid, []) and not w["incompatible"], (
                mid,
                m["warnings"],
            )


@pytest.mark.parametrize("model_id", sorted(MANIFEST))
def test_features_equal_the_reference(model_id, tmp_path):
    switch = MANIFEST[model_id]["switch"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, x, feats, _ = verify.make_case(model_id, tmp_path, **switch)
    assert list(x.shape) == MANIFEST[model_id]["input_shape"]
    assert mismatch(feats, stored(model_id)) == []


def test_dino_deviation_differs_by_default_and_its_switch_gives_the_reference(tmp_path):
    """S12-DINO: cryocube keeps the checkpoint's qkv biases (declared deviation dino_qkv_bias); with
    follow_reference it builds none, drops the checkpoint's with a warning, and equals the
    reference.
    """
    spec = model_spec("ssl4eo_dino")
    assert [d.name for d in spec.deviations] == ["dino_qkv_bias"]
    assert spec.deviation_record() == {"in_effect": ["dino_qkv_bias"], "followed": []}
    ref = stored("ssl4eo_dino")
    _, _, feats, sd = verify.make_case("ssl4eo_dino", tmp_path)  # default: biases loaded
    assert sum(k.endswith("attn.qkv.bias") for k in sd) == 12
    assert mismatch(feats, ref), (
        "the default build should differ from the reference (it keeps the qkv biases)"
    )

    from cryocube.models.weights import load_weights

    enc = verify.build("ssl4eo_dino", follow_reference=True)
    assert enc.spec.deviation_record() == {"in_effect": [], "followed": ["dino_qkv_bias"]}
    with pytest.warns(
        UserWarning, match=r"dropped 12 checkpoint tensors as the Cryo-Bench reference does"
    ):
        rep = load_weights(enc, tmp_path / "ssl4eo_dino.pth")
    assert len(rep.dropped) == 12 and all(k.endswith("attn.qkv.bias") for k in rep.dropped)
    with torch.no_grad():
        assert mismatch(enc(verify.make_input(enc)), ref) == []


def test_without_the_switch_a_bias_free_dino_refuses_the_biases(tmp_path):
    """arch.qkv_bias: false alone (no follow_reference) is strict: the 12 biases are named, not
    dropped."""
    from cryocube.models.registry import get_keymap
    from cryocube.models.weights import WeightsError, load_weights

    enc = verify.build("ssl4eo_dino")
    torch.save(get_keymap("ssl4eo_dino").to_reference(enc.state_dict()), tmp_path / "dino.pth")
    bare = verify.build("ssl4eo_dino", qkv_bias=False)
    with pytest.raises(WeightsError, match=r"unexpected 12 keys: vit\.blocks\.0\.attn\.qkv\.bias"):
        load_weights(bare, tmp_path / "dino.pth")


def test_spectralgpt_channels_follow_the_reference_group_major():
    """Output channel = group * D + d, as the reference concatenates the spectral groups."""
    enc = verify.build("spectralgpt")
    g, d = enc.groups, enc.output_channels[0] // enc.groups
    x = verify.make_input(enc)
    tokens = {}
    hook = enc.blocks[enc.output_layers[0]].register_forward_hook(
        lambda m, i, o: tokens.setdefault("t", o)
    )
    with torch.no_grad():
        f = enc(x)[0]
    hook.remove()
    t = tokens["t"].reshape(1, g, enc.grid, enc.grid, d)  # tokens group-major, row-major patches
    assert torch.equal(f[0, 1 * d + 5], t[0, 1, :, :, 5])


def test_every_catalog_deviation_is_a_row_of_the_one_table():
    table = (ROOT / "docs" / "deviations.md").read_text()
    head = "| deviation | reference does | cryocube does | why | switch | record field |"
    assert table.count(head) == 1
    devs = [(m, d) for m in list_models() for d in model_spec(m).deviations]
    assert devs, "the catalog declares no deviation (S12-DINO's qkv biases is one)"
    for m, d in devs:
        row = next((ln for ln in table.splitlines() if ln.startswith(f"| `{d.name}` ({m})")), None)
        assert row is not None and row.count("|") == 7, (
            f"{m}: deviation {d.name} has no row in docs/deviations.md"
        )
        assert "follow_reference" in row and "`deviations`" in row
    readme = (ROOT / "README.md").read_text()
    # the README links, the table holds
    assert "docs/deviations.md" in readme and "**Pairing.**" not in readme


def test_the_run_record_names_the_deviations_and_the_switch_changes_the_run(tmp_path, client):
    from cryocube.convert.writer import convert
    from cryocube.engine.plan import plan_runs
    from cryocube.families import PlanContext, RunSpec
    from cryocube.families.recipes import load_recipe
    from cryocube.synthetic import make_raw

    make_raw("gld", tmp_path / "raw", n={"train": 8, "val": 2, "test": 2}, seed=3)
    url = str(tmp_path / "gld.zarr")
    convert("gld", str(tmp_path / "raw"), url, client=client, tile_size=32, progress=False)
    ctx = PlanContext(out=str(tmp_path / "out"), allow_random_weights=True)
    fast = ["epochs=1", "input_size=32", "normalization=cube"]
    default, follow, moco = (
        plan_runs([RunSpec(mid, url)], load_recipe(None, fast + extra), ctx)[0]
        for mid, extra in (
            ("ssl4eo_dino", []),
            ("ssl4eo_dino", ["follow_reference=true"]),
            ("ssl4eo_moco", []),
        )
    )
    assert default.record.fields["deviations"] == {"in_effect": ["dino_qkv_bias"], "followed": []}
    assert follow.record.fields["deviations"] == {"in_effect": [], "followed": ["dino_qkv_bias"]}
    assert moco.record.fields["deviations"] == {"in_effect": [], "followed": []}
    assert follow.run_id != default.run_id and follow.work.encoder.model.arch["qkv_bias"] is False
    # the default keeps existing run ids
    assert "follow_reference" not in default.identity["recipe"]
    # the embedding family (NeuCo-Bench probes) reads the same switch and records the same field
    probe, probe_follow = (
        plan_runs([RunSpec("ssl4eo_dino", url, "probe")], load_recipe(None, fast + extra), ctx)[0]
        for extra in ([], ["follow_reference=true"])
    )
    assert probe.record.fields["deviations"] == default.record.fields["deviations"]
    assert probe_follow.record.fields["deviations"] == follow.record.fields["deviations"]
    assert probe_follow.work.embed.key != probe.work.embed.key
