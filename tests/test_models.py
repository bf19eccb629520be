"""Encoders: catalog facts, parameter counts against the measured reference, feature maps at the
reference input sizes (random weights, batch 1), and input validation."""

from __future__ import annotations

import pytest
import torch

from cryocube.catalog import Band, load_dataset
from cryocube.errors import UserError
from cryocube.models import build_encoder, list_models, model_spec
from cryocube.models.base import count_params

PUBLISHED_ROWS = {
    "CROMA",
    "DOFA",
    "GFM-Swin",
    "Prithvi",
    "RemoteCLIP",
    "SatlasNet",
    "Scale-MAE",
    "SpectralGPT",
    "S12-MoCo",
    "S12-DINO",
    "S12-MAE",
    "S12-Data2Vec",
    "TerraMind",
    "RAMEN",
    "U-Net",
    "ViT",
}


def rgb_bands(n: int) -> list[Band]:
    names = ["B4", "B3", "B2", "B8", "B11", "B12", "B8A", "B5", "B6", "B7"]
    return [Band(name=a, alias=a, role="optical") for a in names[:n]]


# Band counts and sizes behind the measured figures of pangaea-models.md 1.5.
COUNT_ARGS = {
    "dofa": dict(bands=rgb_bands(3)),
    "ramen": dict(bands=rgb_bands(3), input_size=128),
    "unet": dict(bands=rgb_bands(10), input_size=512),
    "vit_scratch": dict(bands=rgb_bands(3)),
}

# Feature maps (C, h, w) of the reference encoders at their default input size (pangaea-models.md
# 1.3).
REFERENCE_SHAPES = {
    "croma_optical": [(1024, 15, 15)] * 4,
    "croma_sar": [(1024, 15, 15)] * 4,
    "dofa": [(768, 14, 14)] * 4,
    "gfmswin": [(256, 24, 24), (512, 12, 12), (1024, 6, 6), (1024, 6, 6)],
    "prithvi": [(768, 14, 14)],
    "remoteclip": [(768, 7, 7)] * 4,
    "satlasnet_si": [(128, 32, 32), (256, 16, 16), (512, 8, 8), (1024, 4, 4)],
    "scalemae": [(1024, 14, 14)] * 4,
    "spectralgpt": [(3072, 16, 16)] * 4,
    "ssl4eo_moco": [(384, 14, 14)] * 4,
    "ssl4eo_dino": [(384, 14, 14)] * 4,
    "ssl4eo_mae_optical": [(384, 14, 14)] * 4,
    "ssl4eo_mae_sar": [(384, 14, 14)] * 4,
    "ssl4eo_data2vec": [(384, 14, 14)] * 4,
    "terramind_base": [(768, 14, 14)] * 4,
    "terramind_large": [(1024, 14, 14)] * 4,
    "terramind_large_sar": [(1024, 14, 14)] * 4,
    "ramen": [(768, 16, 16)] * 4,  # 3 bands, 64 px tile, input_res 10 / res 40 -> g = 16
    "unet": [(512, 4, 4), (512, 8, 8), (256, 16, 16), (128, 32, 32), (64, 64, 64)],  # 64 px tile
    "vit_scratch": [(768, 14, 14)] * 4,
}
FORWARD_ARGS = {
    **COUNT_ARGS,
    "unet": dict(bands=rgb_bands(10), input_size=64),
    "ramen": dict(bands=rgb_bands(3), input_size=64),
}
# Width, patch and input size as published, 4 blocks instead of 12-24: the same maps at a fraction
# of the cost
# (the full-depth ViT-L forward is covered by croma_optical and terramind_large).
SHALLOW = dict(depth=4, output_layers=[0, 1, 2, 3])
FORWARD_ARGS.update(
    {m: SHALLOW for m in ("croma_sar", "scalemae", "spectralgpt", "terramind_large_sar")}
)
HEAVY = {"croma_optical", "terramind_large"}


def test_catalog_has_every_published_model():
    specs = [model_spec(m) for m in list_models()]
    assert {s.display_name for s in specs} == PUBLISHED_ROWS
    assert len(list_models()) == 20
    rows = {}
    for s in specs:
        rows.setdefault(s.benchmark_entry, set()).add(s.id)
    assert rows["croma"] == {"croma_optical", "croma_sar"}
    assert rows["ssl4eo_mae"] == {"ssl4eo_mae_optical", "ssl4eo_mae_sar"}
    assert rows["terramind"] == {"terramind_large", "terramind_large_sar"}
    for s in specs:
        assert len(s.output_layers) == len(s.output_channels)
        if s.pretrained:
            assert s.weights is not None and s.weights.key_map
            assert s.weights.url or "by hand" in s.weights.notes
        assert s.input_size in (None, 120, 128, 192, 224)


@pytest.mark.parametrize("model_id", list_models())
def test_parameter_count_within_one_percent_of_reference(model_id):
    spec = model_spec(model_id)
    with torch.device("meta"):
        enc = build_encoder(model_id, **COUNT_ARGS.get(model_id, {}))
    n = count_params(enc)
    # terramind_large_sar: large with a 2-band instead of a 12-band patch embedding
    if spec.params_m is None:
        with torch.device("meta"):
            ref = count_params(build_encoder("terramind_large")) - 10 * 16 * 16 * 1024
        assert n == ref
        return
    dev = n / (spec.params_m * 1e6) - 1
    assert abs(dev) < 0.01, (
        f"{model_id}: {n:,} parameters vs published {spec.params_m} M ({dev:+.3%})"
    )


