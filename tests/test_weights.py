"""Weights: reference-layout checkpoints load through the key maps and reproduce outputs exactly;
corrupt, mismatched and incomplete checkpoints fail with errors that name the file and the keys."""

from __future__ import annotations

import argparse
import hashlib
import re

import fsspec
import pytest
import torch

from cryocube.catalog import load_dataset
from cryocube.cli import main as cli_main
from cryocube.fetch import file_digest
from cryocube.models import build_encoder, list_models, model_spec
from cryocube.models.registry import get_keymap
from cryocube.models.weights import WeightsError, fetch_weights, load_weights

GLD = load_dataset("gld").bands
TINY_VIT = dict(embed_dim=64, depth=2, num_heads=4, output_layers=[0, 1])
# Shallow versions of every pretrained model: same module names (so the same key maps), seconds to
# run.
SMALL = {
    "croma_optical": dict(embed_dim=64, depth=4, num_heads=4, output_layers=[1, 3], input_size=40),
    "croma_sar": dict(embed_dim=64, depth=2, num_heads=4, output_layers=[0, 1], input_size=40),
    "dofa": dict(
        embed_dim=96, depth=2, num_heads=4, output_layers=[0, 1], input_size=64, bands=GLD
    ),
    "gfmswin": dict(
        embed_dim=32, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8], window_size=3, input_size=96
    ),
    "prithvi": dict(TINY_VIT, output_layers=[1], input_size=64),
    "remoteclip": dict(TINY_VIT, input_size=64),
    "satlasnet_si": dict(arch="swin_v2_t", input_size=64),
    "scalemae": dict(TINY_VIT, depth=4, output_layers=[1, 3], input_size=64),
    "spectralgpt": dict(TINY_VIT, input_size=32),
    "ssl4eo_moco": dict(TINY_VIT, input_size=64),
    "ssl4eo_dino": dict(TINY_VIT, input_size=64),
    "ssl4eo_mae_optical": dict(TINY_VIT, input_size=64),
    "ssl4eo_mae_sar": dict(TINY_VIT, input_size=64),
    "ssl4eo_data2vec": dict(TINY_VIT, input_size=64),
    "terramind_base": dict(TINY_VIT, input_size=64),
    "terramind_large": dict(TINY_VIT, input_size=64),
    "terramind_large_sar": dict(TINY_VIT, input_size=64),
    "ramen": dict(TINY_VIT, input_size=32, bands=GLD),
}
# Keys a real checkpoint carries besides the encoder, in the reference layout (must be set aside).
EXTRAS = {
    "croma_optical": {"joint_encoder": {"norm_out.weight": torch.ones(4)}},
    "croma_sar": {"joint_encoder": {"norm_out.weight": torch.ones(4)}},
    "satlasnet_si": {"intermediates.0.fpn.weight": torch.ones(4)},
}


def small(model_id: str, seed: int = 0, **kw):
    torch.manual_seed(seed)
    return build_encoder(model_id, **{**SMALL[model_id], **kw}).eval()


def reference_checkpoint(enc, extra: bool = True) -> dict:
    km = get_keymap(enc.spec.weights.key_map)
    ck = km.to_reference({k: v.clone() for k, v in enc.state_dict().items()})
    if not extra:
        return ck
    ck.update(EXTRAS.get(enc.spec.id, {}))
    inner = km.unwrap(ck)
    if km.include is not None:
        inner["decoder_pred.weight"] = torch.ones(3)  # an MAE/SimMIM decoder tensor
        inner[(km.prefix[0] if km.prefix else "") + "mask_token"] = torch.zeros(1, 1, 8)
    if km.require_prefix:
        inner["head.weight"] = torch.ones(2)
    if len(km.container) == 1:
        ck["epoch"] = torch.tensor(99)
    return ck


def outputs(enc, seed: int = 1):
    torch.manual_seed(seed)
    x = torch.randn(1, enc.in_chans, enc.input_size, enc.input_size)
    with torch.no_grad():
        return enc(x)


def test_every_pretrained_model_has_a_roundtrip_case():
    assert {m for m in list_models() if model_spec(m).pretrained} == set(SMALL)


@pytest.mark.parametrize("model_id", sorted(SMALL))
def test_reference_layout_checkpoint_reproduces_outputs(model_id, tmp_path):
    a = small(model_id, seed=0)
    path = tmp_path / "ref.pth"
    torch.save(reference_checkpoint(a), path)
    b = small(model_id, seed=123)
    before = outputs(b)
    rep = load_weights(b, path, allow_pickle=False)
    assert rep.loaded > 0 and rep.set_aside, rep.summary()
    want = outputs(a)
    got = outputs(b)
    assert any(not torch.equal(x, y) for x, y in zip(before, want)), "random inits should differ"
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_full_size_moco_checkpoint_roundtrip(tmp_path):
    torch.manual_seed(0)
    a = build_encoder("ssl4eo_moco").eval()
    ck = reference_checkpoint(a)
    assert set(ck) == {"state_dict", "epoch"}
    keys = list(ck["state_dict"])
    assert (
        "module.base_encoder.blocks.11.attn.qkv.weight" in keys
        and "module.base_encoder.pos_embed" in keys
    )
    path = tmp_path / "B13_vits16_moco_0099.pth"
    torch.save(ck, path)
    torch.manual_seed(5)
    b = build_encoder("ssl4eo_moco").eval()
    load_weights(b, path)
    for g, w in zip(outputs(b), outputs(a)):
        assert torch.equal(g, w)


def test_keymaps_use_the_published_layouts():
    enc = small("remoteclip")
    ref = get_keymap("remoteclip").to_reference(enc.state_dict())
    assert ref["visual.class_embedding"].shape == (64,)
    assert ref["visual.positional_embedding"].shape == (5, 64)
    assert "visual.transformer.resblocks.1.attn.in_proj_weight" in ref
    sg = get_keymap("spectralgpt").to_reference(small("spectralgpt").state_dict())["model"]
    assert {"blocks.0.attn.q.weight", "blocks.0.attn.k.bias", "blocks.0.attn.v.weight"} <= set(sg)
    assert not any(".qkv." in k for k in sg)
    gfm = get_keymap("gfm").to_reference(small("gfmswin").state_dict())["model"]
    assert (
        "encoder.layers.0.downsample.reduction.weight" in gfm
        and "encoder.layers.3.downsample.norm.weight" not in gfm
    )
    cr = get_keymap("croma_optical").to_reference(small("croma_optical").state_dict())["s2_encoder"]
    assert "transformer.layers.3.1.net.3.weight" in cr and "linear_input.weight" in cr
    tm = get_keymap("terramind_s2l2a").to_reference(small("terramind_large").state_dict())
    assert {
        "encoder.1.mlp.fc3.weight",
        "encoder_embeddings.untok_sen2l2a@224.mod_emb",
        "encoder_norm.weight",
    } <= set(tm)
    pr = get_keymap("prithvi").to_reference(small("prithvi").state_dict())
    assert pr["patch_embed.proj.weight"].ndim == 5 and "pos_embed" not in pr


def _saved(tmp_path, ck, name="ck.pth"):
    path = tmp_path / name
    torch.save(ck, path)
    return path


def test_missing_key_is_an_error_listing_it(tmp_path):
    enc = small("ssl4eo_mae_optical")
    ck = reference_checkpoint(enc)
    del ck["model"]["blocks.1.mlp.fc2.bias"]
    with pytest.raises(WeightsError, match=r"missing 1 keys: vit\.blocks\.1\.mlp\.fc2\.bias"):
        load_weights(small("ssl4eo_mae_optical"), _saved(tmp_path, ck))


def test_unexpected_and_misshapen_keys_are_errors(tmp_path):
    enc = small("ssl4eo_mae_optical")
    ck = reference_checkpoint(enc)
    ck["model"]["blocks.7.norm1.weight"] = torch.ones(64)
    with pytest.raises(WeightsError, match=r"unexpected 1 keys: vit\.blocks\.7\.norm1\.weight"):
        load_weights(small("ssl4eo_mae_optical"), _saved(tmp_path, ck))
    ck = reference_checkpoint(enc)
    ck["model"]["cls_token"] = torch.zeros(1, 1, 32)
    with pytest.raises(
        WeightsError, match=r"1 shape mismatches: vit\.cls_token \(1, 1, 32\) vs model \(1, 1, 64\)"
    ):
        load_weights(small("ssl4eo_mae_optical"), _saved(tmp_path, ck))