@pytest.mark.parametrize(
    "model_id",
    [pytest.param(m, marks=pytest.mark.slow) if m in HEAVY else m for m in list_models()],
)
def test_forward_matches_reference_feature_maps(model_id):
    torch.manual_seed(0)
    enc = build_encoder(model_id, **FORWARD_ARGS.get(model_id, {})).eval()
    x = torch.randn(1, enc.in_chans, enc.input_size, enc.input_size)
    with torch.no_grad():
        outs = enc(x)
    shapes = [tuple(o.shape[1:]) for o in outs]
    assert shapes == REFERENCE_SHAPES[model_id]
    assert shapes == [tuple(s) for s in enc.feature_shapes()]
    assert enc.output_channels == [c for c, _, _ in shapes]
    assert all(torch.isfinite(o).all() for o in outs)
    assert len(enc.output_reductions) == len(outs)


def test_gld_bands_drive_dataset_encoders():
    gld = load_dataset("gld").bands
    dofa = build_encoder("dofa", bands=gld)
    assert dofa.in_chans == 10
    assert dofa.wavelengths_um.tolist() == pytest.approx(
        [0.49, 0.56, 0.665, 0.832, 1.61, 0.864, 3.75, 0.705, 0.74, 0.783]
    )
    ramen = build_encoder("ramen", bands=gld, input_size=32, depth=1, output_layers=[0])
    assert (
        ramen.modalities == ["optical", "sar"]
        and ramen.output_channels == [1536]
        and ramen.grid == 8
    )
    with torch.no_grad():
        (out,) = ramen(torch.randn(2, 10, 32, 32))
    assert out.shape == (2, 1536, 8, 8)
    vit = build_encoder("vit_scratch", bands=gld, depth=1, output_layers=[0])
    assert vit.in_chans == 9


def test_dataset_encoders_need_bands_and_tile_size():
    with pytest.raises(UserError, match="dataset's bands"):
        build_encoder("dofa")
    with pytest.raises(UserError, match="tile size"):
        build_encoder("unet", bands=rgb_bands(3))


def test_input_is_validated():
    enc = build_encoder("ssl4eo_mae_sar", depth=1, output_layers=[0])
    with pytest.raises(ValueError, match=r"expected input \(B, 2, H, W\)"):
        enc(torch.zeros(1, 3, 224, 224))
    with pytest.raises(ValueError, match="expected 224x224"):
        enc(torch.zeros(1, 2, 192, 192))
    unet = build_encoder("unet", bands=rgb_bands(3), input_size=64)
    with pytest.raises(ValueError, match="multiple of 16"):
        unet(torch.zeros(1, 3, 40, 40))
    assert len(unet(torch.zeros(1, 3, 96, 96))) == 5  # the U-Net takes any multiple of 16


def test_output_layers_override():
    enc = build_encoder("prithvi", output_layers=[3, 5, 7, 11], depth=12)
    assert enc.output_layers == [3, 5, 7, 11] and enc.spec.output_channels == [768] * 4
    assert model_spec("prithvi").output_layers == [11]  # the catalog is untouched


def test_spectralgpt_drop_path_is_active_only_in_train_mode():
    enc = build_encoder(
        "spectralgpt", embed_dim=64, depth=2, num_heads=4, output_layers=[1], input_size=32
    )
    x = torch.randn(2, 12, 32, 32)
    with torch.no_grad():
        enc.train()
        a, b = enc(x)[0], enc(x)[0]
        enc.eval()
        c, d = enc(x)[0], enc(x)[0]
    assert not torch.equal(a, b) and torch.equal(c, d)


def test_unknown_model_and_bad_arch():
    with pytest.raises(UserError, match="unknown model 'croma'"):
        model_spec("croma")
    with pytest.raises(
        UserError,
        match=(
            "ssl4eo_moco.yaml: arch does not fit architecture .vit.*unknown architecture arguments"
        ),
    ):
        build_encoder("ssl4eo_moco", wings=2)


# -- "architecture" (never "family": that word means an evaluation family)
# ---------------------------------------------------------------


def test_a_model_config_names_its_architecture_and_the_old_family_field_is_refused(tmp_path):
    from pathlib import Path

    import yaml

    from cryocube.catalog import CatalogError
    from cryocube.models import architectures

    root = Path(__file__).resolve().parents[1] / "catalogs" / "models"
    # the shipped configs name their architecture, and every one is built by a builder
    for f in sorted(root.glob("*.yaml")):
        d = yaml.safe_load(f.read_text())
        assert "family" not in d and d["architecture"] in architectures(), f.name
    old = yaml.safe_load((root / "ssl4eo_moco.yaml").read_text())
    old["family"] = old.pop("architecture")  # the pre-release name is not read any more
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    with pytest.raises(CatalogError, match=r"old.yaml: missing field 'architecture'"):
        model_spec(str(tmp_path / "old.yaml"))
    odd = dict(old, architecture="vitt")
    del odd["family"]
    (tmp_path / "odd.yaml").write_text(yaml.safe_dump(odd))
    with pytest.raises(UserError, match=r"odd.yaml: unknown architecture 'vitt'; known: \[.*'vit'"):
        build_encoder(str(tmp_path / "odd.yaml"), in_chans=13)


def test_a_lab_architecture_joins_through_its_entry_point(run_with_plugin):
    """A real distribution on the path declares `cryocube.architectures`; its architecture builds
    beside the built-in ones, without a word."""
    r = run_with_plugin(
        "newlab",
        "cryocube.architectures",
        "from cryocube.models.unet import build_unet\nfrom cryocube.models.registry import"
        " register_architecture\nregister_architecture('newlab_unet')(build_unet)\n",
        "import warnings; warnings.simplefilter('always')\n"
        "from cryocube.models import architectures\n"
        "a = architectures(); print('newlab_unet' in a, 'vit' in a)\n",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True"]
    assert "newlab" not in r.stderr  # a plug-in loads without a word