def test_wrong_container_is_an_error(tmp_path):
    enc = small("croma_sar")
    ck = get_keymap("croma_optical").to_reference(enc.state_dict())  # s2_encoder only
    with pytest.raises(WeightsError, match="expected a 's1_encoder' entry"):
        load_weights(small("croma_sar"), _saved(tmp_path, ck))


def test_truncated_checkpoint_names_the_file(tmp_path):
    path = _saved(tmp_path, reference_checkpoint(small("ssl4eo_mae_sar")), "B2_vits16_mae_ep99.pth")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(
        WeightsError, match=r"B2_vits16_mae_ep99\.pth: cannot read the checkpoint .*truncated"
    ):
        load_weights(small("ssl4eo_mae_sar"), path)


def test_wrong_checksum_is_an_error(tmp_path):
    path = _saved(tmp_path, reference_checkpoint(small("ssl4eo_mae_sar")))
    with pytest.raises(WeightsError, match="sha256 .* does not match the expected 0000"):
        load_weights(small("ssl4eo_mae_sar"), path, sha256="0" * 64)
    rep = load_weights(small("ssl4eo_mae_sar"), path, sha256=file_digest(path))
    assert rep.sha256 == file_digest(path)


def test_pickled_objects_need_the_catalog_flag(tmp_path):
    enc = small("ssl4eo_mae_sar")
    ck = reference_checkpoint(enc)
    ck["args"] = argparse.Namespace(model="vit_small")  # MAE checkpoints carry their training args
    path = _saved(tmp_path, ck)
    with pytest.raises(WeightsError, match="pickled Python objects"):
        load_weights(small("ssl4eo_mae_sar"), path, allow_pickle=False)
    assert model_spec("ssl4eo_mae_sar").weights.allow_pickle
    load_weights(small("ssl4eo_mae_sar"), path)  # the catalog marks this source as pickled


def test_terramind_bias_buffers_must_be_zero(tmp_path):
    enc = small("terramind_large")
    ck = reference_checkpoint(enc)
    ck["encoder.0.norm1.bias"] = torch.zeros(64)
    # another modality: set aside
    ck["encoder_embeddings.untok_sen1grd@224.proj.weight"] = torch.ones(64, 512)
    rep = load_weights(small("terramind_large"), _saved(tmp_path, ck))
    assert "encoder_embeddings.untok_sen1grd@224.proj.weight" in rep.set_aside
    ck["encoder.0.norm1.bias"] = torch.ones(64)
    with pytest.raises(WeightsError, match="encoder.0.norm1.bias should hold zeros"):
        load_weights(small("terramind_large"), _saved(tmp_path, ck))


def test_ramen_without_sar_sets_the_radar_projector_aside(tmp_path):
    full = small("ramen")  # GLD: optical + SAR (coherence as VV)
    assert hasattr(full, "radar_projector") and full.output_channels[0] == 2 * 64
    path = _saved(tmp_path, reference_checkpoint(full))
    optical = small("ramen", bands=load_dataset("glid").bands)
    rep = load_weights(optical, path)
    assert any(k.startswith("radar_projector.") for k in rep.set_aside)
    assert optical.output_channels[0] == 64


def test_load_from_fsspec_url(tmp_path, monkeypatch):
    monkeypatch.setenv("CRYOCUBE_WEIGHTS", str(tmp_path / "cache"))
    a = small("ssl4eo_dino")
    buf = tmp_path / "dino.pth"
    torch.save(reference_checkpoint(a), buf)
    with fsspec.open("memory://weights/B13_vits16_dino_0099_ckpt.pth", "wb") as f:
        f.write(buf.read_bytes())
    b = small("ssl4eo_dino", seed=9)
    rep = load_weights(b, "memory://weights/B13_vits16_dino_0099_ckpt.pth", sha256=file_digest(buf))
    assert rep.path.startswith(str(tmp_path / "cache"))
    for g, w in zip(outputs(b), outputs(a)):
        assert torch.equal(g, w)


def test_fetch_over_http_verifies_sha256(http_dir, tmp_path):
    root, base = http_dir
    torch.save(reference_checkpoint(small("ssl4eo_mae_sar")), root / "B2_vits16_mae_ep99.pth")
    digest = hashlib.sha256((root / "B2_vits16_mae_ep99.pth").read_bytes()).hexdigest()
    dest = tmp_path / "weights"
    with pytest.raises(WeightsError, match="does not match the catalog's"):
        fetch_weights(
            "ssl4eo_mae_sar",
            dest,
            url=f"{base}/B2_vits16_mae_ep99.pth",
            sha256="f" * 64,
            progress=False,
        )
    assert not list(dest.glob("*"))  # nothing half-written is left behind
    path = fetch_weights(
        "ssl4eo_mae_sar", dest, url=f"{base}/B2_vits16_mae_ep99.pth", sha256=digest, progress=False
    )
    assert path == dest / "B2_vits16_mae_ep99.pth" and file_digest(path) == digest
    load_weights(small("ssl4eo_mae_sar"), path)
    (root / "confirm.html").write_text(
        "<!DOCTYPE html><html><body>Google Drive can't scan this file</body></html>"
    )
    with pytest.raises(WeightsError, match="HTML page"):
        fetch_weights("ssl4eo_moco", dest, url=f"{base}/confirm.html", progress=False)


def test_fetch_explains_models_without_downloads(tmp_path):
    with pytest.raises(WeightsError, match="OneDrive"):
        fetch_weights("gfmswin", tmp_path)
    with pytest.raises(WeightsError, match="trained from scratch"):
        fetch_weights("unet", tmp_path)


def test_weights_cli(capsys, tmp_path):
    assert cli_main(["weights", "list"]) == 0
    out = capsys.readouterr().out
    for m in list_models():
        assert m in out
    assert "huggingface.co/antofuller/CROMA" in out and "trained from scratch" in out
    assert cli_main(["weights", "fetch", "gfmswin", "--dest", str(tmp_path)]) == 2
    assert "no public download URL" in capsys.readouterr().err


def test_native_encoder_save_and_load(tmp_path):
    from cryocube.models.weights import save_encoder

    torch.manual_seed(0)
    a = build_encoder("unet", in_chans=3, input_size=32).eval()
    path = save_encoder(a, tmp_path / "unet.pth")
    torch.manual_seed(1)
    b = build_encoder("unet", in_chans=3, input_size=32).eval()
    load_weights(b, path)
    for g, w in zip(outputs(b), outputs(a)):
        assert torch.equal(g, w)


def test_a_checkpoint_of_another_model_is_refused_and_nothing_is_loaded(tmp_path):
    """Every pretrained model's file, offered to every other model: one WeightsError naming the file
    and the model, and the target's weights untouched (never partly loaded). Pairs that share a key
    map and, made small here, the very same architecture (the TerraMind sizes, one TerraMind file
    for S2 and S1) are left out: at published sizes their shapes differ or the file is theirs."""
    encs = {m: small(m) for m in sorted(SMALL)}
    files = {
        m: _saved(tmp_path, reference_checkpoint(e, extra=False), f"{m}.pth")
        for m, e in encs.items()
    }
    refused = 0
    for target, enc in encs.items():
        before = {k: v.clone() for k, v in enc.state_dict().items()}
        for source, path in files.items():
            if (
                source == target
                or (
                    enc.spec.weights.key_map == encs[source].spec.weights.key_map
                    and SMALL[source] == SMALL[target]
                )
                or {source, target} <= {"terramind_base", "terramind_large", "terramind_large_sar"}
            ):
                continue
            with pytest.raises(WeightsError) as e:
                load_weights(enc, path)
            assert str(path) in str(e.value), (source, target, str(e.value))
            refused += 1
        after = enc.state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before), target
    assert refused > 250


def test_a_mismatch_names_missing_and_unexpected_keys_in_one_sentence(tmp_path):
    enc = small("ssl4eo_mae_optical")
    ck = reference_checkpoint(enc)
    ck["model"]["blocks.9.attn.qkv.weight"] = ck["model"].pop("blocks.1.attn.qkv.weight")
    with pytest.raises(WeightsError) as e:
        load_weights(small("ssl4eo_mae_optical"), _saved(tmp_path, ck))
    msg = str(e.value)
    assert "\n" not in msg and msg.count(". ") == 0
    assert re.search(
        r"does not fit ssl4eo_mae_optical \(key map 'ssl4eo_mae'\); missing 1 keys:"
        r" vit\.blocks\.1\.attn\.qkv"
        r"\.weight; unexpected 1 keys: vit\.blocks\.9\.attn\.qkv\.weight",
        msg,
    ), msg
